// The local backend's terminal (terminal.hpp): a local_exec_stream reading one duplicate of the
// terminal's master, and another for input and window-size changes.
#pragma once

#include <moat/terminal.hpp>

#include "core/unique_fd.hpp"
#include "local/agent_channel.hpp"
#include "local/local_exec_stream.hpp"

#include <asio/posix/stream_descriptor.hpp>

#include <memory>

namespace moat {

class local_terminal final : public terminal::impl {
  public:
    // `master` is the input side (non-blocking); `output` reads another duplicate of it.
    local_terminal(const asio::any_io_executor& executor, std::unique_ptr<local_exec_stream> output,
                   unique_fd master, std::shared_ptr<agent_channel> agent, std::uint64_t exec_id,
                   int pid);

    std::uint64_t id() const override { return exec_id_; }
    int pid() const override { return pid_; }
    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() override;
    asio::awaitable<result<void>> async_write(std::string data) override;
    asio::awaitable<result<void>> async_resize(terminal_size size) override;
    asio::awaitable<result<void>> async_signal(int signal) override;

  private:
    std::unique_ptr<local_exec_stream> output_;
    asio::posix::stream_descriptor master_;
    std::shared_ptr<agent_channel> agent_;
    std::uint64_t exec_id_;
    int pid_;
    bool ended_ = false;  // the stream gave its result (or failed): input is refused
};

// Whether `size` is one a terminal may have (each side 1..terminal_size::max_side).
bool valid_terminal_size(terminal_size size) noexcept;

}  // namespace moat
