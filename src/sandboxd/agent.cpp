#include "sandboxd/agent.hpp"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "sandboxd/raw_syscall.hpp"
#include "sandboxd/seccomp_filter.hpp"
#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"

namespace moat::sandboxd {
namespace {

constexpr int control_fd = 3;
constexpr int listen_fd = 7;                  // survivors only: the attach socket the helper bound
constexpr int command_cgroup_fd = 8;          // the commands' cgroup directory (v2), if present
constexpr int command_cgroup_kill_fd = 9;     // cgroup v2: the commands' cgroup.kill, if present
constexpr std::size_t max_connections = 32;   // the owner's plus attached processes
constexpr std::size_t idle_cgroups_kept = 4;  // empty per-command cgroups kept for reuse
// A per-command cgroup still populated this long after its kill is not reused (a process stuck
// in the kernel); the helper removes it with the sandbox.
constexpr std::uint64_t drain_give_up_us = 10'000'000;
constexpr int drain_poll_ms = 20;  // how often a killed cgroup is looked at while it empties

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

// What a command child reads. With clone3_run the child shares pid 1's memory (CLONE_VM) but pid 1
// does not wait for it (no CLONE_VFORK): nothing the child meets before exec (sandbox code can
// SIGSTOP it once it has the sandbox's uid) can stall pid 1, and pid 1 copies no page tables and
// takes no copy-on-write faults afterwards. So the child makes only raw system calls (errno is
// pid 1's), writes nothing of pid 1's (not `environ`: it searches PATH itself), and reads only
// its start block: the stack it runs on, this struct and copies of the request's strings, one
// mapping pid 1 keeps until the child has exec'd or died (command::block).
struct command_args {
    int stdio[3];
    int status_pipe;  // close-on-exec write end: the errno if the child fails, EOF once it execs
    int join_procs;   // without CLONE_INTO_CGROUP: a cgroup.procs to move into first, or -1
    const char* cwd;
    char* const* argv;
    std::size_t argc;
    char* const* envp;
    const char* path;   // the value of the request's PATH, or null
    char** shell_argv;  // room for argc + 2 pointers: a script the kernel cannot run, see exec_file
};

[[noreturn]] void command_fail(const command_args& a, long result) {
    const int err = result < 0 ? static_cast<int>(-result) : EINVAL;
    raw(SYS_write, a.status_pipe, &err, sizeof err);
    raw(SYS_exit_group, 127);
    __builtin_unreachable();
}

// execve, and as execvp does for a file the kernel cannot run (ENOEXEC, a script without #!):
// the file run by /bin/sh. The result of the last execve.
long exec_file(const command_args& a, const char* file) {
    const long result = raw(SYS_execve, file, a.argv, a.envp);
    if (result != -ENOEXEC) return result;
    char** shell = a.shell_argv;
    shell[0] = const_cast<char*>("/bin/sh");
    shell[1] = const_cast<char*>(file);
    shell[2] = nullptr;
    for (std::size_t i = 1; i <= a.argc; ++i) shell[i + 1] = a.argv[i];  // argv[argc] is null
    return raw(SYS_execve, "/bin/sh", shell, a.envp);
}

// execvp(argv[0]) without libc: a name with a slash is run as it is; otherwise each PATH entry
// in turn (an empty one is the working directory; no PATH means /bin:/usr/bin) until one runs or
// fails with an error other than "not there" (ENOENT, ENOTDIR, ESTALE, ENODEV, ETIMEDOUT) or
// EACCES, which is returned if no entry ran. The result of the failed execve.
long exec_search(const command_args& a) {
    const char* file = a.argv[0];
    std::size_t file_bytes = 0;
    bool slash = false;
    while (file[file_bytes] != '\0') {
        slash = slash || file[file_bytes] == '/';
        ++file_bytes;
    }
    if (file_bytes == 0) return -ENOENT;
    if (slash) return exec_file(a, file);
    if (file_bytes > NAME_MAX) return -ENAMETOOLONG;
    const char* entry = a.path != nullptr ? a.path : "/bin:/usr/bin";
    char candidate[PATH_MAX + NAME_MAX + 2];
    long result = -ENOENT;
    bool denied = false;
    for (;;) {
        std::size_t entry_bytes = 0;
        while (entry[entry_bytes] != '\0' && entry[entry_bytes] != ':') ++entry_bytes;
        if (entry_bytes < PATH_MAX) {  // a longer entry is skipped, as execvp does
            std::size_t n = 0;
            for (; n < entry_bytes; ++n) candidate[n] = entry[n];
            if (n > 0) candidate[n++] = '/';
            for (std::size_t i = 0; i <= file_bytes; ++i) candidate[n + i] = file[i];
            result = exec_file(a, candidate);
            switch (-result) {
                case EACCES:
                    denied = true;
                    break;
                case ENOENT:
                case ESTALE:
                case ENOTDIR:
                case ENODEV:
                case ETIMEDOUT:
                    break;
                default:
                    return result;  // found, but it could not run
            }
        }
        if (entry[entry_bytes] == '\0') break;
        entry += entry_bytes + 1;
    }
    return denied ? -EACCES : result;
}

[[noreturn]] void command_main(const command_args& a) {
    long r = 0;
    if (a.join_procs >= 0 && (r = raw(SYS_write, a.join_procs, "0", 1)) != 1) command_fail(a, r);
    raw(SYS_setsid);
    for (int fd = 0; fd < 3; ++fd) {
        // dup2: a descriptor already in place stays as it is.
        r = a.stdio[fd] == fd ? raw(SYS_fcntl, fd, F_GETFD) : raw(SYS_dup3, a.stdio[fd], fd, 0);
        if (r < 0) command_fail(a, r);
    }
    // Everything above 2 closes at exec, the status pipe included.
    if ((r = raw(SYS_close_range, 3, ~0u, CLOSE_RANGE_CLOEXEC)) != 0) command_fail(a, r);
    // Limits, the bounding set and the groups were set once in pid 1 (agent::setup) and are
    // inherited; what is left here is what must differ from pid 1.
    if ((r = raw(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)) != 0)
        command_fail(a, r);
    sock_fprog no_clone3{static_cast<unsigned short>(std::size(command_filter)),
                         const_cast<sock_filter*>(command_filter)};
    if ((r = raw(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &no_clone3)) != 0) command_fail(a, r);
    // The uid in two steps, because the child shares pid 1's memory: with only the effective uid
    // changed, sandbox code can neither signal, stop nor ptrace the child (its real and saved
    // uids are still 0); then the memory is made non-dumpable (the euid change set it to the
    // host's fs.suid_dumpable, which may be 1), so that once the child has the sandbox's uid
    // entirely, /proc/<child>/mem does not open pid 1's memory to sandbox code. The second
    // change keeps the euid, so it leaves dumpability alone.
    const uid_t user = wire::sandbox_user_id;
    if ((r = raw(SYS_setresuid, -1, user, -1)) != 0) command_fail(a, r);
    if ((r = raw(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0)) != 0) command_fail(a, r);
    if ((r = raw(SYS_setresuid, user, user, user)) != 0) command_fail(a, r);
    if ((r = raw(SYS_chdir, a.cwd)) != 0) command_fail(a, r);
    const unsigned long no_signals = 0;  // the kernel's sigset_t
    raw(SYS_rt_sigprocmask, SIG_SETMASK, &no_signals, nullptr, sizeof no_signals);
    command_fail(a, exec_search(a));
}

int command_child(void* args) {
    command_main(*static_cast<const command_args*>(args));
}

// The mapping a command child runs on and reads (command_args): a guard page, the stack, then the
// arguments and the request's strings, copied out of the receive buffer pid 1 reuses.
constexpr std::size_t child_stack_bytes = 64 * 1024;

struct start_block {
    void* base = nullptr;
    std::size_t bytes = 0;
    command_args* args = nullptr;
};

// Start blocks, a few kept for reuse: most requests fit the usual size, and a kept block has its
// guard and its touched pages already (no mmap, mprotect, page faults or munmap per exec).
class start_blocks {
  public:
    // Lays out a start block for `request`; false with errno set if there is no memory for it.
    bool make(const wire::exec_request_view& request, start_block& out);
    // The child that used it has exec'd or died (base is null afterwards).
    void release(void*& base, std::size_t bytes);

