#include "tools/python_kernel.hpp"

#include <moat/with_timeout.hpp>

#include "tools/cell_output.hpp"
#include "tools/python_driver.hpp"

#include <asio/this_coro.hpp>

#include <sys/random.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <variant>

namespace moat {

namespace {

using clock = std::chrono::steady_clock;

// Time for a killed interpreter's end to be reported before we stop waiting for it.
constexpr auto reap_grace = std::chrono::seconds(3);

}  // namespace

ssize_t system_random(void* buffer, std::size_t size) {
    return ::getrandom(buffer, size, 0);
}

result<std::string> random_nonce(random_source source) {
    // getrandom(2) on 12 bytes returns them all at once in practice; a source that keeps failing
    // (ENOSYS under a seccomp filter, EINTR storms) is an error, not a spin.
    constexpr int max_attempts = 16;
    unsigned char bytes[12] = {};
    std::size_t filled = 0;
    int last_error = 0;
    for (int attempt = 0; filled < sizeof bytes; ++attempt) {
        if (attempt == max_attempts) {
            return make_error(errc::backend_failure,
                              std::string("getrandom failed for the interpreter's nonce: ") +
                                  std::strerror(last_error));
        }
        const ssize_t n = source(bytes + filled, sizeof bytes - filled);
        if (n > 0) {
            filled += static_cast<std::size_t>(n);
        } else {
            last_error = n < 0 ? errno : EIO;
        }
    }
    std::string hex;
    for (const unsigned char b : bytes) {
        char pair[3];
        std::snprintf(pair, sizeof pair, "%02x", b);
        hex += pair;
    }
    return hex;
}

struct python_kernel::running {
    std::string sandbox_id;
    process interpreter;
    std::string marker;
};

namespace {

struct cell_read {
    std::optional<exec_result> exited;  // set when the interpreter ended during the cell
};

asio::awaitable<result<cell_read>> read_cell(process& interpreter, cell_output& out,
                                             cell_output& err) {
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
                                                 cell_output& out, cell_output& err) {
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

asio::awaitable<void> python_kernel::async_stop() {
    if (!running_) co_return;
    auto ending = std::move(running_);
    (void)co_await ending->interpreter.async_signal(SIGKILL);
    const auto limit = deadline::after(reap_grace);
    for (;;) {
        auto pulled = ending->interpreter.async_next();  // a named local (g++ 12)
        auto next = co_await with_timeout(std::move(pulled), limit);
        if (!next || std::holds_alternative<exec_result>(*next)) break;
    }
}

asio::awaitable<result<cell_outcome>> python_kernel::async_run(
    std::shared_ptr<sandbox> box, std::string code, std::chrono::milliseconds timeout,
    deadline limit, std::function<void(output_channel, std::string_view)> on_output) {
    cell_outcome outcome;
    if (running_ && running_->sandbox_id != box->id()) co_await async_stop();
    if (!running_) {
        auto made = random_nonce();
        if (!made) co_return std::move(made).error();
        const std::string nonce = std::move(*made);
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
    ++cells_;

    cell_output out(running_->marker, capture_);
    cell_output err(running_->marker, capture_);
    if (on_output) {
        out.on_output([on_output](std::string_view data) { on_output(output_channel::out, data); });
        err.on_output([on_output](std::string_view data) { on_output(output_channel::err, data); });
    }
    std::string framed = std::to_string(code.size()) + "\n" + code;
    const auto started = clock::now();
    const auto cell_limit = deadline::after(timeout);
    const auto first = earliest(cell_limit, limit);
    auto exchange = send_and_read(running_->interpreter, std::move(framed), out, err);
    auto read = co_await with_timeout(std::move(exchange), first);
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
    const auto status = parse_marker_line(out.marker_line());
    outcome.raised = status.raised;
    outcome.exception_type = status.exception_type;
    co_return outcome;
}

}  // namespace moat
