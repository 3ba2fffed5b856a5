#include "sandboxd/agent.hpp"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <ctime>
#include <vector>

#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"

namespace moat::sandboxd {
namespace {

constexpr int control_fd = 3;
constexpr int listen_fd = 7;                 // survivors only: the attach socket the helper bound
constexpr int command_cgroup_fd = 8;         // cgroup v2: the commands' cgroup.procs, if present
constexpr int command_cgroup_kill_fd = 9;    // cgroup v2: the commands' cgroup.kill, if present
constexpr std::size_t max_connections = 32;  // the owner's plus attached processes
constexpr std::size_t stack_bytes = 1024 * 1024;  // execvp may put a PATH-sized buffer on it
constexpr std::size_t guard_bytes = 4096;

std::uint64_t now_us() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000 +
           static_cast<std::uint64_t>(ts.tv_nsec) / 1000;
}

int read_cap_last_cap() {
    int cap = CAP_LAST_CAP;
    const int fd = ::open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cap;
    char text[16];
    const ssize_t n = ::read(fd, text, sizeof text);
    ::close(fd);
    if (n > 0) std::from_chars(text, text + n, cap);
    return cap;
}

// What the command child reads; the parent is suspended (CLONE_VFORK) while it runs.
struct command_args {
    int stdio[3];
    const char* cwd;
    char* const* argv;
    char** envp;
    int cgroup;  // the commands' cgroup.procs, or -1
    int spawn_errno;
};

[[noreturn]] void command_fail(command_args& a) {
    a.spawn_errno = errno != 0 ? errno : EINVAL;
    ::_exit(127);
}

int command_main(void* opaque) {
    auto& a = *static_cast<command_args*>(opaque);
    // Into the commands' cgroup (v2) before anything else; the descriptor carries the helper's
    // permission to move there.
    if (a.cgroup >= 0 && ::write(a.cgroup, "0", 1) != 1) command_fail(a);
    ::setsid();
    for (int fd = 0; fd < 3; ++fd) {
        if (::dup2(a.stdio[fd], fd) < 0) command_fail(a);
    }
    ::close_range(3, ~0u, 0);
    // Limits, the bounding set and the groups were set once in pid 1 (agent::setup) and are
    // inherited; what is left here is what must differ from pid 1.
    if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) command_fail(a);
    // Raw calls: glibc's set*id wrappers would try to broadcast to other threads.
    const uid_t user = wire::sandbox_user_id;
    if (::syscall(SYS_setresuid, user, user, user) != 0) command_fail(a);
    if (::chdir(a.cwd) != 0) command_fail(a);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // execvp searches the PATH of `environ`, so the request's environment must be in place.
    environ = a.envp;
    ::execvp(a.argv[0], a.argv);
    command_fail(a);
}

class agent {
  public:
    agent(std::uint64_t ttl_ms, std::uint32_t max_processes, std::uint32_t open_files,
          bool survive_owner)
        : survive_owner_(survive_owner),
          max_processes_(max_processes),
          open_files_(open_files),
          ttl_deadline_us_(ttl_ms == 0 ? 0 : now_us() + ttl_ms * 1000) {}

    int run();

  private:
    struct command {
        std::uint64_t exec_id;
        pid_t pid;
        std::uint64_t start_us;
        std::uint64_t deadline_us;  // 0 = none
        int connection;             // the control connection that started it, or -1 once gone
        bool timed_out = false;
    };

    struct connection {
        int fd;
        bool owner;  // fd 3, from the helper: its end means the owner is gone
        bool closing = false;
    };

