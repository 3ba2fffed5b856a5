// pid 1 of a sandbox (agent.hpp is its contract; agent_impl.hpp the one between its files): its
// setup (limits, capabilities, the attach and egress listeners), the poll loop, connections and
// their control messages, and the deadlines. Commands are agent_commands.cpp.
#include "sandboxd/agent.hpp"

#include "sandboxd/agent_impl.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstddef>
#include <cstring>

#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"

namespace moat::sandboxd {
namespace {

constexpr int control_fd = 3;
constexpr int listen_fd = 7;                 // survivors only: the attach socket the helper bound
constexpr int command_cgroup_fd = 8;         // the commands' cgroup directory (v2), if present
constexpr int command_cgroup_kill_fd = 9;    // cgroup v2: the commands' cgroup.kill, if present
constexpr int freezer_commands_fd = 11;      // v1 freezer: the commands' tasks, if present
constexpr int freezer_state_fd = 12;         // v1 freezer: the commands' freezer.state, if present
constexpr std::size_t max_connections = 32;  // the owner's plus attached processes
constexpr int drain_poll_ms = 20;  // how often a killed cgroup is looked at while it empties

// A small number from a /proc/sys file, or `fallback`.
int read_proc_number(const char* path, int fallback) {
    int value = fallback;
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return value;
    char text[16];
    const ssize_t n = ::read(fd, text, sizeof text);
    ::close(fd);
    if (n > 0) std::from_chars(text, text + n, value);
    return value;
}

}  // namespace

// The descriptor limit, soft and hard, of pid 1 and so of everything the sandbox runs: the
// hard limit would otherwise be the application's (often 524288), which every process could
// raise its soft limit to, together past the host's fs.file-max. Without a request (the
// low-level tests) only the soft limit is lowered, as before.
bool agent::limit_open_files() {
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return false;
    if (open_files_ != 0) {
        files.rlim_cur = open_files_;
        files.rlim_max = open_files_;
    } else if (files.rlim_cur > 1024) {
        files.rlim_cur = 1024;
    }
    return ::setrlimit(RLIMIT_NOFILE, &files) == 0;
}

bool agent::setup() {
    // Non-dumpable before anything else: the sandbox's root has pid 1's uid, and only this keeps
    // /proc/1/mem, environ and fd/* (and those of a command child sharing this memory before its
    // exec) closed to it, whatever fs.suid_dumpable says.
    if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return false;
    // The descriptors the helper may have placed (the layout in spawn_sandbox.hpp), looked at
    // before this process opens anything: a number the helper left unused is closed, and the
    // first descriptor opened here (the signalfd, a cgroup directory) would take it.
    const bool has_command_cgroup = ::fcntl(command_cgroup_fd, F_SETFD, FD_CLOEXEC) == 0;
    const bool has_command_cgroup_kill = ::fcntl(command_cgroup_kill_fd, F_SETFD, FD_CLOEXEC) == 0;
    const bool has_freezer_tasks = ::fcntl(freezer_commands_fd, F_SETFD, FD_CLOEXEC) == 0;
    const bool has_freezer_state = ::fcntl(freezer_state_fd, F_SETFD, FD_CLOEXEC) == 0;
    // A uid or gid change sets the dumpable flag of the memory to fs.suid_dumpable: a child that
    // shares this memory would make it dumpable for a moment unless that is 0.
    share_memory_ = read_proc_number("/proc/sys/fs/suid_dumpable", 1) == 0;
    // The helper ignores SIGPIPE and an ignored disposition survives exec: restore it so
    // commands start with defaults.
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (::sigprocmask(SIG_SETMASK, &chld, nullptr) != 0) return false;
    signal_fd_ = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signal_fd_ < 0) return false;
    // Reduce the capability bounding set once, here, to what a root command gets
    // (wire::root_capabilities): every command inherits it, so none can gain more at exec (40-odd
    // prctl calls per command otherwise, on the exec path); a uid-1000 command drops the rest.
    const int cap_last_cap = read_proc_number("/proc/sys/kernel/cap_last_cap", CAP_LAST_CAP);
    for (int cap = 0; cap <= cap_last_cap; ++cap) {
        if (cap < 64 && ((wire::root_capabilities >> cap) & 1) != 0) continue;
        if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) return false;
    }
    // What every command inherits is set here once, not per command (on the exec path):
    // no core dumps; the usual descriptor limit (the helper raised its own, and pid 1 needs few);
    // a per-user process cap inside this user namespace, a second line against fork bombs that
    // holds even where the pids cgroup was skipped (only lowering is possible without
    // CAP_SYS_RESOURCE in the host's namespace). pid 1 already has the sandbox's group (the
    // helper set it before the parent-death signal, which a gid change here would clear), so a
    // command changes only its uid.
    const rlimit no_core{0, 0};
    if (::setrlimit(RLIMIT_CORE, &no_core) != 0) return false;
    if (!limit_open_files()) return false;
    rlimit processes{};
    if (max_processes_ != 0 && ::getrlimit(RLIMIT_NPROC, &processes) == 0) {
        processes.rlim_max = std::min<rlim_t>(processes.rlim_max, max_processes_);
        processes.rlim_cur = processes.rlim_max;
        if (::setrlimit(RLIMIT_NPROC, &processes) != 0) return false;
    }
    // The commands' cgroup files (v2): kept, but never inherited by a command.
    if (has_command_cgroup) {
        command_cgroup_ = command_cgroup_fd;
        per_command_cgroups_ = true;
        // The helper made the first exec's cgroup with the sandbox (c0).
        const int first = ::openat(command_cgroup_, "c0", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (first >= 0) idle_cgroups_.push_back({first, 0, 0});
    }
    if (has_command_cgroup_kill) command_cgroup_kill_ = command_cgroup_kill_fd;
    // Each command joins it before it execs (close-on-exec: the command never holds it).
    if (has_freezer_tasks) freezer_tasks_ = freezer_commands_fd;
    if (has_freezer_state) freezer_state_ = freezer_state_fd;
    if (survive_owner_) {
        // The helper bound this socket in its 0700 state directory; listening here makes this
        // process the one a connecting library sees in SO_PEERCRED.
        if (::fcntl(listen_fd, F_SETFD, FD_CLOEXEC) != 0) return false;
        if (::listen(listen_fd, 16) != 0) return false;
        listen_fd_ = listen_fd;
    }
    if (egress_port_ != 0 && !listen_egress()) return false;
    if (!listen_sudo()) return false;
    connections_.push_back({control_fd, true});
    send_ready(control_fd);
    return true;
}

