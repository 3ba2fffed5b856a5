#include "cli/terminal_session.hpp"

#include "cli/cli_runtime.hpp"
#include "core/asio_compat.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>

namespace moat::cli {
namespace {

using namespace asio::experimental::awaitable_operators;

// The window's size (stdout's terminal, else stdin's), or 24x80.
terminal_size window_size() {
    winsize w{};
    for (const int fd : {STDOUT_FILENO, STDIN_FILENO}) {
        if (::ioctl(fd, TIOCGWINSZ, &w) == 0 && w.ws_row > 0 && w.ws_col > 0) {
            const auto clamp = [](unsigned short v) {
                return static_cast<std::uint16_t>(
                    v > terminal_size::max_side ? terminal_size::max_side : v);
            };
            return {clamp(w.ws_row), clamp(w.ws_col)};
        }
    }
    return {};
}

// This process's terminal in raw mode while it lives; restored by the destructor, which every
// way out of the session runs (a signal that ends moat is a cancellation here, not an exit).
class raw_mode {
  public:
    raw_mode() {
        if (::tcgetattr(STDIN_FILENO, &saved_) != 0) return;
        termios raw = saved_;
        ::cfmakeraw(&raw);
        // TCSANOW, not TCSAFLUSH: what was typed ahead goes to the command, not away.
        active_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    ~raw_mode() {
        if (active_) ::tcsetattr(STDIN_FILENO, TCSADRAIN, &saved_);
    }
    raw_mode(const raw_mode&) = delete;
    raw_mode& operator=(const raw_mode&) = delete;

  private:
    termios saved_{};
    bool active_ = false;
};

// Output until the terminal ends: its result, or why it failed.
asio::awaitable<result<exec_result>> pump_output(terminal& t) {
    bool window_open = true;
    for (;;) {
        auto next = co_await t.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            // The bytes as they are: this is the command's terminal (no terminal_safe filter).
            if (window_open) window_open = write_all(STDOUT_FILENO, chunk->data);
            continue;
        }
        co_return std::get<exec_result>(std::move(*next));
    }
}

// Waits forever (until cancelled): what an input pump does after its input ended.
asio::awaitable<void> idle() {
    asio::steady_timer never(co_await asio::this_coro::executor);
    never.expires_at(asio::steady_timer::time_point::max());
    auto [ec] = co_await never.async_wait(as_tuple(asio::use_awaitable));
    (void)ec;
}

// Typed bytes to the terminal. stdin is read only once it polls readable, so its descriptor's
// flags (shared with the shell that started moat) are never changed.
asio::awaitable<void> pump_input(terminal& t) {
    asio::posix::stream_descriptor input(co_await asio::this_coro::executor,
                                         ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 0));
    char buffer[4096];
    for (;;) {
        auto [ec] = co_await input.async_wait(asio::posix::descriptor_base::wait_read,
                                              as_tuple(asio::use_awaitable));
        if (ec) co_return;
        const ssize_t n = ::read(input.native_handle(), buffer, sizeof buffer);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) break;  // no more input: the command goes on, as with docker -i
        std::string bytes(buffer, static_cast<std::size_t>(n));
        auto written = co_await t.async_write(std::move(bytes));
        if (!written) break;  // the terminal closed: the output pump ends the session
    }
    co_await idle();
}

// Window-size changes to the terminal.
asio::awaitable<void> pump_resizes(terminal& t) {
    asio::signal_set changes(co_await asio::this_coro::executor, SIGWINCH);
    for (;;) {
        auto [ec, number] = co_await changes.async_wait(as_tuple(asio::use_awaitable));
        if (ec) co_return;
        (void)number;
        (void)co_await t.async_resize(window_size());
    }
}

// The session's outcome: the output pump's, or, when a cancellation (SIGTERM, SIGHUP) ended
// another pump first (and the output pump, cancelled, killed the command), cancelled.
template <class Outcome>
result<exec_result> output_of(Outcome outcome) {
    if (outcome.index() == 0) return std::get<0>(std::move(outcome));
    return make_error(errc::cancelled, "the terminal session was interrupted");
}

asio::awaitable<result<exec_result>> run_on_terminal(std::shared_ptr<sandbox> box,
                                                     exec_request request, bool interactive) {
    auto opened = co_await box->async_open_terminal(std::move(request), window_size());
    if (!opened) co_return std::move(opened).error();
    terminal t = std::move(*opened);
    if (!interactive) {
        auto outcome = co_await (pump_output(t) || pump_resizes(t));
        co_return output_of(std::move(outcome));
    }
    raw_mode raw;
    auto outcome = co_await (pump_output(t) || pump_input(t) || pump_resizes(t));
    co_return output_of(std::move(outcome));
}

}  // namespace

std::optional<std::string> terminal_flags_problem(const command_flags& flags) {
    if (!flags.terminal) return std::nullopt;
    if (flags.json) return "-t does not go with --json (a terminal's output is one stream)";
    if (flags.read_stdin) return "-t does not go with --stdin (use -it to type into it)";
    if (flags.interactive && !is_terminal(STDIN_FILENO)) {
        return "-it: the input device is not a terminal (use -t, or --stdin without -t)";
    }
    return std::nullopt;
}

asio::awaitable<result<exec_result>> run_in_box(std::shared_ptr<sandbox> box,
                                                const command_flags& flags) {
    if (!flags.terminal) {
        co_return co_await exec_for_terminal(std::move(box), flags.request, flags.json, flags.raw);
    }
    exec_request request = flags.request;
    if (!flags.wall_limit_set) request.wall_limit = exec_request::max_spawn_wall_limit;
    co_return co_await run_on_terminal(std::move(box), std::move(request), flags.interactive);
}

}  // namespace moat::cli
