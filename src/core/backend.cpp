#include <moat/backend.hpp>

#include "core/async_event.hpp"
#include "core/cancellation.hpp"
#include "core/exception_boundary.hpp"
#include "core/output_capture.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

namespace moat {
namespace {

// The one result of a batch call made for one file: protocol_error naming `call` when the backend
// answered with another count.
template <class T>
result<T> only_result(result<std::vector<T>> batch, const char* call) {
    if (!batch) return std::move(batch).error();
    if (batch->size() != 1) {
        return make_error(errc::protocol_error, std::string(call) + " returned " +
                                                    std::to_string(batch->size()) +
                                                    " results for one file");
    }
    return std::move(batch->front());
}

error not_supported(const std::string& backend_name, const char* operation) {
    return make_error(errc::not_supported,
                      backend_name + " backend does not implement " + operation + " yet");
}

// A stream over bytes already in memory (the batch fallback of async_read_file_stream).
class buffered_read_stream final : public file_read_stream::impl {
  public:
    explicit buffered_read_stream(std::string content) : content_(std::move(content)) {}

    asio::awaitable<result<std::string>> async_next() override {
        if (finished_) co_return make_error(errc::invalid_argument, "the stream has ended");
        const std::size_t n = std::min(file_stream_chunk_bytes, content_.size() - offset_);
        std::string chunk = content_.substr(offset_, n);
        offset_ += n;
        if (n == 0) finished_ = true;
        co_return chunk;
    }

  private:
    std::string content_;
    std::size_t offset_ = 0;
    bool finished_ = false;
};

// A pull that is cancelled once it has begun: the stream's own terminal cancellation, which stops
// the program and confirms its end (exec.hpp). Used when the caller's cancellation arrived while
// no pull was pending (between the stream's start and a pull, or between two pulls): awaiting a
// pull then would throw in the caller's frame before the stream saw anything, and dropping the
// stream kills without confirming.
struct cancelled_pull {
    explicit cancelled_pull(asio::any_io_executor executor) : done(std::move(executor)) {}
    exec_stream stream;
    asio::cancellation_signal signal;
    async_event done;
    std::optional<result<std::variant<output_chunk, exec_result>>> outcome;
};

asio::awaitable<result<std::variant<output_chunk, exec_result>>> pull(
    std::shared_ptr<cancelled_pull> p) {
    co_return co_await p->stream.async_next();
}

struct store_pull {
    std::shared_ptr<cancelled_pull> p;
    void operator()(std::exception_ptr e, result<std::variant<output_chunk, exec_result>> r) {
        if (e) {
            p->outcome = error_from_exception(e);
        } else {
            p->outcome = std::move(r);
        }
        p->done.set();
    }
};

struct emit_terminal {
    std::shared_ptr<cancelled_pull> p;
    // Only while the pull is pending: one that completed has no handler to cancel.
    void operator()() const {
        if (!p->outcome) p->signal.emit(asio::cancellation_type::terminal);
    }
};

// Ends `stream` through its own cancellation path; the caller's cancellation state must already
// be reset. Bounded by the stream's kill grace (the wait below is a backstop).
asio::awaitable<error> stop_through_pull(exec_stream stream) {
    auto executor = co_await asio::this_coro::executor;
    auto p = std::make_shared<cancelled_pull>(executor);
    p->stream = std::move(stream);
    for (;;) {
        p->outcome.reset();
        p->signal.slot().clear();
        auto token = asio::bind_cancellation_slot(p->signal.slot(), store_pull{p});
        asio::co_spawn(executor, pull(p), token);
        // Posted behind the pull's start, so it reaches the pull where it waits.
        asio::post(executor, emit_terminal{p});
        const auto limit = deadline::after(std::chrono::seconds(60));
        co_await p->done.async_wait(limit);
        if (!p->outcome) co_return make_error(errc::backend_failure, "the stream did not stop");
        p->done = async_event(executor);
        if (!*p->outcome) co_return std::move(*p->outcome).error();
        if (std::holds_alternative<exec_result>(**p->outcome)) {
            // It ended on its own meanwhile: nothing is left running; the caller cancelled.
            co_return make_error(errc::cancelled, "the caller cancelled the operation");
        }
        // A chunk that was ready before the cancellation arrived: pull again.
    }
}

}  // namespace

const char* to_string(sandbox_state state) noexcept {
    switch (state) {
        case sandbox_state::running:
            return "running";
        case sandbox_state::exited:
            return "exited";
        case sandbox_state::paused:
            return "paused";
    }
    return "unknown";
}

asio::awaitable<result<exec_result>> async_collect(exec_stream stream, output_limits limits) {
    output_capture out(limits);
    output_capture err(limits);
    for (;;) {
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            co_return co_await stop_through_pull(std::move(stream));
        }
        auto next = co_await stream.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            (chunk->channel == output_channel::out ? out : err).append(chunk->data);
            continue;
        }
        exec_result done = std::get<exec_result>(std::move(*next));
        done.out = out.finish();
        done.err = err.finish();
        co_return done;
    }
}

asio::awaitable<result<exec_result>> backend::async_exec(std::string id, exec_request request) {
    const output_limits limits = request.output;
    auto stream = co_await async_exec_stream(std::move(id), std::move(request));
    if (!stream) co_return std::move(stream).error();
    // A cancellation that arrived as the stream started would throw at the next co_await.
    if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
        co_await asio::this_coro::reset_cancellation_state();
        co_return co_await stop_through_pull(std::move(*stream));
    }
    co_return co_await async_collect(std::move(*stream), limits);
}

