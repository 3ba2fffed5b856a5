// The local backend's exec_stream: reads the command's stdout and stderr pipes only when the
// caller pulls, and turns the agent's exit report into an exec_result.
#pragma once

#include <moat/exec.hpp>

#include "core/unique_fd.hpp"
#include "local/agent_channel.hpp"
#include "local/cgroup_stats.hpp"

#include <asio/posix/stream_descriptor.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace moat {

struct local_command {
    std::shared_ptr<agent_channel> agent;
    std::uint64_t exec_id = 0;
    std::shared_ptr<command_state> state;
    std::string program;             // argv[0], for the spawn-failure message
    std::shared_ptr<oom_watch> oom;  // the sandbox's; consulted when the command is SIGKILLed
    deadline backstop;               // past this the agent failed to enforce the wall limit
    std::chrono::milliseconds kill_grace{2000};
    bool resident = false;  // exec_request::resident: dropping the stream does not kill it
};

class local_exec_stream final : public exec_stream::impl {
  public:
    local_exec_stream(const asio::any_io_executor& executor, local_command command, unique_fd out,
                      unique_fd err);
    ~local_exec_stream() override;

    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() override;

    // A terminal's: its one output (the master) arrives once the command has started; until
    // then `out` was an ended pipe.
    void replace_output(unique_fd out);

  private:
    asio::awaitable<result<std::variant<output_chunk, exec_result>>> next();
    enum class wait_outcome { readable, timer, cancelled };
    // Waits until a pipe is readable or the backstop passes. On cancellation it resets the
    // coroutine's cancellation state so that stop() can await the kill's confirmation.
    asio::awaitable<wait_outcome> wait_for_output();
    asio::awaitable<result<std::variant<output_chunk, exec_result>>> finish();
    asio::awaitable<result<std::variant<output_chunk, exec_result>>> stop(errc why);
    exec_result make_result(const wire::exited_message& exit) const;
    bool try_read(asio::posix::stream_descriptor& pipe, std::string& chunk);

    local_command command_;
    asio::posix::stream_descriptor out_;
    asio::posix::stream_descriptor err_;
    deadline drain_ = deadline::never();  // set once the exit is known (see drain_time)
    bool read_err_first_ = false;
    bool spawn_message_sent_ = false;
    bool finished_ = false;
};

}  // namespace moat