bool agent::listen_egress() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(egress_port_);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(fd, 128) != 0) {
        ::close(fd);
        return false;
    }
    egress_fd_ = fd;
    return true;
}

void agent::send_ready(int fd) {
    auto ready = wire::make_message<wire::ready_message>(wire::message_type::ready);
    ready.version = wire::protocol_version;
    ready.egress_port = egress_port_;
    const int listener[1] = {egress_fd_};
    std::span<const int> fds;
    if (egress_fd_ >= 0) fds = listener;
    const auto bytes = std::as_bytes(std::span(&ready, 1));
    if (wire::send_record(fd, bytes, fds, MSG_DONTWAIT) < 0) mark_closing(fd);
}

void agent::thaw_commands() {
    if (freezer_state_ >= 0) (void)!::write(freezer_state_, "THAWED", 6);
}

int agent::run() {
    if (!setup()) return 1;
    for (;;) {
        poll_fds_.clear();
        poll_fds_.push_back({signal_fd_, POLLIN, 0});
        poll_fds_.push_back({listen_fd_, POLLIN, 0});  // a negative fd is skipped by poll
        poll_fds_.push_back({sudo_fd_, POLLIN, 0});
        for (const auto& c : connections_) poll_fds_.push_back({c.fd, POLLIN, 0});
        const std::size_t first_start = poll_fds_.size();
        for (const auto& c : commands_) {
            if (!c.started && c.status_pipe >= 0) poll_fds_.push_back({c.status_pipe, POLLIN, 0});
        }
        const int ready = ::poll(poll_fds_.data(), poll_fds_.size(), poll_timeout_ms());
        if (ready < 0 && errno != EINTR) return 1;
        if (ttl_deadline_us_ != 0 && now_us() >= ttl_deadline_us_) return 0;
        // Reap first: a command that exited just as its wall limit came is not a timeout.
        if (ready > 0 && poll_fds_[0].revents != 0) reap();
        if (!draining_cgroups_.empty()) check_draining();
        enforce_deadlines();
        if (ready <= 0) {
            if (!close_connections()) return 0;  // a sudo request that did not come in time
            continue;
        }
        bool any_started = false;
        for (std::size_t i = first_start; i < poll_fds_.size(); ++i) {
            any_started = any_started || poll_fds_[i].revents != 0;
        }
        if (any_started) check_starts();
        for (std::size_t i = 3; i < first_start; ++i) {
            if (poll_fds_[i].revents != 0 && !handle_control(poll_fds_[i].fd)) {
                mark_closing(poll_fds_[i].fd);
            }
        }
        if (poll_fds_[1].revents != 0) accept_connection();
        if (poll_fds_[2].revents != 0) accept_sudo();
        if (!close_connections()) return 0;
    }
}

