#include "tools/python_kernel.hpp"

#include <moat/with_timeout.hpp>

#include "core/output_capture.hpp"
#include "tools/python_driver.hpp"

#include <asio/this_coro.hpp>

#include <sys/random.h>
#include <csignal>
#include <cstdio>
#include <variant>

namespace moat {

namespace {

using clock = std::chrono::steady_clock;

// Time for a killed interpreter's end to be reported before we stop waiting for it.
constexpr auto reap_grace = std::chrono::seconds(3);
// The longest marker line we wait for: "<prefix>NNN error <exception type>\n".
constexpr std::size_t max_marker_line = 512;

std::string random_nonce() {
    unsigned char bytes[12] = {};
    std::size_t filled = 0;
    while (filled < sizeof bytes) {
        const ssize_t n = ::getrandom(bytes + filled, sizeof bytes - filled, 0);
        if (n > 0) filled += static_cast<std::size_t>(n);
    }
    std::string hex;
    for (const unsigned char b : bytes) {
        char pair[3];
        std::snprintf(pair, sizeof pair, "%02x", b);
        hex += pair;
    }
    return hex;
}

// One channel of a cell: its bytes up to the driver's end marker, kept as head + tail.
class channel_reader {
  public:
    channel_reader(std::string marker, output_limits limits)
        : marker_(std::move(marker)), capture_(limits) {}

    bool is_done() const noexcept { return done_; }
    const std::string& marker_line() const noexcept { return marker_line_; }

    void feed(std::string_view data) {
        if (done_) return;  // after the marker: a background thread's late output, dropped
        pending_ += data;
        const auto at = pending_.find(marker_);
        if (at != std::string::npos) {
            const auto end = pending_.find('\n', at);
            if (end == std::string::npos && pending_.size() - at < max_marker_line) return;
            capture_.append(std::string_view(pending_).substr(0, at));
            if (end != std::string::npos)
                marker_line_ = pending_.substr(at + marker_.size(), end - at - marker_.size());
            pending_.clear();
            done_ = true;
            return;
        }
        // Keep only what could be the start of a marker split across reads.
        if (pending_.size() >= marker_.size()) {
            const auto keep = marker_.size() - 1;
            capture_.append(std::string_view(pending_).substr(0, pending_.size() - keep));
            pending_.erase(0, pending_.size() - keep);
        }
    }

    captured_output finish() {
        if (!done_) capture_.append(pending_);
        pending_.clear();
        return capture_.finish();
    }

  private:
    std::string marker_;
    output_capture capture_;
    std::string pending_;
    std::string marker_line_;
    bool done_ = false;
};

}  // namespace

struct python_kernel::running {
    std::string sandbox_id;
    process interpreter;
    std::string marker;
};

namespace {

struct cell_read {
    std::optional<exec_result> exited;  // set when the interpreter ended during the cell
};

asio::awaitable<result<cell_read>> read_cell(process& interpreter, channel_reader& out,
                                             channel_reader& err) {
    cell_read read;
    while (!out.is_done() || !err.is_done()) {
        auto next = co_await interpreter.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            auto& reader = chunk->channel == output_channel::out ? out : err;
            reader.feed(chunk->data);
            continue;
        }
        read.exited = std::get<exec_result>(std::move(*next));
        break;
    }
    co_return read;
}

// Writes the cell to the interpreter's command channel, then reads its output up to the markers.
asio::awaitable<result<cell_read>> send_and_read(process& interpreter, std::string framed,
                                                 channel_reader& out, channel_reader& err) {
    auto written = co_await interpreter.async_write_stdin(std::move(framed));
    if (!written) {
        // The interpreter stopped reading: it is exiting. Its end is what the cell reports.
        if (written.error().code == errc::cancelled) co_return std::move(written).error();
    }
    co_return co_await read_cell(interpreter, out, err);
}

}  // namespace

python_kernel::python_kernel(std::string python, output_limits capture)
    : python_(std::move(python)), capture_(capture) {}

python_kernel::~python_kernel() = default;

bool python_kernel::is_running_in(const std::string& sandbox_id) const noexcept {
    return running_ && running_->sandbox_id == sandbox_id;
}

asio::awaitable<void> python_kernel::async_stop() {
    if (!running_) co_return;
    auto ending = std::move(running_);
    (void)co_await ending->interpreter.async_signal(SIGKILL);
    const auto limit = deadline::after(reap_grace);
    for (;;) {
        auto next = co_await with_timeout(ending->interpreter.async_next(), limit);
        if (!next || std::holds_alternative<exec_result>(*next)) break;
    }
}

asio::awaitable<result<cell_outcome>> python_kernel::async_run(std::shared_ptr<sandbox> box,
                                                               std::string code,
                                                               std::chrono::milliseconds timeout,
                                                               deadline limit) {
    cell_outcome outcome;
    if (running_ && running_->sandbox_id != box->id()) co_await async_stop();
    if (!running_) {
        const std::string nonce = random_nonce();
        exec_request start;
        start.argv = {python_, "-u",
                      "-c",    std::string(python_driver_source()),
                      nonce,   std::to_string(cells_)};
        start.wall_limit = exec_request::max_spawn_wall_limit;
        auto spawned = co_await box->async_spawn(std::move(start), limit);
        if (!spawned) co_return std::move(spawned).error();
        auto fresh = std::make_unique<running>();
        fresh->sandbox_id = box->id();
        fresh->interpreter = std::move(*spawned);
        fresh->marker = python_cell_marker(nonce);
        running_ = std::move(fresh);
        outcome.started_interpreter = true;
    }
    outcome.interpreter_pid = running_->interpreter.pid();
    ++cells_;

    channel_reader out(running_->marker, capture_);
    channel_reader err(running_->marker, capture_);
    std::string framed = std::to_string(code.size()) + "\n" + code;
    const auto started = clock::now();
    const auto cell_limit = deadline::after(timeout);
    const auto first = earliest(cell_limit, limit);
    auto read = co_await with_timeout(
        send_and_read(running_->interpreter, std::move(framed), out, err), first);
    co_await asio::this_coro::reset_cancellation_state();
    outcome.duration =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - started);
    outcome.out = out.finish();
    outcome.err = err.finish();

    if (!read) {
        // Whatever stopped the read, the interpreter is in an unknown state: end it.
        co_await async_stop();
        const bool caller_first = !limit.is_never() && limit.when() <= cell_limit.when();
        if (read.error().code == errc::deadline_exceeded && !caller_first) {
            outcome.how = cell_outcome::ending::timed_out;
            outcome.exit_code = 124;
            co_return outcome;
        }
        co_return std::move(read).error();
    }
    if (read->exited) {
        running_.reset();
        const auto& ended = *read->exited;
        outcome.how = cell_outcome::ending::crashed;
        outcome.signal = ended.signal;
        outcome.exit_code = ended.signal != 0 ? 128 + ended.signal : ended.exit_code;
        outcome.oom_killed = ended.oom_killed;
        co_return outcome;
    }
    // The marker line: "NNN ok -" or "NNN error KeyError".
    const std::string& line = out.marker_line();
    const auto first_space = line.find(' ');
    const auto second_space =
        line.find(' ', first_space == std::string::npos ? 0 : first_space + 1);
    if (first_space != std::string::npos && second_space != std::string::npos) {
        outcome.raised =
            line.compare(first_space + 1, second_space - first_space - 1, "error") == 0;
        const std::string kind = line.substr(second_space + 1);
        if (outcome.raised && kind != "-") outcome.exception_type = kind;
    }
    co_return outcome;
}

}  // namespace moat
