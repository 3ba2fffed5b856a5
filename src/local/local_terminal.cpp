#include "local/local_terminal.hpp"

#include "local/local_process.hpp"

#include <sys/ioctl.h>
#include <termios.h>
#include <cerrno>
#include <cstring>

namespace moat {

bool valid_terminal_size(terminal_size size) noexcept {
    return size.rows >= 1 && size.rows <= terminal_size::max_side && size.cols >= 1 &&
           size.cols <= terminal_size::max_side;
}

local_terminal::local_terminal(const asio::any_io_executor& executor,
                               std::unique_ptr<local_exec_stream> output, unique_fd master,
                               std::shared_ptr<agent_channel> agent, std::uint64_t exec_id, int pid)
    : output_(std::move(output)),
      master_(executor),
      agent_(std::move(agent)),
      exec_id_(exec_id),
      pid_(pid) {
    // No master: the command could not start (its stream says why); input is refused.
    if (master.is_open()) master_.assign(master.release());
}

asio::awaitable<result<std::variant<output_chunk, exec_result>>> local_terminal::async_next() {
    auto next = co_await output_->async_next();
    if (!next || std::holds_alternative<exec_result>(*next)) ended_ = true;
    co_return next;
}

asio::awaitable<result<void>> local_terminal::async_write(std::string data) {
    // A master outlives its slave's last holder and may still take bytes nobody reads.
    if (ended_) {
        std::error_code ignored;
        master_.close(ignored);
    }
    co_return co_await write_input(master_, std::move(data), input_kind::terminal, "the terminal");
}

asio::awaitable<result<void>> local_terminal::async_resize(terminal_size size) {
    if (!valid_terminal_size(size)) {
        co_return make_error(errc::invalid_argument,
                             "a terminal has 1-1000 rows and columns, not " +
                                 std::to_string(size.rows) + "x" + std::to_string(size.cols));
    }
    if (!master_.is_open()) co_return make_error(errc::invalid_argument, "the terminal is closed");
    winsize w{};
    w.ws_row = size.rows;
    w.ws_col = size.cols;
    // The kernel sends SIGWINCH to the terminal's foreground process group.
    if (::ioctl(master_.native_handle(), TIOCSWINSZ, &w) != 0) {
        co_return make_error(errc::backend_failure,
                             std::string("resizing the terminal: ") + std::strerror(errno));
    }
    co_return result<void>{};
}

asio::awaitable<result<void>> local_terminal::async_signal(int signal) {
    co_return signal_command(*agent_, exec_id_, signal);
}

}  // namespace moat
