// pid 1 of a sandbox (the contract of agent.hpp), shared by the files that define it:
//
//   agent.cpp           setup, the poll loop, connections (the owner's and attached ones) and
//                       their control messages, the TTL and wall-limit deadlines
//   agent_commands.cpp  commands: the start of each (a command child, command_child.hpp), its
//                       `started` and `exited` reports, reaping, and the per-command cgroups
//   agent_terminals.cpp terminals: a command's pseudo-terminal on the sandbox's devpts, the
//                       master handed out with `started` and to each pty_attach
//   agent_watch.cpp     file watches: an inotify watch added in the sandbox's mount namespace
//
// Single-threaded: everything runs on pid 1's one loop (agent::run).
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <span>
#include <vector>

#include "sandboxd/command_child.hpp"
#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"

namespace moat::sandboxd {

inline std::uint64_t now_us() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000 +
           static_cast<std::uint64_t>(ts.tv_nsec) / 1000;
}

// Signals a command: its process group, or the child itself while it has not made that group
// yet (it is still on its way to exec).
inline void signal_command(pid_t pid, int signal) {
    if (::kill(-pid, signal) != 0 && errno == ESRCH) ::kill(pid, signal);
}

// Accepts one connection on `listener` (non-blocking, close-on-exec) and reads its peer's
// credentials (SO_PEERCRED): the descriptor, or -1 when there was none to accept or its
// credentials could not be read (it is closed then).
inline int accept_with_peer(int listener, ucred& peer) {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return -1;
    socklen_t length = sizeof peer;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 || length != sizeof peer) {
        ::close(fd);
        return -1;
    }
    return fd;
}

class agent {
  public:
    agent(std::uint64_t ttl_ms, std::uint32_t max_processes, std::uint32_t open_files,
          bool survive_owner, std::uint16_t egress_port, bool allow_sudo)
        : survive_owner_(survive_owner),
          allow_sudo_(allow_sudo),
          egress_port_(egress_port),
          max_processes_(max_processes),
          open_files_(open_files),
          ttl_deadline_us_(ttl_ms == 0 ? 0 : now_us() + ttl_ms * 1000) {}

    int run();
    // On the way out: thaws the commands' v1 freezer (a frozen process dies of the SIGKILL pid 1's
    // exit sends only once thawed, and pid 1 cannot finish exiting before they have).
    void thaw_commands();

  private:
    // A per-command cgroup below the commands' one: "c<number>".
    struct cgroup_slot {
        int dir = -1;  // O_PATH descriptor of the directory
        std::uint64_t number = 0;
        std::uint64_t killed_us = 0;  // while draining: when its leftovers were killed
    };

    struct command {
        std::uint64_t exec_id;
        pid_t pid;
        std::uint64_t start_us;
        std::uint64_t deadline_us;  // 0 = none
        int connection;             // the control connection that started it, or -1 once gone
        int status_pipe;            // read end: errno if the child failed before exec
        cgroup_slot cgroup;         // its own cgroup (exec_own_cgroup), or dir -1
        bool timed_out = false;
        bool resident = false;  // exec_resident: outlives its connection, spared by the sweep
        bool started = false;   // `started` sent: the child has exec'd (its status pipe hit EOF)
        int spawn_errno = 0;    // what the child reported before it could exec
        // Its start block (start_blocks), released once the child has exec'd or died.
        void* block = nullptr;
        std::size_t block_bytes = 0;
        // exec_terminal: pid 1's copy of the master, closed when the command is reaped, and the
        // connections that attached to it (pty_attach), each under its own exec id.
        int pty_master = -1;
        std::vector<std::pair<int, std::uint64_t>> attached = {};
    };

    struct connection {
        int fd;
        bool owner;  // fd 3, from the helper: its end means the owner is gone
        bool closing = false;
        // From the sandbox's sudo shim (wire::sudo_socket_name): one exec as root, and kills.
        bool sudo = false;
        std::uint64_t request_deadline_us = 0;  // sudo: its exec must come by then; 0 once it did
        bool running = false;                   // sudo: its command was started
    };

