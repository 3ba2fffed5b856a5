// The local backend's process (backend::async_spawn): a local_exec_stream for the output plus our
// end of the program's stdin socket and the agent channel for signals; and what its terminal
// (local_terminal.hpp) shares with it: writing input, signalling.
#pragma once

#include <moat/exec.hpp>

#include "core/unique_fd.hpp"
#include "local/agent_channel.hpp"
#include "local/local_exec_stream.hpp"

#include <asio/posix/stream_descriptor.hpp>

#include <memory>

namespace moat {

enum class input_kind { socket, terminal };

// Writes all of `data` to `to` (non-blocking), waiting while it is full; `what` names it in
// errors. invalid_argument once it is closed or refuses input for good (and it is closed then);
// cancelled (terminal cancellation) with the count written so far.
asio::awaitable<result<void>> write_input(asio::posix::stream_descriptor& to, std::string data,
                                          input_kind kind, std::string what);

// Sends `signal` (1..64, else invalid_argument) to a command's process group.
result<void> signal_command(agent_channel& agent, std::uint64_t exec_id, int signal);

class local_process final : public process::impl {
  public:
    local_process(const asio::any_io_executor& executor, std::unique_ptr<local_exec_stream> output,
                  unique_fd stdin_socket, std::shared_ptr<agent_channel> agent,
                  std::uint64_t exec_id, int pid);

    std::uint64_t id() const override { return exec_id_; }
    int pid() const override { return pid_; }
    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() override;
    asio::awaitable<result<void>> async_write_stdin(std::string data) override;
    asio::awaitable<result<void>> async_close_stdin() override;
    asio::awaitable<result<void>> async_signal(int signal) override;

  private:
    std::unique_ptr<local_exec_stream> output_;
    asio::posix::stream_descriptor stdin_;
    std::shared_ptr<agent_channel> agent_;
    std::uint64_t exec_id_;
    int pid_;
};

}  // namespace moat