asio::awaitable<result<host_report>> backend::async_host_report() {
    co_return not_supported(name(), "host_report");
}

asio::awaitable<result<sandbox_usage>> backend::async_usage(std::string) {
    co_return not_supported(name(), "usage");
}

asio::awaitable<result<sandbox_info>> backend::async_pause(std::string) {
    co_return not_supported(name(), "pause");
}

asio::awaitable<result<sandbox_info>> backend::async_resume(std::string) {
    co_return not_supported(name(), "resume");
}

bool backend::is_paused(const std::string&) const {
    return false;
}

asio::awaitable<result<sandbox_info>> backend::async_update_network(std::string, sandbox_network) {
    co_return not_supported(name(), "update_network");
}

asio::awaitable<result<std::vector<janitor_action>>> backend::async_janitor(bool) {
    co_return not_supported(name(), "janitor");
}

asio::awaitable<result<process>> backend::async_spawn(std::string, exec_request) {
    co_return not_supported(name(), "spawn");
}

asio::awaitable<result<terminal>> backend::async_open_terminal(std::string, exec_request,
                                                               terminal_size) {
    co_return not_supported(name(), "terminals");
}

asio::awaitable<result<terminal>> backend::async_attach_terminal(std::string, int) {
    co_return not_supported(name(), "terminals");
}

asio::awaitable<result<void>> backend::async_signal(std::string, std::uint64_t, int) {
    co_return not_supported(name(), "signal");
}

asio::awaitable<result<std::vector<file_write_result>>> backend::async_write_files(
    std::string, std::vector<file_write>) {
    co_return not_supported(name(), "write_files");
}

asio::awaitable<result<std::vector<file_read_result>>> backend::async_read_files(
    std::string, std::vector<std::string>) {
    co_return not_supported(name(), "read_files");
}

asio::awaitable<result<file_write_result>> backend::async_write_file_stream(
    std::string id, file_write_target target, byte_source source) {
    if (!target.metadata.empty()) {
        file_write_result refused;
        refused.path = target.path;
        refused.outcome =
            make_error(errc::not_supported,
                       target.path + ": " + name() + " backend does not keep file metadata");
        co_return refused;
    }
    const file_limits limits;
    const std::uint64_t cap = std::min(target.max_bytes, limits.max_file_bytes);
    file_write_result out;
    out.path = target.path;
    std::string content;
    for (;;) {
        auto pull = source();
        auto chunk = co_await std::move(pull);
        if (!chunk) {
            out.outcome = error{chunk.error().code,
                                target.path + ": the source failed: " + chunk.error().detail};
            co_return out;
        }
        if (chunk->empty()) break;
        if (content.size() + chunk->size() > cap) {
            out.outcome =
                make_error(errc::too_large, target.path + ": " + name() +
                                                " backend does not stream writes: at most " +
                                                std::to_string(cap) + " bytes");
            co_return out;
        }
        content += *chunk;
    }
    std::vector<file_write> files(1);
    files[0].path = target.path;
    files[0].content = std::move(content);
    files[0].mode = target.mode;
    auto written = co_await async_write_files(std::move(id), std::move(files));
    co_return only_result(std::move(written), "write_files");
}

asio::awaitable<result<file_read_stream>> backend::async_read_file_stream(std::string id,
                                                                          std::string path) {
    auto stat = co_await async_stat(id, path);
    if (!stat) co_return std::move(stat).error();
    std::vector<std::string> paths(1, path);
    auto read = co_await async_read_files(std::move(id), std::move(paths));
    auto one = only_result(std::move(read), "read_files");
    if (!one) co_return std::move(one).error();
    auto& content = one->content;
    if (!content) co_return std::move(content).error();
    file_stat info = std::move(*stat);
    info.size = content->size();
    auto impl = std::make_unique<buffered_read_stream>(std::move(*content));
    co_return file_read_stream(std::move(info), std::move(impl));
}

asio::awaitable<result<std::vector<file_metadata_result>>> backend::async_read_metadata(
    std::string, std::vector<std::string>) {
    co_return not_supported(name(), "read_metadata");
}

asio::awaitable<result<file_stat>> backend::async_stat(std::string, std::string) {
    co_return not_supported(name(), "stat");
}

asio::awaitable<result<std::vector<dir_entry>>> backend::async_list_dir(std::string, std::string) {
    co_return not_supported(name(), "list_dir");
}

asio::awaitable<result<asio::ip::tcp::socket>> backend::async_connect_port(std::string,
                                                                           std::uint16_t) {
    co_return not_supported(name(), "connect_port");
}

asio::awaitable<result<asio::local::stream_protocol::socket>> backend::async_connect_unix(
    std::string, std::string) {
    co_return not_supported(name(), "connect_unix");
}

asio::awaitable<result<dir_watch>> backend::async_watch_dir(std::string, std::string,
                                                            watch_options) {
    co_return not_supported(name(), "watch_dir");
}

const char* to_string(watch_event_type type) noexcept {
    switch (type) {
        case watch_event_type::create:
            return "create";
        case watch_event_type::write:
            return "write";
        case watch_event_type::remove:
            return "remove";
        case watch_event_type::rename:
            return "rename";
        case watch_event_type::chmod:
            return "chmod";
    }
    return "unknown";
}

result<std::string> backend::port_host(const std::string&, std::uint16_t) const {
    return not_supported(name(), "port_host");
}

}  // namespace moat