void agent::accept_connection() {
    ucred peer{};
    const int fd = accept_with_peer(listen_fd_, peer);
    if (fd < 0) return;
    // Only processes outside this sandbox may attach: a peer in this pid namespace (or one
    // below it) has a pid here. The socket itself is reachable only through the host's 0700
    // state directory.
    const bool outside = peer.pid == 0;
    const auto attached = std::count_if(connections_.begin(), connections_.end(),
                                        [](const connection& c) { return !c.sudo; });
    if (!outside || static_cast<std::size_t>(attached) >= max_connections) {
        ::close(fd);
        return;
    }
    connections_.push_back({fd, false});
    send_ready(fd);
}

bool agent::close_connections() {
    bool owner_gone = false;
    for (std::size_t i = connections_.size(); i-- > 0;) {
        const connection c = connections_[i];
        if (!c.closing) continue;
        // What a connection started dies with it: nobody is left to read its result. A
        // resident is the sandbox's, not the connection's: it runs on, reported to nobody.
        for (auto& running : commands_) {
            std::erase_if(running.attached, [&c](const auto& a) { return a.first == c.fd; });
            if (running.connection != c.fd) continue;
            if (!running.resident) signal_command(running.pid, SIGKILL);
            running.connection = -1;
        }
        ::close(c.fd);
        connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(i));
        owner_gone = owner_gone || c.owner;
    }
    return !owner_gone || survive_owner_;
}

void agent::handle_set_paused(int fd, const wire::set_paused_message& m) {
    const std::uint64_t now = now_us();
    if (m.paused != 0 && paused_since_us_ == 0) paused_since_us_ = now;
    if (m.paused == 0 && paused_since_us_ != 0) {
        // The wall limits count the time the commands ran, not the time they were frozen.
        for (auto& c : commands_) {
            if (c.deadline_us != 0) c.deadline_us += now - paused_since_us_;
        }
        paused_since_us_ = 0;
    }
    ttl_deadline_us_ = m.ttl_ms == 0 ? 0 : now + m.ttl_ms * 1000;
    auto reply = wire::make_message<wire::paused_set_message>(wire::message_type::paused_set);
    reply.request_id = m.request_id;
    send(fd, reply);
}

int agent::poll_timeout_ms() const {
    std::uint64_t next = ttl_deadline_us_;
    for (const auto& c : connections_) {
        const std::uint64_t d = c.request_deadline_us;
        if (d != 0 && (next == 0 || d < next)) next = d;
    }
    for (const auto& c : commands_) {
        if (paused_since_us_ != 0) break;
        if (c.deadline_us != 0 && !c.timed_out && (next == 0 || c.deadline_us < next)) {
            next = c.deadline_us;
        }
    }
    int drain = -1;
    if (!draining_cgroups_.empty()) drain = drain_poll_ms;
    if (next == 0) return drain;
    const std::uint64_t now = now_us();
    if (next <= now) return 0;
    const std::uint64_t ms = (next - now + 999) / 1000;
    const int until = ms > 3'600'000 ? 3'600'000 : static_cast<int>(ms);
    return drain >= 0 && drain < until ? drain : until;
}