    bool setup();
    bool limit_open_files();
    int poll_timeout_ms() const;
    void enforce_deadlines();
    void accept_connection();
    // False when the connection is gone.
    bool handle_control(int fd);
    void handle_exec(int fd, std::span<const std::byte> record, std::span<int> fds,
                     bool descriptors_lost);
    void handle_kill(int fd, const wire::kill_message& m);
    // Closes connections marked `closing`; false if the owner's went and the sandbox must end.
    bool close_connections();
    void reap();
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
    std::uint32_t max_processes_;
    std::uint32_t open_files_;
    std::uint64_t ttl_deadline_us_;
    int listen_fd_ = -1;
    int command_cgroup_ = -1;       // see command_cgroup_fd
    int command_cgroup_kill_ = -1;  // see command_cgroup_kill_fd
    int signal_fd_ = -1;
    char* stack_top_ = nullptr;
    std::vector<connection> connections_;
    std::vector<command> commands_;
    std::vector<pollfd> poll_fds_;
    std::vector<std::byte> buffer_ = std::vector<std::byte>(wire::max_message_bytes);
};

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
    // The helper ignores SIGPIPE and an ignored disposition survives exec: restore it so
    // commands start with defaults.
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (::sigprocmask(SIG_SETMASK, &chld, nullptr) != 0) return false;
    signal_fd_ = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signal_fd_ < 0) return false;
    // Empty the capability bounding set once, here: every command inherits it, so none can
    // regain a capability at exec (40-odd prctl calls per command otherwise, on the exec path).
    const int cap_last_cap = read_cap_last_cap();
    for (int cap = 0; cap <= cap_last_cap; ++cap) {
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
    void* stack = ::mmap(nullptr, stack_bytes + guard_bytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
    if (stack == MAP_FAILED) return false;
    ::mprotect(stack, guard_bytes, PROT_NONE);
    stack_top_ = static_cast<char*>(stack) + guard_bytes + stack_bytes;
    // The commands' cgroup files (v2): kept, but never inherited by a command.
    if (::fcntl(command_cgroup_fd, F_SETFD, FD_CLOEXEC) == 0) command_cgroup_ = command_cgroup_fd;
    if (::fcntl(command_cgroup_kill_fd, F_SETFD, FD_CLOEXEC) == 0)
        command_cgroup_kill_ = command_cgroup_kill_fd;
    if (survive_owner_) {
        // The helper bound this socket in its 0700 state directory; listening here makes this
        // process the one a connecting library sees in SO_PEERCRED.
        if (::fcntl(listen_fd, F_SETFD, FD_CLOEXEC) != 0) return false;
        if (::listen(listen_fd, 16) != 0) return false;
        listen_fd_ = listen_fd;
    }
    connections_.push_back({control_fd, true});
    auto ready = wire::make_message<wire::ready_message>(wire::message_type::ready);
    ready.version = wire::protocol_version;
    send(control_fd, ready);
    return true;
}

int agent::run() {
    if (!setup()) return 1;
    for (;;) {
        poll_fds_.clear();
        poll_fds_.push_back({signal_fd_, POLLIN, 0});
        poll_fds_.push_back({listen_fd_, POLLIN, 0});  // a negative fd is skipped by poll
        for (const auto& c : connections_) poll_fds_.push_back({c.fd, POLLIN, 0});
        const int ready = ::poll(poll_fds_.data(), poll_fds_.size(), poll_timeout_ms());
        if (ready < 0 && errno != EINTR) return 1;
        if (ttl_deadline_us_ != 0 && now_us() >= ttl_deadline_us_) return 0;
        // Reap first: a command that exited just as its wall limit came is not a timeout.
        if (ready > 0 && poll_fds_[0].revents != 0) reap();
        enforce_deadlines();
        if (ready <= 0) continue;
        for (std::size_t i = 2; i < poll_fds_.size(); ++i) {
            if (poll_fds_[i].revents != 0 && !handle_control(poll_fds_[i].fd)) {
                mark_closing(poll_fds_[i].fd);
            }
        }
        if (poll_fds_[1].revents != 0) accept_connection();
        if (!close_connections()) return 0;
    }
}

void agent::accept_connection() {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    // Only processes outside this sandbox may attach: a peer in this pid namespace (or one
    // below it) has a pid here. The socket itself is reachable only through the host's 0700
    // state directory.
    ucred peer{};
    socklen_t length = sizeof peer;
    const bool outside = ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 &&
                         length == sizeof peer && peer.pid == 0;
    if (!outside || connections_.size() >= max_connections) {
        ::close(fd);
        return;
    }
    connections_.push_back({fd, false});
    auto ready = wire::make_message<wire::ready_message>(wire::message_type::ready);
    ready.version = wire::protocol_version;
    send(fd, ready);
}

bool agent::close_connections() {
    bool owner_gone = false;
    for (std::size_t i = connections_.size(); i-- > 0;) {
        const connection c = connections_[i];
        if (!c.closing) continue;
        // What a connection started dies with it: nobody is left to read its result.
        for (auto& running : commands_) {
            if (running.connection != c.fd) continue;
            ::kill(-running.pid, SIGKILL);
            running.connection = -1;
        }
        ::close(c.fd);
        connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(i));
        owner_gone = owner_gone || c.owner;
    }
    return !owner_gone || survive_owner_;
}

int agent::poll_timeout_ms() const {
    std::uint64_t next = ttl_deadline_us_;
    for (const auto& c : commands_) {
        if (c.deadline_us != 0 && !c.timed_out && (next == 0 || c.deadline_us < next)) {
            next = c.deadline_us;
        }
    }
    if (next == 0) return -1;
    const std::uint64_t now = now_us();
    if (next <= now) return 0;
    const std::uint64_t ms = (next - now + 999) / 1000;
    return ms > 3'600'000 ? 3'600'000 : static_cast<int>(ms);
}

