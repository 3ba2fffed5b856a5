#include "local/local_exec_stream.hpp"

#include "core/cancellation.hpp"
#include "core/descriptor_wait.hpp"
#include "core/exception_boundary.hpp"
#include "local/cgroup_stats.hpp"

#include <asio/this_coro.hpp>

#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace moat {
namespace {

constexpr std::size_t chunk_bytes = 64 * 1024;
// Once the command's exit is known, output still in the pipes is read for this long at most: a
// process outside the command's reach (handed a pipe end, or on a host without per-command
// cgroups) must not hold the result back until the wall limit.
constexpr std::chrono::milliseconds drain_time{100};

}  // namespace

local_exec_stream::local_exec_stream(const asio::any_io_executor& executor, local_command command,
                                     unique_fd out, unique_fd err)
    : command_(std::move(command)), out_(executor, out.release()), err_(executor, err.release()) {}

local_exec_stream::~local_exec_stream() {
    if (!finished_ && !command_.state->exit && !command_.resident) {
        (void)command_.agent->kill(command_.exec_id, SIGKILL);
    }
    command_.agent->release(command_.exec_id);
}

void local_exec_stream::replace_output(unique_fd out) {
    std::error_code ignored;
    out_.close(ignored);
    out_.assign(out.release(), ignored);
}

bool local_exec_stream::try_read(asio::posix::stream_descriptor& pipe, std::string& chunk) {
    if (!pipe.is_open()) return false;
    chunk.resize(chunk_bytes);
    const ssize_t n = ::read(pipe.native_handle(), chunk.data(), chunk.size());
    if (n > 0) {
        chunk.resize(static_cast<std::size_t>(n));
        return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    std::error_code ignored;
    pipe.close(ignored);  // EOF (or a broken pipe): this stream has ended
    return false;
}

asio::awaitable<local_exec_stream::wait_outcome> local_exec_stream::wait_for_output() {
    auto& first = out_.is_open() ? out_ : err_;
    auto* second = out_.is_open() && err_.is_open() ? &err_ : nullptr;
    if (command_.state->exit && drain_.is_never()) drain_ = deadline::after(drain_time);
    const deadline limit = earliest(command_.backstop, drain_);
    const auto waited =
        co_await async_wait_until(first, asio::posix::descriptor_base::wait_read, limit, second);
    switch (waited) {
        case wait_result::ready:
            co_return wait_outcome::readable;
        case wait_result::deadline_passed:
            co_return wait_outcome::timer;
        case wait_result::cancelled:
            break;  // the state is reset: stop() can await
    }
    co_return wait_outcome::cancelled;
}

asio::awaitable<result<std::variant<output_chunk, exec_result>>> local_exec_stream::async_next() {
    try {
        co_return co_await next();
    } catch (...) {
        // No co_await in a handler: kill without waiting; the stream is finished.
        if (!command_.state->exit) (void)command_.agent->kill(command_.exec_id, SIGKILL);
        finished_ = true;
        co_return error_from_exception(std::current_exception());
    }
}

asio::awaitable<result<std::variant<output_chunk, exec_result>>> local_exec_stream::next() {
    if (finished_)
        co_return make_error(errc::invalid_argument, "the exec stream has already ended");
    std::string chunk;
    while (out_.is_open() || err_.is_open()) {
        auto& first = read_err_first_ ? err_ : out_;
        auto& second = read_err_first_ ? out_ : err_;
        read_err_first_ = !read_err_first_;
        if (try_read(first, chunk)) {
            const auto channel = &first == &out_ ? output_channel::out : output_channel::err;
            co_return output_chunk{channel, std::move(chunk)};
        }
        if (try_read(second, chunk)) {
            const auto channel = &second == &out_ ? output_channel::out : output_channel::err;
            co_return output_chunk{channel, std::move(chunk)};
        }
        if (!out_.is_open() && !err_.is_open()) break;
        const auto outcome = co_await wait_for_output();
        if (outcome == wait_outcome::cancelled) co_return co_await stop(errc::cancelled);
        if (outcome == wait_outcome::timer) {
            if (!command_.state->exit) co_return co_await stop(errc::backend_failure);
            // It exited long ago but something still holds the pipes open: stop reading.
            std::error_code ignored;
            out_.close(ignored);
            err_.close(ignored);
        }
    }
    co_return co_await finish();
}

asio::awaitable<result<std::variant<output_chunk, exec_result>>> local_exec_stream::finish() {
    // Both pipes are closed; the exit report follows (or the program closed its output early and
    // runs on: it gets until the backstop like any other).
    const auto outcome = co_await command_.state->exited.async_wait(command_.backstop);
    if (outcome == async_event::wait_outcome::cancelled) co_return co_await stop(errc::cancelled);
    if (!command_.state->exit) {
        if (auto broken = command_.agent->broken()) {
            finished_ = true;
            co_return make_error(errc::sandbox_unavailable, *broken);
        }
        co_return co_await stop(errc::backend_failure);
    }
    const auto& exit = *command_.state->exit;
    if ((exit.flags & wire::exited_spawn_failed) != 0 && !spawn_message_sent_) {
        spawn_message_sent_ = true;
        std::string message = "moat: cannot run '" + command_.program +
                              "': " + std::strerror(exit.spawn_errno) + "\n";
        co_return output_chunk{output_channel::err, std::move(message)};
    }
    finished_ = true;
    co_return make_result(exit);
}

asio::awaitable<result<std::variant<output_chunk, exec_result>>> local_exec_stream::stop(errc why) {
    // Cleanup is not cancellable: kill, then wait a bounded grace for the agent to confirm.
    co_await asio::this_coro::reset_cancellation_state();
    finished_ = true;
    std::error_code ignored;
    out_.close(ignored);
    err_.close(ignored);
    if (!command_.state->exit) (void)command_.agent->kill(command_.exec_id, SIGKILL);
    const auto grace = deadline::after(command_.kill_grace);
    co_await command_.state->exited.async_wait(grace);
    if (!command_.state->exit) {
        // Not cancelled: moat cannot vouch for the sandbox (the layer above quarantines it).
        co_return make_error(errc::backend_failure,
                             "the command was killed but its end was not confirmed within " +
                                 std::to_string(command_.kill_grace.count()) + " ms");
    }
    if (why == errc::cancelled) co_return make_error(errc::cancelled, "the command was killed");
    co_return make_error(why, "the command outlived its wall limit and moat killed it");
}

exec_result local_exec_stream::make_result(const wire::exited_message& exit) const {
    exec_result r;
    r.duration = std::chrono::microseconds(exit.duration_us);
    const int status = exit.wait_status;
    if ((exit.flags & wire::exited_spawn_failed) != 0) {
        r.exit_code = exit.spawn_errno == ENOENT ? 127 : 126;
    } else if ((exit.flags & wire::exited_timed_out) != 0) {
        r.timed_out = true;
        r.exit_code = 124;
        r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
    } else if (WIFEXITED(status)) {
        r.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        r.signal = WTERMSIG(status);
        r.exit_code = 128 + r.signal;
    }
    r.strays_killed = (exit.flags & wire::exited_strays_killed) != 0;
    // The command ended by SIGKILL (directly, or as a shell's exit status 137 for its killed
    // child) and the sandbox's memory cgroup counted an OOM kill since the library last looked.
    const bool killed = r.signal == SIGKILL || (r.signal == 0 && r.exit_code == 128 + SIGKILL);
    if (killed && !r.timed_out && command_.oom) r.oom_killed = command_.oom->counted_new_kill();
    return r;
}

}  // namespace moat