  private:
    static constexpr std::size_t usual_bytes = 4096 + child_stack_bytes + 64 * 1024;
    static constexpr std::size_t kept = 2;
    void* spare_[kept] = {};
    std::size_t spares_ = 0;
};

void start_blocks::release(void*& base, std::size_t bytes) {
    if (base == nullptr) return;
    if (bytes == usual_bytes && spares_ < kept) {
        spare_[spares_++] = base;
    } else {
        ::munmap(base, bytes);
    }
    base = nullptr;
}

bool start_blocks::make(const wire::exec_request_view& request, start_block& out) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t argc = request.argv.size();
    const std::size_t pointers = (argc + 1) + (argc + 2) + (request.env.size() + 1);
    std::size_t strings = request.cwd.size() + 1;
    for (auto s : request.argv) strings += s.size() + 1;
    for (auto s : request.env) strings += s.size() + 1;
    const std::size_t bytes =
        page + child_stack_bytes + sizeof(command_args) + pointers * sizeof(char*) + strings;
    const bool usual = bytes <= usual_bytes && usual_bytes % page == 0;
    const std::size_t mapped = usual ? usual_bytes : (bytes + page - 1) / page * page;
    void* base = nullptr;
    if (usual && spares_ > 0) {
        base = spare_[--spares_];
    } else {
        base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (base == MAP_FAILED) return false;
        if (::mprotect(base, page, PROT_NONE) != 0) {
            const int err = errno;
            ::munmap(base, mapped);
            errno = err;
            return false;
        }
    }
    char* at = static_cast<char*>(base) + page + child_stack_bytes;
    auto* args = new (at) command_args{};
    at += sizeof(command_args);
    auto** argv = reinterpret_cast<char**>(at);
    args->shell_argv = argv + argc + 1;
    auto** envp = args->shell_argv + argc + 2;
    char* text = reinterpret_cast<char*>(envp + request.env.size() + 1);
    const auto copy = [&text](std::string_view s) {
        char* start = text;
        std::memcpy(text, s.data(), s.size());
        text[s.size()] = '\0';
        text += s.size() + 1;
        return start;
    };
    for (std::size_t i = 0; i < argc; ++i) argv[i] = copy(request.argv[i]);
    argv[argc] = nullptr;
    for (std::size_t i = 0; i < request.env.size(); ++i) {
        envp[i] = copy(request.env[i]);
        // getenv's PATH: the first entry that names it.
        if (args->path == nullptr && request.env[i].starts_with("PATH=")) args->path = envp[i] + 5;
    }
    envp[request.env.size()] = nullptr;
    args->cwd = copy(request.cwd);
    args->argv = argv;
    args->argc = argc;
    args->envp = envp;
    out = {base, mapped, args};
    return true;
}

// The value of `key` in a cgroup's flat keyed file below `dir`, or -1.
long long read_keyed(int dir, const char* file, std::string_view key) {
    const int fd = ::openat(dir, file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char text[256];
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n <= 0) return -1;
    std::string_view rest(text, static_cast<std::size_t>(n));
    while (!rest.empty()) {
        const auto newline = rest.find('\n');
        const std::string_view line = rest.substr(0, newline);
        if (line.size() > key.size() && line.starts_with(key) && line[key.size()] == ' ') {
            long long value = -1;
            std::from_chars(line.data() + key.size() + 1, line.data() + line.size(), value);
            return value;
        }
        if (newline == std::string_view::npos) break;
        rest.remove_prefix(newline + 1);
    }
    return -1;
}

// Signals a command: its process group, or the child itself while it has not made that group
// yet (it is still on its way to exec).
void signal_command(pid_t pid, int signal) {
    if (::kill(-pid, signal) != 0 && errno == ESRCH) ::kill(pid, signal);
}

bool write_at(int dir, const char* file, const char* text) {
    const int fd = ::openat(dir, file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const std::size_t length = std::char_traits<char>::length(text);
    const bool ok = ::write(fd, text, length) == static_cast<ssize_t>(length);
    ::close(fd);
    return ok;
}

class agent {
  public:
    agent(std::uint64_t ttl_ms, std::uint32_t max_processes, std::uint32_t open_files,
          bool survive_owner, std::uint16_t egress_port)
        : survive_owner_(survive_owner),
          egress_port_(egress_port),
          max_processes_(max_processes),
          open_files_(open_files),
          ttl_deadline_us_(ttl_ms == 0 ? 0 : now_us() + ttl_ms * 1000) {}

    int run();

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
    };

    struct connection {
        int fd;
        bool owner;  // fd 3, from the helper: its end means the owner is gone
        bool closing = false;
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
    // False when the connection is gone.
    bool handle_control(int fd);
    void handle_exec(int fd, std::span<const std::byte> record, std::span<int> fds,
                     bool descriptors_lost);
    void handle_kill(int fd, const wire::kill_message& m);
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
    std::uint16_t egress_port_;  // 0: no egress endpoint
    int egress_fd_ = -1;
    std::uint32_t max_processes_;
    std::uint32_t open_files_;
    std::uint64_t ttl_deadline_us_;
    int listen_fd_ = -1;
    int command_cgroup_ = -1;           // see command_cgroup_fd
    int command_cgroup_kill_ = -1;      // see command_cgroup_kill_fd (held, never written: reap)
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
    // The commands' cgroup files (v2): kept, but never inherited by a command.
    if (::fcntl(command_cgroup_fd, F_SETFD, FD_CLOEXEC) == 0) {
        command_cgroup_ = command_cgroup_fd;
        per_command_cgroups_ = true;
        // The helper made the first exec's cgroup with the sandbox (c0).
        const int first = ::openat(command_cgroup_, "c0", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (first >= 0) idle_cgroups_.push_back({first, 0, 0});
    }
    if (::fcntl(command_cgroup_kill_fd, F_SETFD, FD_CLOEXEC) == 0)
        command_cgroup_kill_ = command_cgroup_kill_fd;
    if (survive_owner_) {
        // The helper bound this socket in its 0700 state directory; listening here makes this
        // process the one a connecting library sees in SO_PEERCRED.
        if (::fcntl(listen_fd, F_SETFD, FD_CLOEXEC) != 0) return false;
        if (::listen(listen_fd, 16) != 0) return false;
        listen_fd_ = listen_fd;
    }
    if (egress_port_ != 0 && !listen_egress()) return false;
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

int agent::run() {
    if (!setup()) return 1;
    for (;;) {
        poll_fds_.clear();
        poll_fds_.push_back({signal_fd_, POLLIN, 0});
        poll_fds_.push_back({listen_fd_, POLLIN, 0});  // a negative fd is skipped by poll
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
        if (ready <= 0) continue;
        bool any_started = false;
        for (std::size_t i = first_start; i < poll_fds_.size(); ++i) {
            any_started = any_started || poll_fds_[i].revents != 0;
        }
        if (any_started) check_starts();
        for (std::size_t i = 2; i < first_start; ++i) {
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

int agent::poll_timeout_ms() const {
    std::uint64_t next = ttl_deadline_us_;
    for (const auto& c : commands_) {
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
    const std::uint64_t now = now_us();
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
    // A copy of what the child reads, which must outlive this record until the child has exec'd.
    start_block block;
    if (!blocks_.make(request, block)) {
        const int err = errno;
        for (const int f : fds) ::close(f);
        send_exited(fd, request.exec_id, 0, wire::exited_spawn_failed, err, now_us());
        return;
    }
    const bool own_cgroup = (request.flags & wire::exec_own_cgroup) != 0;
    cgroup_slot slot;
    if (own_cgroup) slot = acquire_cgroup();
    int status[2];
    const std::uint64_t start = now_us();
    if (::pipe2(status, O_CLOEXEC | O_NONBLOCK) != 0) {
        const int err = errno;
        for (const int f : fds) ::close(f);
        if (slot.dir >= 0) idle_cgroups_.push_back(slot);
        blocks_.release(block.base, block.bytes);
        send_exited(fd, request.exec_id, 0, wire::exited_spawn_failed, err, start);
        return;
    }
    for (int i = 0; i < 3; ++i) block.args->stdio[i] = fds[static_cast<std::size_t>(i)];
    block.args->status_pipe = status[1];
    block.args->join_procs = -1;
    // Spawned processes go to the commands' cgroup (they outlive execs); an exec to its own.
    const int cgroup_dir = slot.dir >= 0 ? slot.dir : command_cgroup_;
    const pid_t pid = start_child(block, cgroup_dir);
    const int clone_errno = errno;
    ::close(status[1]);
    for (const int f : fds) ::close(f);

    if (pid < 0) {
        ::close(status[0]);
        if (slot.dir >= 0) idle_cgroups_.push_back(slot);
        blocks_.release(block.base, block.bytes);
        send_exited(fd, request.exec_id, 0, wire::exited_spawn_failed, clone_errno, start);
        return;
    }
    const std::uint64_t deadline =
        request.wall_limit_ms == 0 ? 0 : start + request.wall_limit_ms * 1000;
    // `started` follows once the child has exec'd (check_starts), never waited for here.
    command c{request.exec_id, pid, start, deadline, fd, status[0], slot};
    c.resident = (request.flags & wire::exec_resident) != 0;
    c.block = block.base;
    c.block_bytes = block.bytes;
    commands_.push_back(c);
}

void agent::check_starts() {
    for (auto& c : commands_) {
        if (c.started || c.status_pipe < 0) continue;
        int spawn_errno = 0;
        const ssize_t n = ::read(c.status_pipe, &spawn_errno, sizeof spawn_errno);
        if (n < 0) continue;  // EAGAIN: still on its way to exec
        if (n == 0) {
            // Exec'd: the program runs in its own process group from here.
            c.started = true;
            ::close(c.status_pipe);
            c.status_pipe = -1;
            blocks_.release(c.block, c.block_bytes);
            auto started = wire::make_message<wire::started_message>(wire::message_type::started);
            started.exec_id = c.exec_id;
            started.pid = c.pid;
            send(c.connection, started);
        }
        // An errno: the child exits at once (on its start block still), and reap() reports it.
        if (n == static_cast<ssize_t>(sizeof spawn_errno) && spawn_errno != 0) {
            c.spawn_errno = spawn_errno;
            ::close(c.status_pipe);
            c.status_pipe = -1;
        }
    }
}

// Starts a command child in `cgroup_dir` (if >= 0): a pid, or -1 with errno set.
pid_t agent::start_child(const start_block& block, int cgroup_dir) {
    if (clone3_usable_) {
        clone_args ca{};
        ca.exit_signal = SIGCHLD;
        if constexpr (clone3_run_available) {
            // Sharing pid 1's memory, on the block's stack; pid 1 goes on at once.
            ca.flags = CLONE_VM;
            ca.stack = reinterpret_cast<std::uint64_t>(block.base) +
                       static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
            ca.stack_size = child_stack_bytes;
        }
        const auto start = [&ca, &block]() -> long {
            if constexpr (clone3_run_available) {
                return clone3_run(&ca, command_child, block.args);
            } else {
                // A copy of pid 1 (no sequence for this architecture).
                const long pid = ::syscall(SYS_clone3, &ca, sizeof ca);
                if (pid == 0) command_main(*block.args);
                return pid < 0 ? -errno : pid;
            }
        };
        const std::uint64_t sharing = ca.flags;
        if (cgroup_dir >= 0) {
            ca.flags = sharing | CLONE_INTO_CGROUP;
            ca.cgroup = static_cast<std::uint64_t>(cgroup_dir);
        }
        long pid = start();
        if (pid < 0 && cgroup_dir >= 0 && pid != -ENOSYS && pid != -EAGAIN && pid != -ENOMEM) {
            // The cgroup refused (not delegated to pid 1, or a kernel before 5.7): commands run
            // in pid 1's cgroup from now on, and strays are killed when the sandbox is idle.
            per_command_cgroups_ = false;
            command_cgroup_ = -1;
            ca.flags = sharing;
            ca.cgroup = 0;
            pid = start();
        }
        if (pid > 0) return static_cast<pid_t>(pid);
        if (pid != -ENOSYS) {
            errno = static_cast<int>(-pid);
            return -1;
        }
        clone3_usable_ = false;  // no clone3 here: fork, and the child moves itself
    }
    command_args& moving = *block.args;
    if (cgroup_dir >= 0 && command_cgroup_ >= 0) {
        moving.join_procs = ::openat(cgroup_dir, "cgroup.procs", O_WRONLY | O_CLOEXEC);
    }
    const pid_t pid = ::fork();
    if (pid == 0) command_main(moving);
    const int fork_errno = errno;
    if (moving.join_procs >= 0) ::close(moving.join_procs);
    errno = fork_errno;
    return pid;
}

agent::cgroup_slot agent::acquire_cgroup() {
    if (!idle_cgroups_.empty()) {
        const cgroup_slot slot = idle_cgroups_.back();
        idle_cgroups_.pop_back();
        return slot;
    }
    if (!per_command_cgroups_) return {};
    cgroup_slot slot;
    slot.number = next_cgroup_++;
    char name[24];
    std::snprintf(name, sizeof name, "c%llu", static_cast<unsigned long long>(slot.number));
    if (::mkdirat(command_cgroup_, name, 0755) != 0 && errno != EEXIST) {
        // Not delegated (a hybrid host whose unified hierarchy moat may not write): every command
        // shares the commands' cgroup, and strays are killed when the sandbox is idle. Anything
        // else (a descendant limit, memory) costs this exec its own cgroup only.
        if (errno == EACCES || errno == EPERM || errno == EROFS || errno == ENOENT)
            per_command_cgroups_ = false;
        return {};
    }
    slot.dir = ::openat(command_cgroup_, name, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (slot.dir < 0) {
        (void)::unlinkat(command_cgroup_, name, AT_REMOVEDIR);
        return {};
    }
    return slot;
}

bool agent::release_cgroup(cgroup_slot slot) {
    if (read_keyed(slot.dir, "cgroup.events", "populated") == 0) {
        if (idle_cgroups_.size() < idle_cgroups_kept) {
            idle_cgroups_.push_back(slot);
        } else {
            drop_cgroup(slot);
        }
        return false;
    }
    // Whatever it started lives on: kill all of it at once, however it forked or detached.
    if (!write_at(slot.dir, "cgroup.kill", "1")) {
        // Before Linux 5.14: freeze, signal every member, thaw (a frozen cgroup cannot fork).
        (void)write_at(slot.dir, "cgroup.freeze", "1");
        kill_members(slot.dir);
        (void)write_at(slot.dir, "cgroup.freeze", "0");
    }
    slot.killed_us = now_us();
    draining_cgroups_.push_back(slot);
    return true;
}

void agent::check_draining() {
    const std::uint64_t now = now_us();
    for (std::size_t i = draining_cgroups_.size(); i-- > 0;) {
        const cgroup_slot slot = draining_cgroups_[i];
        const bool empty = read_keyed(slot.dir, "cgroup.events", "populated") == 0;
        if (!empty && now - slot.killed_us < drain_give_up_us) continue;
        draining_cgroups_.erase(draining_cgroups_.begin() + static_cast<std::ptrdiff_t>(i));
        // Never reused: a cgroup once killed through cgroup.kill kills every child cloned into
        // it afterwards (seen on Linux 6.18: its kill count no longer matches the parent's).
        if (empty) {
            drop_cgroup(slot);
        } else {
            ::close(slot.dir);  // still populated: left for the helper, which removes it
        }
    }
}

void agent::drop_cgroup(const cgroup_slot& slot) {
    char name[24];
    std::snprintf(name, sizeof name, "c%llu", static_cast<unsigned long long>(slot.number));
    (void)::unlinkat(command_cgroup_, name, AT_REMOVEDIR);
    ::close(slot.dir);
}

void agent::handle_kill(int fd, const wire::kill_message& m) {
    if (m.signal < 0 || m.signal >= NSIG) return;
    // Exec ids are chosen by each connection: a connection signals only its own commands.
    for (const auto& c : commands_) {
        if (c.exec_id == m.exec_id && c.connection == fd) signal_command(c.pid, m.signal);
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
            command c = commands_[i];
            if (c.pid != pid) continue;
            blocks_.release(c.block, c.block_bytes);
            // Background processes die with the command: its process group always, and where it
            // has a cgroup of its own, everything in it. The leader is reaped, so the group kill
            // succeeds only if something of the command was left in it (such as a child caught
            // before its setsid): that is a stray killed too.
            const bool group_left = ::kill(-c.pid, SIGKILL) == 0;
            commands_.erase(commands_.begin() + static_cast<std::ptrdiff_t>(i));
            std::uint32_t flags = c.timed_out ? std::uint32_t{wire::exited_timed_out} : 0u;
            const bool cgroup_left = c.cgroup.dir >= 0 && release_cgroup(c.cgroup);
            if (group_left || cgroup_left) flags |= wire::exited_strays_killed;
            // The child has exited, so its end of the status pipe is closed: this never blocks.
            int spawn_errno = c.spawn_errno;
            if (c.status_pipe >= 0) {
                if (::read(c.status_pipe, &spawn_errno, sizeof spawn_errno) !=
                    static_cast<ssize_t>(sizeof spawn_errno)) {
                    spawn_errno = 0;
                }
                ::close(c.status_pipe);
            }
            if (spawn_errno != 0) {
                flags = wire::exited_spawn_failed;
            } else if (!c.started) {
                // It exec'd and ended before its status pipe was read: started, then exited.
                auto started =
                    wire::make_message<wire::started_message>(wire::message_type::started);
                started.exec_id = c.exec_id;
                started.pid = c.pid;
                send(c.connection, started);
            }
            send_exited(c.connection, c.exec_id, status, flags, spawn_errno, c.start_us);
            command_ended = true;
            break;
        }
    }
    // Nothing runs in an idle sandbox: this also catches processes that escaped with setsid where
    // there are no per-command cgroups. Their exits arrive as new SIGCHLDs and are reaped on the
    // next pass.
    // (Not the commands' cgroup.kill: a cgroup once killed that way kills every child later cloned
    // into it or below it, see check_draining.)
    if (!command_ended) return;
    bool residents = false;
    bool separable = true;  // every resident has a cgroup of its own
    for (const auto& c : commands_) {
        if (!c.resident) return;
        residents = true;
        separable = separable && c.cgroup.dir >= 0;
    }
    if (!residents) {
        ::kill(-1, SIGKILL);
        return;
    }
    // Only residents run: they and what they started live in cgroups of their own below the
    // commands' one, so the strays are the commands' cgroup's own members. Without per-command
    // cgroups there is no telling a resident's processes from strays: nothing is swept then.
    if (separable && command_cgroup_ >= 0) kill_members(command_cgroup_);
}

void agent::kill_members(int cgroup_dir) {
    const int procs = ::openat(cgroup_dir, "cgroup.procs", O_RDONLY | O_CLOEXEC);
    if (procs < 0) return;
    char text[4096];
    ssize_t n;
    while ((n = ::read(procs, text, sizeof text)) > 0) {
        std::string_view rest(text, static_cast<std::size_t>(n));
        while (!rest.empty()) {
            const auto newline = rest.find('\n');
            int member = 0;
            std::from_chars(rest.data(), rest.data() + rest.size(), member);
            if (member > 1) ::kill(member, SIGKILL);
            if (newline == std::string_view::npos) break;
            rest.remove_prefix(newline + 1);
        }
    }
    ::close(procs);
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
              bool survive_owner, std::uint16_t egress_port) {
    agent a(ttl_ms, max_processes, open_files, survive_owner, egress_port);
    return a.run();
}

}  // namespace moat::sandboxd