void agent::enforce_deadlines() {
    const std::uint64_t now = now_us();
    for (auto& c : commands_) {
        if (c.deadline_us != 0 && !c.timed_out && now >= c.deadline_us) {
            ::kill(-c.pid, SIGKILL);
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
    if (wire::read_header(record, h)) {
        if (h.type == static_cast<std::uint32_t>(wire::message_type::exec)) {
            handle_exec(fd, record, std::span(fds, fd_count), descriptors_lost);
            return true;
        }
        wire::kill_message kill{};
        if (wire::read_fixed(record, wire::message_type::kill, kill)) handle_kill(fd, kill);
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

void agent::handle_exec(int fd, std::span<const std::byte> record, std::span<int> fds,
                        bool descriptors_lost) {
    wire::exec_request_view request;
    const bool decoded = wire::decode_exec(record, request);
    if (!decoded || fds.size() != 3) {
        for (const int f : fds) ::close(f);
        // A request that names its command is answered, so the library never waits in vain.
        if (decoded) {
            send_exited(fd, request.exec_id, 0, wire::exited_spawn_failed,
                        descriptors_lost ? EMFILE : EBADF, now_us());
        }
        return;
    }
    // Every string in the record is NUL terminated in place.
    std::vector<char*> argv;
    argv.reserve(request.argv.size() + 1);
    for (auto s : request.argv) argv.push_back(const_cast<char*>(s.data()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    envp.reserve(request.env.size() + 1);
    for (auto s : request.env) envp.push_back(const_cast<char*>(s.data()));
    envp.push_back(nullptr);

    command_args args{
        {fds[0], fds[1], fds[2]}, request.cwd.data(), argv.data(), envp.data(), command_cgroup_, 0};
    char** const saved_environ = environ;
    const std::uint64_t start = now_us();
    const pid_t pid = ::clone(command_main, stack_top_, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
    const int clone_errno = errno;
    environ = saved_environ;
    for (const int f : fds) ::close(f);

    if (pid < 0 || args.spawn_errno != 0) {
        int status = 0;
        if (pid > 0) {
            while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
        }
        send_exited(fd, request.exec_id, status, wire::exited_spawn_failed,
                    pid < 0 ? clone_errno : args.spawn_errno, start);
        return;
    }
    const std::uint64_t deadline =
        request.wall_limit_ms == 0 ? 0 : start + request.wall_limit_ms * 1000;
    commands_.push_back({request.exec_id, pid, start, deadline, fd});
    auto started = wire::make_message<wire::started_message>(wire::message_type::started);
    started.exec_id = request.exec_id;
    started.pid = pid;
    send(fd, started);
}

void agent::handle_kill(int fd, const wire::kill_message& m) {
    if (m.signal < 0 || m.signal >= NSIG) return;
    // Exec ids are chosen by each connection: a connection signals only its own commands.
    for (const auto& c : commands_) {
        if (c.exec_id == m.exec_id && c.connection == fd) ::kill(-c.pid, m.signal);
    }
}

void agent::reap() {
    signalfd_siginfo info[8];
    while (::read(signal_fd_, info, sizeof info) > 0) {
    }
    bool command_ended = false;
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
        for (std::size_t i = 0; i < commands_.size(); ++i) {
            const command c = commands_[i];
            if (c.pid != pid) continue;
            // Background processes die with the command.
            ::kill(-c.pid, SIGKILL);
            commands_.erase(commands_.begin() + static_cast<std::ptrdiff_t>(i));
            const std::uint32_t flags = c.timed_out ? std::uint32_t{wire::exited_timed_out} : 0u;
            send_exited(c.connection, c.exec_id, status, flags, 0, c.start_us);
            command_ended = true;
            break;
        }
    }
    // Nothing runs in an idle sandbox: this also catches processes that escaped with setsid.
    // Their exits arrive as new SIGCHLDs and are reaped on the next pass. On v2 the commands'
    // cgroup.kill takes the whole command tree at once, however fast it forks.
    if (command_ended && commands_.empty()) {
        if (command_cgroup_kill_ >= 0) (void)::write(command_cgroup_kill_, "1", 1);
        ::kill(-1, SIGKILL);
    }
}

void agent::send_exited(int fd, std::uint64_t exec_id, int status, std::uint32_t flags,
                        int spawn_errno, std::uint64_t start_us) {
    auto m = wire::make_message<wire::exited_message>(wire::message_type::exited);
    m.exec_id = exec_id;
    m.wait_status = status;
    m.flags = flags;
    m.spawn_errno = spawn_errno;
    m.duration_us = now_us() - start_us;
    send(fd, m);
}

}  // namespace

int run_agent(std::uint64_t ttl_ms, std::uint32_t max_processes, std::uint32_t open_files,
              bool survive_owner) {
    agent a(ttl_ms, max_processes, open_files, survive_owner);
    return a.run();
}

}  // namespace moat::sandboxd
