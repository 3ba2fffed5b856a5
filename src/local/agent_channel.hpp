// The library's side of one sandbox's pid-1 agent: sends exec and kill, and dispatches what the
// agent reports (ready, started, exited) to the command waiting for it. Everything the agent
// sends is checked (exact sizes, known ids); anything else marks the channel broken.
// Confined to the backend's executor.
#pragma once

#include <moat/deadline.hpp>
#include <moat/log.hpp>
#include <moat/result.hpp>
#include <moat/task_group.hpp>

#include "core/async_event.hpp"
#include "local/seqpacket_channel.hpp"
#include "wire/protocol.hpp"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moat {

// What the agent reported about one command.
struct command_state {
    explicit command_state(const asio::any_io_executor& ex) : started(ex), exited(ex) {}
    async_event
        started;  // set on `started`, on an immediate spawn failure, or when the channel breaks
    async_event exited;  // set on `exited` or when the channel breaks
    std::optional<wire::started_message> start;
    std::optional<wire::exited_message> exit;
    bool abandoned = false;  // nobody reads the result; forget the command when it exits
    // exec_terminal: `started` carries the terminal's master, kept here for the taker. When this
    // process had no descriptor free for it, master_lost is set instead.
    bool terminal = false;
    unique_fd master;
    bool master_lost = false;
};

class agent_channel : public std::enable_shared_from_this<agent_channel> {
  public:
    agent_channel(const asio::any_io_executor& executor, unique_fd control, std::string sandbox_id);

    // Starts reading the agent's reports (owned by `tasks`).
    void start(task_group& tasks);

    // Waits for the agent's `ready`.
    asio::awaitable<result<void>> async_wait_ready(deadline limit);

    // After `ready`: the sandbox's egress listener (a listening TCP socket in its network
    // namespace) and its port, if its agent has one; taken once.
    unique_fd take_egress_listener();
    std::uint16_t egress_port() const noexcept { return egress_port_; }

    // Sends an exec record with [stdin, stdout, stderr] attached (none for an exec_terminal
    // command, whose `started` brings its terminal's master) and registers the command.
    // Fails with backend_failure if the agent does not take the record by `limit`.
    asio::awaitable<result<std::shared_ptr<command_state>>> async_exec(
        std::uint64_t exec_id, std::span<const std::byte> record, std::span<const int> stdio,
        deadline limit);

    // Moves the sandbox's end (its pid 1 enforces it) to `ttl` from now and waits for the agent to
    // confirm, until `limit`. Cancellation: none once the request is sent (the change happens
    // anyway). backend_failure if unconfirmed: the sandbox may end at either time.
    asio::awaitable<result<void>> async_set_ttl(std::chrono::milliseconds ttl, deadline limit);
    // Tells pid 1 the commands were frozen (`paused`) or thawed, and moves the sandbox's end to
    // `ttl` from now (0: none), as set_paused_message says; confirmed as async_set_ttl is.
    asio::awaitable<result<void>> async_set_paused(bool paused, std::chrono::milliseconds ttl,
                                                   deadline limit);

    // A TCP socket the agent connected to `port` on the sandbox's loopback (`family` 4: 127.0.0.1,
    // 6: ::1), and whether its connect was still under way. Errors: the agent's errno as
    // `connect_errno` of port_refusal (sandbox_unavailable when the channel broke, backend_failure
    // when the agent did not answer by `limit`). Cancellation: the answer is dropped when it comes.
    struct port_socket {
        unique_fd socket;
        bool in_progress = false;
        int connect_errno = 0;  // when `socket` is closed: why the agent could not connect
    };
    asio::awaitable<result<port_socket>> async_connect_port(std::uint16_t port, int family,
                                                            deadline limit);
    // The same for a stream connection to the unix-domain socket at `path` (checked by the
    // caller: wire::unix_path_problem) in the sandbox's filesystem; never in progress.
    asio::awaitable<result<port_socket>> async_connect_unix(std::string_view path, deadline limit);

    // Reattaches to the running terminal command `pid` of the sandbox (pty_attach): its master,
    // and the command registered under `exec_id` (an id of this connection's sequence, unused),
    // whose exit arrives like any other. Errors: invalid_argument (no such terminal command),
    // limit_exceeded (no descriptor free, here or in pid 1), sandbox_unavailable (the channel
    // broke), backend_failure (no answer by `limit`), cancelled (the answer is dropped then, and
    // with it the attachment).
    struct terminal_attachment {
        std::shared_ptr<command_state> state;
        unique_fd master;
    };
    asio::awaitable<result<terminal_attachment>> async_attach_terminal(std::uint64_t exec_id,
                                                                       int pid, deadline limit);

