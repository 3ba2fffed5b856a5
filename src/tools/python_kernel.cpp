#include "tools/python_kernel.hpp"

#include <moat/with_timeout.hpp>

#include "tools/cell_output.hpp"
#include "tools/python_driver.hpp"

#include <asio/this_coro.hpp>

#include <csignal>
#include <utility>
#include <variant>

namespace moat {

namespace {

using clock = std::chrono::steady_clock;

// Time for a killed interpreter's end to be reported before we stop waiting for it.
constexpr auto reap_grace = std::chrono::seconds(3);

}  // namespace

struct python_kernel::running {
    std::string sandbox_id;
    process interpreter;
    std::string leftover;  // results-channel bytes after the last cell's end record
};

namespace {

struct cell_read {
    std::optional<exec_result> exited;  // set when the interpreter ended during the cell
};

asio::awaitable<result<cell_read>> read_cell(process& interpreter, cell_output& results) {
    cell_read read;
    while (!results.is_done() && !results.is_broken()) {
        auto next = co_await interpreter.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            if (chunk->channel == output_channel::out) {
                results.feed(chunk->data);
            } else {
                results.feed_unframed(chunk->data);
            }
            continue;
        }
        read.exited = std::get<exec_result>(std::move(*next));
        break;
    }
    co_return read;
}

// Writes the cell to the interpreter's command channel, then reads its results up to the end
// record.
asio::awaitable<result<cell_read>> send_and_read(process& interpreter, std::string framed,
                                                 cell_output& results) {
    auto written = co_await interpreter.async_write_stdin(std::move(framed));
    if (!written) {
        // The interpreter stopped reading: it is exiting. Its end is what the cell reports.
        if (written.error().code == errc::cancelled) co_return std::move(written).error();
    }
    co_return co_await read_cell(interpreter, results);
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
        exec_request start;
        start.argv = {python_, "-u", "-c", std::string(python_driver_source()),
                      std::to_string(cells_)};
        start.wall_limit = exec_request::max_spawn_wall_limit;
        auto spawned = co_await box->async_spawn(std::move(start), limit);
        if (!spawned) co_return std::move(spawned).error();
        auto fresh = std::make_unique<running>();
        fresh->sandbox_id = box->id();
        fresh->interpreter = std::move(*spawned);
        running_ = std::move(fresh);
        outcome.started_interpreter = true;
    }
    ++cells_;

    cell_output results(capture_);
    if (on_output) results.on_output(on_output);
    // What a background thread or child printed after the previous cell ended is this cell's.
    results.feed(std::exchange(running_->leftover, {}));
    std::string framed = std::to_string(code.size()) + "\n" + code;
    const auto started = clock::now();
    const auto cell_limit = deadline::after(timeout);
    const auto first = earliest(cell_limit, limit);
    auto exchange = send_and_read(running_->interpreter, std::move(framed), results);
    auto read = co_await with_timeout(std::move(exchange), first);
    co_await asio::this_coro::reset_cancellation_state();
    outcome.duration =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - started);
    outcome.out = results.finish_out();
    outcome.err = results.finish_err();

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
    if (results.is_broken()) {
        // Only code that writes to the driver's own descriptors gets here: the channel can no
        // longer be trusted to mark a cell's end, so the interpreter ends like a crashed one.
        co_await async_stop();
        outcome.how = cell_outcome::ending::crashed;
        outcome.signal = SIGKILL;
        outcome.exit_code = 128 + SIGKILL;
        co_return outcome;
    }
    running_->leftover = results.take_leftover();
    const auto status = parse_marker_line(results.status_line());
    outcome.raised = status.raised;
    outcome.exception_type = status.exception_type;
    co_return outcome;
}

}  // namespace moat
