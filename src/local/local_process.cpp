#include "local/local_process.hpp"

#include "core/asio_compat.hpp"

#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <sys/socket.h>
#include <cerrno>
#include <cstring>

namespace moat {

local_process::local_process(const asio::any_io_executor& executor,
                             std::unique_ptr<local_exec_stream> output, unique_fd stdin_socket,
                             std::shared_ptr<agent_channel> agent, std::uint64_t exec_id, int pid)
    : output_(std::move(output)),
      stdin_(executor, stdin_socket.release()),
      agent_(std::move(agent)),
      exec_id_(exec_id),
      pid_(pid) {}

asio::awaitable<result<std::variant<output_chunk, exec_result>>> local_process::async_next() {
    return output_->async_next();
}

asio::awaitable<result<void>> local_process::async_write_stdin(std::string data) {
    return write_input(stdin_, std::move(data), input_kind::socket, "the process's stdin");
}

asio::awaitable<result<void>> write_input(asio::posix::stream_descriptor& to, std::string data,
                                          input_kind kind, std::string what) {
    std::size_t offset = 0;
    auto token = as_tuple(asio::use_awaitable);
    while (offset < data.size()) {
        if (!to.is_open()) co_return make_error(errc::invalid_argument, what + " is closed");
        const char* at = data.data() + offset;
        const std::size_t left = data.size() - offset;
        // A socket is written with MSG_NOSIGNAL (EPIPE, never SIGPIPE); a terminal's master
        // never raises SIGPIPE (EIO once its slave is closed).
        const ssize_t n = kind == input_kind::socket
                              ? ::send(to.native_handle(), at, left, MSG_NOSIGNAL | MSG_DONTWAIT)
                              : ::write(to.native_handle(), at, left);
        if (n > 0) {
            offset += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            const int err = errno;
            std::error_code ignored;
            to.close(ignored);
            co_return make_error(errc::invalid_argument,
                                 what + " no longer takes input (" + std::strerror(err) + ")");
        }
        auto [ec] = co_await to.async_wait(asio::posix::descriptor_base::wait_write, token);
        if (ec) {
            co_await asio::this_coro::reset_cancellation_state();
            co_return make_error(errc::cancelled, "writing to " + what + " was cancelled after " +
                                                      std::to_string(offset) + " bytes");
        }
    }
    co_return result<void>{};
}

asio::awaitable<result<void>> local_process::async_close_stdin() {
    std::error_code ignored;
    stdin_.close(ignored);
    co_return result<void>{};
}

asio::awaitable<result<void>> local_process::async_signal(int signal) {
    co_return signal_command(*agent_, exec_id_, signal);
}

result<void> signal_command(agent_channel& agent, std::uint64_t exec_id, int signal) {
    if (signal <= 0 || signal >= 65) {
        return make_error(errc::invalid_argument,
                          "signal must be between 1 and 64, got " + std::to_string(signal));
    }
    return agent.kill(exec_id, signal);
}

}  // namespace moat