    // Asks the agent for an inotify watch on the directory `base`/`relative` in the sandbox
    // (wire::watch_dir_message): added to `instance` when it is open (the agent's copy is
    // closed), else to a new instance the agent makes and hands out. Errors as the connects':
    // the agent's errno is data (`watch_errno`), the channel's failures are errors.
    struct watch_answer {
        unique_fd instance;  // the new instance, when none was given and the watch was added
        int watch_errno = 0;
        std::int32_t watch_descriptor = -1;
    };
    asio::awaitable<result<watch_answer>> async_watch_dir(std::string_view base,
                                                          std::string_view relative,
                                                          std::uint32_t mask, int instance,
                                                          deadline limit);

    // Runs `on_end(reason)` once, when the channel breaks (pid 1 exited, destroy, detach), if
    // `owner` is still alive then; at once if it has broken. For what must end with the sandbox
    // (a watch). Registrations whose owner is gone are dropped as new ones come.
    void on_broken(std::weak_ptr<void> owner, std::function<void(const std::string&)> on_end);

    // Sends `signal` to the command's process group without waiting (small record).
    result<void> kill(std::uint64_t exec_id, int signal);

    // Forgets a command: now if it has exited, else when it does.
    void release(std::uint64_t exec_id);

    // Why the channel stopped (agent exited, protocol violation), or nullopt while healthy.
    const std::optional<std::string>& broken() const noexcept { return broken_; }

    // Ends the channel from our side (destroy, detach): logged at debug level only.
    void close();

  private:
    // Sends a record whose request_id the agent answers with ttl_set or paused_set, and waits
    // for that answer (see async_set_ttl); `what` names the change in the error.
    asio::awaitable<result<void>> async_confirmed(std::span<const std::byte> bytes,
                                                  std::uint64_t request_id, const char* what,
                                                  deadline limit);
    friend asio::awaitable<void> run_agent_reader(std::shared_ptr<agent_channel> self);
    asio::awaitable<void> read_loop();
    void dispatch(received_record& record);
    // Sends `message` (with `attach` by SCM_RIGHTS) and waits until `answered` is set, `limit`
    // passes or a cancellation comes.
    struct awaited {
        result<void> sent;
        bool cancelled = false;  // the wait was cancelled
    };
    asio::awaitable<awaited> send_and_await(std::span<const std::byte> message,
                                            std::span<const int> attach, async_event& answered,
                                            deadline limit);
    // After send_and_await: why there is no answer to use (the channel broke, the send failed,
    // "cancelled while <doing>", "the sandbox agent did not answer <request> in time"), or
    // nullopt.
    std::optional<error> unanswered(const awaited& a, const async_event& answered,
                                    std::string_view doing, std::string_view request) const;
    // Sends a connect request (`message`, whose id is `request_id`) and waits for its
    // port_connected; `what` names the target in errors.
    // `attach`: descriptors sent with the request.
    struct port_request;
    asio::awaitable<result<std::shared_ptr<port_request>>> request_descriptor(
        std::span<const std::byte> message, std::span<const int> attach, std::uint64_t request_id,
        std::string what, deadline limit);
    asio::awaitable<result<port_socket>> request_connection(std::span<const std::byte> message,
                                                            std::uint64_t request_id,
                                                            std::string what, deadline limit);
    using command_map = std::map<std::uint64_t, std::shared_ptr<command_state>>;
    // The command a `started` or `exited` record names (read into `m`), or commands_.end().
    template <class Message>
    command_map::iterator command_of(const received_record& record, wire::message_type type,
                                     Message& m);
    // `started` (with a terminal's master) and pty_attached, the records that may carry one.
    void dispatch_started(received_record& record);
    void dispatch_attached(received_record& record);
    // Marks the channel broken; logged at `level` (a warning unless we closed it ourselves).
    void break_channel(std::string reason, log_level level = log_level::warning);

    asio::any_io_executor executor_;
    seqpacket_channel channel_;
    std::string sandbox_id_;
    async_event ready_;
    unique_fd egress_listener_;
    std::uint16_t egress_port_ = 0;
    std::optional<std::string> broken_;
    command_map commands_;
    std::map<std::uint64_t, std::shared_ptr<async_event>> ttl_requests_;
    std::uint64_t next_ttl_request_ = 1;
    // connect_port, connect_unix and watch_dir requests awaiting port_connected or watch_added;
    // ids share next_ttl_request_'s sequence.
    std::map<std::uint64_t, std::shared_ptr<port_request>> port_requests_;
    // pty_attach requests awaiting pty_attached, by the exec id they attach under.
    struct attach_request;
    std::map<std::uint64_t, std::shared_ptr<attach_request>> attach_requests_;
    struct broken_observer {
        std::weak_ptr<void> owner;
        std::function<void(const std::string&)> on_end;
    };
    std::vector<broken_observer> on_broken_;
};

}  // namespace moat