void agent::enforce_deadlines() {
    if (paused_since_us_ != 0) return;  // frozen commands use none of their wall time
    const std::uint64_t now = now_us();
    // A sudo request that did not arrive in time: the connection goes (sudo_request_ms).
    for (auto& c : connections_) {
        if (c.request_deadline_us != 0 && now >= c.request_deadline_us) {
            c.closing = true;
            c.request_deadline_us = 0;
        }
    }
    for (auto& c : commands_) {
        if (c.deadline_us != 0 && !c.timed_out && now >= c.deadline_us) {
            signal_command(c.pid, SIGKILL);
            c.timed_out = true;
        }
    }
}

bool agent::handle_control(int fd) {
    int fds[wire::max_fds_per_message];
    std::size_t fd_count = 0;
    bool descriptors_lost = false;
    const ssize_t n =
        wire::receive_record(fd, buffer_, fds, fd_count, descriptors_lost, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EINTR || errno == EMSGSIZE;
    const std::span<const std::byte> record(buffer_.data(), static_cast<std::size_t>(n));
    wire::header h{};
    connection* from = find_connection(fd);
    if (from != nullptr && from->sudo) {
        // A sudo connection may send its one exec and kills for it, nothing else.
        wire::kill_message kill{};
        if (wire::read_header(record, h) &&
            h.type == static_cast<std::uint32_t>(wire::message_type::exec)) {
            handle_sudo_exec(*from, record, std::span(fds, fd_count));
            return true;
        }
        if (wire::read_fixed(record, wire::message_type::kill, kill)) handle_kill(fd, kill);
        for (std::size_t i = 0; i < fd_count; ++i) ::close(fds[i]);
        return true;
    }
    if (wire::read_header(record, h)) {
        if (h.type == static_cast<std::uint32_t>(wire::message_type::exec)) {
            handle_exec(fd, record, std::span(fds, fd_count), descriptors_lost);
            return true;
        }
        if (h.type == static_cast<std::uint32_t>(wire::message_type::watch_dir)) {
            handle_watch_dir(fd, record, std::span(fds, fd_count), descriptors_lost);
            return true;
        }
        wire::kill_message kill{};
        if (wire::read_fixed(record, wire::message_type::kill, kill)) handle_kill(fd, kill);
        wire::connect_port_message connect{};
        if (wire::read_fixed(record, wire::message_type::connect_port, connect)) {
            handle_connect_port(fd, connect);
        }
        wire::connect_unix_message connect_unix{};
        if (wire::read_fixed(record, wire::message_type::connect_unix, connect_unix)) {
            handle_connect_unix(fd, connect_unix);
        }
        wire::pty_attach_message attach{};
        if (wire::read_fixed(record, wire::message_type::pty_attach, attach)) {
            handle_pty_attach(fd, attach);
        }
        wire::set_paused_message set_paused{};
        if (wire::read_fixed(record, wire::message_type::set_paused, set_paused)) {
            handle_set_paused(fd, set_paused);
        }
        wire::set_ttl_message set_ttl{};
        if (wire::read_fixed(record, wire::message_type::set_ttl, set_ttl)) {
            ttl_deadline_us_ = set_ttl.ttl_ms == 0 ? 0 : now_us() + set_ttl.ttl_ms * 1000;
            auto reply = wire::make_message<wire::ttl_set_message>(wire::message_type::ttl_set);
            reply.request_id = set_ttl.request_id;
            send(fd, reply);
        }
    }
    for (std::size_t i = 0; i < fd_count; ++i) ::close(fds[i]);
    return true;
}

// Connects without waiting: on loopback the handshake completes within connect() unless the
// listener's backlog is full, and then the socket goes out still connecting (the library waits
// for it), so a server in the sandbox cannot stall pid 1.
void agent::handle_connect_port(int fd, const wire::connect_port_message& m) {
    auto reply =
        wire::make_message<wire::port_connected_message>(wire::message_type::port_connected);
    reply.request_id = m.request_id;
    int sock = -1;
    if (m.port == 0 || m.port > 65535 || (m.family != 4 && m.family != 6)) {
        reply.connect_errno = EINVAL;
    } else if (m.port == egress_port_) {
        // The egress endpoint is moat's own: a route to it from outside would make the
        // sandbox's proxy an open proxy for whoever holds the route.
        reply.connect_errno = EPERM;
    } else {
        sock = ::socket(m.family == 4 ? AF_INET : AF_INET6,
                        SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (sock < 0) reply.connect_errno = errno;
    }
    if (sock >= 0) {
        int rc = -1;
        if (m.family == 4) {
            sockaddr_in address{};
            address.sin_family = AF_INET;
            address.sin_port = htons(static_cast<std::uint16_t>(m.port));
            address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            rc = ::connect(sock, reinterpret_cast<const sockaddr*>(&address), sizeof address);
        } else {
            sockaddr_in6 address{};
            address.sin6_family = AF_INET6;
            address.sin6_port = htons(static_cast<std::uint16_t>(m.port));
            address.sin6_addr = in6addr_loopback;
            rc = ::connect(sock, reinterpret_cast<const sockaddr*>(&address), sizeof address);
        }
        if (rc != 0 && errno == EINPROGRESS) {
            reply.flags |= wire::port_connect_in_progress;
        } else if (rc != 0) {
            reply.connect_errno = errno;
            ::close(sock);
            sock = -1;
        }
    }
    send_attached(fd, std::as_bytes(std::span(&reply, 1)), sock);
}

// A unix connect never waits: with the listener's backlog full a non-blocking one fails with
// EAGAIN, which goes back like any other errno.
void agent::handle_connect_unix(int fd, const wire::connect_unix_message& m) {
    static_assert(sizeof(sockaddr_un::sun_path) == wire::unix_path_bytes);
    auto reply =
        wire::make_message<wire::port_connected_message>(wire::message_type::port_connected);
    reply.request_id = m.request_id;
    const std::string_view path = wire::read_field(m.path);
    int sock = -1;
    if (path.size() >= sizeof m.path || wire::unix_path_problem(path) != nullptr) {
        reply.connect_errno = EINVAL;
    } else {
        sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (sock < 0) reply.connect_errno = errno;
    }
    if (sock >= 0) {
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        std::memcpy(address.sun_path, path.data(), path.size());
        const auto length =
            static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
        if (::connect(sock, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
            reply.connect_errno = errno;
            ::close(sock);
            sock = -1;
        }
    }
    send_attached(fd, std::as_bytes(std::span(&reply, 1)), sock);
}

void agent::send_attached(int fd, std::span<const std::byte> record, int descriptor) {
    const int attached[1] = {descriptor};
    std::span<const int> fds;
    if (descriptor >= 0) fds = attached;
    if (wire::send_record(fd, record, fds, MSG_DONTWAIT) < 0) mark_closing(fd);
    if (descriptor >= 0) ::close(descriptor);
}

void agent::handle_kill(int fd, const wire::kill_message& m) {
    if (m.signal < 0 || m.signal >= NSIG) return;
    // Exec ids are chosen by each connection: a connection signals only its own commands and the
    // terminals it attached to.
    for (const auto& c : commands_) {
        bool attached = false;
        for (const auto& [peer, id] : c.attached) {
            attached = attached || (peer == fd && id == m.exec_id);
        }
        if ((c.exec_id == m.exec_id && c.connection == fd) || attached) {
            signal_command(c.pid, m.signal);
        }
    }
}

int run_agent(std::uint64_t ttl_ms, std::uint32_t max_processes, std::uint32_t open_files,
              bool survive_owner, std::uint16_t egress_port, bool allow_sudo) {
    agent a(ttl_ms, max_processes, open_files, survive_owner, egress_port, allow_sudo);
    const int code = a.run();
    a.thaw_commands();
    return code;
}

}  // namespace moat::sandboxd