    bool setup();
    bool limit_open_files();
    // The egress endpoint: a TCP socket listening on 127.0.0.1:egress_port_ in this sandbox's
    // network namespace. pid 1 never accepts on it; every connected library gets a dup with its
    // `ready` and accepts there (see agent.hpp).
    bool listen_egress();
    void send_ready(int fd);
    int poll_timeout_ms() const;
    void enforce_deadlines();
    void accept_connection();
    // The sudo socket (wire::sudo_socket_name), bound before any command runs; false on failure.
    bool listen_sudo();
    void accept_sudo();
    // A sudo connection's exec: run as root when the sandbox allows sudo, else refused (EPERM).
    void handle_sudo_exec(connection& c, std::span<const std::byte> record, std::span<int> fds);
    connection* find_connection(int fd);
    // False when the connection is gone.
    bool handle_control(int fd);
    void handle_exec(int fd, std::span<const std::byte> record, std::span<int> fds,
                     bool descriptors_lost);
    // Starts a decoded exec whose descriptors (`fds`: three, or none for a terminal) were checked.
    void run_exec(int fd, const wire::exec_request_view& request, std::span<int> fds);
    void handle_kill(int fd, const wire::kill_message& m);
    // Pause or resume: the clocks of the wall limits and the sandbox's end (set_paused_message).
    void handle_set_paused(int fd, const wire::set_paused_message& m);
    // A pseudo-terminal for a command: the master (kept, close-on-exec) in `master` and the slave
    // (close-on-exec, owned by the sandbox's user) in `slave`, sized; false with errno set.
    bool open_terminal(std::uint16_t rows, std::uint16_t cols, int& master, int& slave);
    // Answers pty_attach with a duplicate of the master of the terminal command it names.
    void handle_pty_attach(int fd, const wire::pty_attach_message& m);
    // `started` for a command, with a duplicate of its terminal's master attached if it has one.
    void send_started(const command& c);
    // Connects to a port on the sandbox's loopback and answers port_connected with the socket.
    void handle_connect_port(int fd, const wire::connect_port_message& m);
    // Connects to a unix-domain stream socket in the sandbox; answers port_connected likewise.
    void handle_connect_unix(int fd, const wire::connect_unix_message& m);
    // Adds an inotify watch on a directory of the sandbox (wire::watch_dir_message) to the
    // attached instance, or to a new one it hands out; answers watch_added. Closes `fds`.
    void handle_watch_dir(int fd, std::span<const std::byte> record, std::span<int> fds,
                          bool descriptors_lost);
    // Sends an answer (port_connected, pty_attached, watch_added) with `descriptor` attached
    // (when >= 0), then closes our copy.
    void send_attached(int fd, std::span<const std::byte> record, int descriptor);
    // Reads the status pipes that turned readable: EOF means the child exec'd (`started` goes
    // out), an errno that it failed (reported when it is reaped).
    void check_starts();
    // Closes connections marked `closing`; false if the owner's went and the sandbox must end.
    bool close_connections();
    void reap();
    // A cgroup of its own for a command: an idle one, or a new one; dir -1 if there is none.
    cgroup_slot acquire_cgroup();
    // After the command's main process exited: kills what is left in its cgroup (true if
    // anything was) and keeps the cgroup for reuse once it is empty.
    bool release_cgroup(cgroup_slot slot);
    // Moves killed cgroups that have emptied back to the idle list.
    void check_draining();
    void drop_cgroup(const cgroup_slot& slot);
    // SIGKILLs the processes that are members of `cgroup_dir` itself (not of cgroups below it).
    void kill_members(int cgroup_dir);
    pid_t start_child(const start_block& block, int cgroup_dir);
    void send_exited(int fd, std::uint64_t exec_id, int status, std::uint32_t flags,
                     int spawn_errno, std::uint64_t start_us);

    // Sends without blocking: a peer that stops reading is dropped rather than allowed to stall
    // pid 1 (and every other connection) on a full socket buffer.
    template <class Message>
    void send(int fd, const Message& m) {
        if (fd < 0) return;
        const auto bytes = std::as_bytes(std::span(&m, 1));
        if (wire::send_record(fd, bytes, {}, MSG_DONTWAIT) < 0) mark_closing(fd);
    }
    void mark_closing(int fd) {
        for (auto& c : connections_) {
            if (c.fd == fd) c.closing = true;
        }
    }

    bool survive_owner_;
    bool allow_sudo_;
    std::uint16_t egress_port_;  // 0: no egress endpoint
    int egress_fd_ = -1;
    std::uint32_t max_processes_;
    std::uint32_t open_files_;
    std::uint64_t ttl_deadline_us_;
    // When the commands were paused (set_paused), 0 while they run: wall limits stand still.
    std::uint64_t paused_since_us_ = 0;
    int listen_fd_ = -1;
    int sudo_fd_ = -1;  // the sudo socket's listener, or -1
    // Whether a command child may share pid 1's memory (CLONE_VM): only while fs.suid_dumpable is
    // 0, so that its uid change never makes pid 1's memory dumpable, not even for a moment.
    bool share_memory_ = true;
    int command_cgroup_ = -1;           // see command_cgroup_fd
    int command_cgroup_kill_ = -1;      // see command_cgroup_kill_fd (held, never written: reap)
    int freezer_tasks_ = -1;            // see freezer_commands_fd (v1 freezer), or -1
    int freezer_state_ = -1;            // see freezer_state_fd (v1 freezer), or -1
    bool per_command_cgroups_ = false;  // cgroups can be made below command_cgroup_
    bool clone3_usable_ = true;         // false once the kernel refused CLONE_INTO_CGROUP
    std::uint64_t next_cgroup_ = 1;
    std::vector<cgroup_slot> idle_cgroups_;
    std::vector<cgroup_slot> draining_cgroups_;
    int signal_fd_ = -1;
    std::vector<connection> connections_;
    std::vector<command> commands_;
    start_blocks blocks_;
    std::vector<pollfd> poll_fds_;
    std::vector<std::byte> buffer_ = std::vector<std::byte>(wire::max_message_bytes);
};

}  // namespace moat::sandboxd
