#include <moat/backend.hpp>

#include "core/output_capture.hpp"

#include <algorithm>

namespace moat {
namespace {

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

}  // namespace

const char* to_string(sandbox_state state) noexcept {
    switch (state) {
        case sandbox_state::running:
            return "running";
        case sandbox_state::exited:
            return "exited";
    }
    return "unknown";
}

asio::awaitable<result<exec_result>> async_collect(exec_stream stream, output_limits limits) {
    output_capture out(limits);
    output_capture err(limits);
    for (;;) {
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
    co_return co_await async_collect(std::move(*stream), limits);
}

asio::awaitable<result<host_report>> backend::async_host_report() {
    co_return not_supported(name(), "host_report");
}

asio::awaitable<result<std::vector<janitor_action>>> backend::async_janitor(bool) {
    co_return not_supported(name(), "janitor");
}

asio::awaitable<result<process>> backend::async_spawn(std::string, exec_request) {
    co_return not_supported(name(), "spawn");
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
    if (!written) co_return std::move(written).error();
    if (written->size() != 1) {
        co_return make_error(
            errc::protocol_error,
            "write_files returned " + std::to_string(written->size()) + " results for one file");
    }
    co_return std::move(written->front());
}

asio::awaitable<result<file_read_stream>> backend::async_read_file_stream(std::string id,
                                                                          std::string path) {
    auto stat = co_await async_stat(id, path);
    if (!stat) co_return std::move(stat).error();
    std::vector<std::string> paths(1, path);
    auto read = co_await async_read_files(std::move(id), std::move(paths));
    if (!read) co_return std::move(read).error();
    if (read->size() != 1) {
        co_return make_error(
            errc::protocol_error,
            "read_files returned " + std::to_string(read->size()) + " results for one path");
    }
    auto& content = read->front().content;
    if (!content) co_return std::move(content).error();
    file_stat info = std::move(*stat);
    info.size = content->size();
    auto impl = std::make_unique<buffered_read_stream>(std::move(*content));
    co_return file_read_stream(std::move(info), std::move(impl));
}

asio::awaitable<result<file_stat>> backend::async_stat(std::string, std::string) {
    co_return not_supported(name(), "stat");
}

asio::awaitable<result<std::vector<dir_entry>>> backend::async_list_dir(std::string, std::string) {
    co_return not_supported(name(), "list_dir");
}

}  // namespace moat
