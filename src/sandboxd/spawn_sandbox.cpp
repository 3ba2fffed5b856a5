// The parent's side of a create (the contract is spawn_sandbox.hpp): the clone stack, the plan of
// the layout the child makes, clone as the sandbox's own uid (into its v2 cgroup where it can),
// the uid/gid maps and OOM score written while the child waits, then the wait for its exec and
// the report of the step that failed. What the child runs is sandbox_child.cpp.
#include "sandboxd/spawn_sandbox.hpp"

#include <fcntl.h>
#include <linux/mount.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/fsuid.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <string_view>
#include <vector>

#include "core/idmapped_mount.hpp"
#include "sandboxd/raw_syscall.hpp"
#include "sandboxd/sandbox_child.hpp"
#include "sandboxd/template_root.hpp"
#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"

namespace moat::sandboxd {
namespace {

constexpr std::size_t stack_bytes = 128 * 1024;
constexpr std::size_t guard_bytes = 4096;
constexpr int exec_timeout_ms = 10'000;  // a child that never reaches exec is killed

// The cgroup namespace is unshared by the child once the parent has attached it, so that its
// root is the sandbox's own cgroup rather than the helper's.
constexpr int clone_flags = CLONE_VM | CLONE_PIDFD | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS |
                            CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;

const char* errno_name(int err) {
    const char* name = ::strerrorname_np(err);
    return name != nullptr ? name : "E?";
}

void format_options(char* out, std::size_t size, std::uint64_t bytes, const char* rest) {
    if (bytes == 0) {
        std::snprintf(out, size, "%s", rest);
    } else {
        std::snprintf(out, size, "size=%llu,%s", static_cast<unsigned long long>(bytes), rest);
    }
}

int write_proc_file(pid_t pid, const char* file, const char* text) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
    const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    const auto length = static_cast<ssize_t>(std::strlen(text));
    const int err = ::write(fd, text, static_cast<std::size_t>(length)) == length ? 0 : errno;
    ::close(fd);
    return err;
}

// Parent-side setup while the child waits for the release byte.
int prepare_child(pid_t pid, const uid_slot& slot, std::string& detail) {
    char map[64];
    std::snprintf(map, sizeof map, "0 %u %u\n", slot.uid_base, wire::uid_range_size);
    for (const char* file : {"uid_map", "gid_map"}) {
        if (const int err = write_proc_file(pid, file, map)) {
            detail = std::string("write ") + file + ": " + errno_name(err);
            return err;
        }
    }
    // Sandbox processes are the host OOM killer's preferred victims, never protected from it:
    // raising the score is always allowed, and where the helper holds CAP_SYS_RESOURCE the write
    // also raises the floor (oom_score_adj_min) that every command inherits, so code inside can
    // never lower its score again. (Lowering pid 1's score instead would hand that floor to
    // hostile code.) Inside the sandbox's own cgroup the largest process, never the tiny agent,
    // is the one killed.
    if (const int err = write_proc_file(pid, "oom_score_adj", "500")) {
        detail = std::string("write oom_score_adj: ") + errno_name(err);
        return err;
    }
    return 0;
}

// Host root's part of a template sandbox, once the child's maps are written: the layer cloned as
// a detached mount, made read-only, nosuid, nodev and idmapped onto the child's user namespace
// (the layer stores ids as the sandbox sees them), and sent to the child on `socket`.
int send_layer(pid_t pid, std::string_view layer, int socket, moat::errc& code,
               std::string& detail) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/ns/user", pid);
    const int userns = ::open(path, O_RDONLY | O_CLOEXEC);
    if (userns < 0) {
        const int err = errno;
        detail = std::string("open the sandbox's user namespace: ") + errno_name(err);
        return err;
    }
    const std::string layer_path(layer);
    const char* step = "";
    const int tree = moat::idmapped::open_tree(
        layer_path.c_str(), userns, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, step);
    int err = tree < 0 ? errno : 0;
    if (err != 0) {
        if (err == ENOSYS || std::string_view(step) != "open_tree")
            code = moat::errc::layer_unavailable;
        detail = std::string(step) + " of the template layer " + layer_path + ": " +
                 errno_name(err) +
                 " (templates need idmapped mounts: Linux 5.12 or later, on a data directory "
                 "whose file system supports them)";
    }
    if (err == 0) {
        const std::byte marker{0};
        const int fds[1] = {tree};
        if (wire::send_record(socket, std::span(&marker, 1), fds, 0) != 1) {
            err = errno;
            detail = std::string("send the template layer: ") + errno_name(err);
        }
    }
    if (tree >= 0) ::close(tree);
    ::close(userns);
    return err;
}

// Field 22 of /proc/<pid>/stat, counted after the parenthesised command name.
std::uint64_t read_start_time(pid_t pid) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char text[1024];
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n <= 0) return 0;
    text[n] = '\0';
    const char* p = std::strrchr(text, ')');
    if (p == nullptr) return 0;
    for (int field = 2; field < 22 && p != nullptr; ++field) p = std::strchr(p + 1, ' ');
    std::uint64_t ticks = 0;
    if (p != nullptr) std::from_chars(p + 1, text + n, ticks);
    return ticks;
}

// Waits until the child has exec'd or exited (every copy of the exec pipe's write end closed).
bool wait_for_exec(int exec_pipe_read) {
    pollfd p{exec_pipe_read, POLLIN, 0};
    for (;;) {
        const int ready = ::poll(&p, 1, exec_timeout_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) return false;
        char buffer[16];
        const ssize_t n = ::read(exec_pipe_read, buffer, sizeof buffer);
        if (n == 0) return true;
        if (n < 0 && errno != EINTR && errno != EAGAIN) return false;
    }
}

void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
}

}  // namespace

sandbox_spawner::~sandbox_spawner() {
    if (stack_ != nullptr) ::munmap(stack_, stack_bytes + guard_bytes);
}

int sandbox_spawner::init(std::string template_path, const std::vector<std::string>& template_bound,
                          std::vector<sock_filter> filter, int agent_exe_fd, std::string& detail) {
    template_path_ = std::move(template_path);
    for (const auto& path : template_bound) {
        base_binds_.append(path).push_back('\0');
        ++base_bind_count_;
    }
    std::string step;
    if (const int err = moat::idmapped::probe(template_path_.c_str(), step)) {
        writable_base_detail_ = step + ": " + errno_name(err);
    } else {
        writable_base_ = true;
    }
    python_envs_.init_base();
    filter_ = std::move(filter);
    agent_exe_fd_ = agent_exe_fd;
    stack_ = ::mmap(nullptr, stack_bytes + guard_bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack_ == MAP_FAILED) {
        stack_ = nullptr;
        detail = "mmap clone stack";
        return errno;
    }
    ::mprotect(stack_, guard_bytes, PROT_NONE);
    return 0;
}

namespace {

// `path` is `tree` or lies under it.
bool is_within(std::string_view path, std::string_view tree) {
    return path == tree ||
           (path.size() > tree.size() && path.starts_with(tree) && path[tree.size()] == '/');
}

// Fills the layout part of `a` (see child_args) from the request: false with `detail` for a
// layout the child cannot make (the library validates first; this only keeps the child's writes
// inside /tmp and /home and its buffers).
bool plan_layout(const spawn_request& request, child_args& a, std::string& detail) {
    const std::string_view user =
        request.user_name.empty() ? template_user_name : request.user_name;
    const std::string_view home = request.home.empty() ? "/workspace" : request.home;
    const std::string_view workdir = request.workdir.empty() ? "/workspace" : request.workdir;
    const std::string_view artifacts =
        request.artifacts_dir.empty() ? "/workspace/out" : request.artifacts_dir;
    for (const std::string_view path : {home, workdir, artifacts}) {
        const std::string slashed = std::string(path) + "/";
        if (!path.starts_with('/') || slashed.find("/../") != std::string::npos ||
            slashed.find("/./") != std::string::npos || slashed.find("//") != std::string::npos) {
            detail = "layout: '" + std::string(path) + "' is not a normal absolute path";
            return false;
        }
    }
    if (user != template_user_name || home != "/workspace") {
        const std::string passwd = passwd_for(user, home);
        const std::string group = group_for(user);
        if (user.find_first_of(":\n") != std::string_view::npos ||
            home.find_first_of(":\n") != std::string_view::npos ||
            passwd.size() > sizeof a.passwd_text || group.size() > sizeof a.group_text) {
            detail = "layout: user or home does not fit /etc/passwd";
            return false;
        }
        a.has_layout_etc = true;
        std::memcpy(a.passwd_text, passwd.data(), passwd.size());
        std::memcpy(a.group_text, group.data(), group.size());
        a.passwd_length = passwd.size();
        a.group_length = group.size();
    }
    // Directories below /tmp and /home, parents first, each once; /workspace starts empty.
    std::size_t used = 0;
    std::vector<std::string_view> made;
    for (const std::string_view path : {home, workdir, artifacts}) {
        std::string_view tree;
        for (const std::string_view t : {"/tmp", "/home"}) {
            if (is_within(path, t)) tree = t;
        }
        if (tree.empty()) continue;
        if (tree == "/home") a.mount_home = true;
        for (std::size_t end = tree.size(); end < path.size();) {
            end = std::min(path.find('/', end + 1), path.size());
            const std::string_view dir = path.substr(0, end);
            if (std::find(made.begin(), made.end(), dir) != made.end()) continue;
            if (used + dir.size() > sizeof a.layout_dirs) {
                detail = "layout: too many directories to make";
                return false;
            }
            // Relative to the template root: without the leading '/'.
            std::memcpy(a.layout_dirs + used, dir.data() + 1, dir.size() - 1);
            used += dir.size();
            a.layout_dirs[used - 1] = '\0';
            made.push_back(dir);
            ++a.layout_dir_count;
        }
    }
    return true;
}

}  // namespace

bool sandbox_spawner::spawn(const spawn_request& request, const uid_slot& slot,
                            const cgroups& hierarchy, sandbox_cgroups& group, spawned_sandbox& out,
                            spawn_failure& failure) {
    auto fail = [&failure](moat::errc code, int err, std::string detail) {
        // Out of descriptors or processes is a capacity limit the caller can wait out.
        const bool exhausted = err == EMFILE || err == ENFILE || err == EAGAIN || err == ENOMEM;
        failure.code = exhausted ? moat::errc::limit_exceeded : code;
        failure.sys_errno = err;
        failure.detail = std::move(detail);
        return false;
    };
    child_args args{};
    if (std::string detail; !plan_layout(request, args, detail)) {
        return fail(moat::errc::invalid_argument, 0, std::move(detail));
    }
    // The sandbox's Python environment: the base root's, or its template's (made once each).
    args.python = python_envs_.base();
    if (!request.template_layer.empty()) {
        bool valid = true;
        args.python = python_envs_.for_template(request.template_python, valid);
        if (!valid)
            return fail(moat::errc::invalid_argument, 0,
                        "template python " + std::string(request.template_python) +
                            " is not an absolute path to a python3.N");
    }
    int sockets[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0) {
        return fail(moat::errc::backend_failure, errno,
                    std::string("socketpair: ") + errno_name(errno));
    }
    int release[2];
    int exec_pipe[2];
    if (::pipe2(release, O_CLOEXEC) != 0) {
        const int err = errno;
        ::close(sockets[0]);
        ::close(sockets[1]);
        return fail(moat::errc::backend_failure, err, std::string("pipe2: ") + errno_name(err));
    }
    if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
        const int err = errno;
        for (int fd : {sockets[0], sockets[1], release[0], release[1]}) ::close(fd);
        return fail(moat::errc::backend_failure, err, std::string("pipe2: ") + errno_name(err));
    }
    int library_socket = sockets[0];
    int agent_socket = sockets[1];
    int release_read = release[0];
    int release_write = release[1];
    int exec_read = exec_pipe[0];
    int exec_write = exec_pipe[1];

    args.release_read = release_read;
    args.release_write = release_write;
    args.exec_pipe_write = exec_write;
    args.control = agent_socket;
    args.slot_lock = slot.lock_fd;
    args.agent_exe = agent_exe_fd_;
    args.listen_socket = request.listen_socket;
    // A template sandbox's layer, or for a sandbox of no template the template root (a writable
    // root over it), goes to the child on a socket of its own once its maps exist.
    const bool base_overlay = request.template_layer.empty() && writable_base_;
    const std::string_view layer = base_overlay ? template_path_ : request.template_layer;
    args.layer_is_base = base_overlay;
    // A template's layer is locked shared for the sandbox's life (its pid 1 keeps the lock at fd
    // 10): `moat template rm`, from any process, deletes it only under an exclusive lock.
    int layer_lock = -1;
    if (!request.template_layer.empty()) {
        const std::string lock_path =
            std::string(request.template_layer).append(wire::layer_lock_suffix);
        layer_lock = ::open(lock_path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (layer_lock < 0 || ::flock(layer_lock, LOCK_SH | LOCK_NB) != 0) {
            const int err = errno;
            close_fd(layer_lock);
            for (int fd : {library_socket, agent_socket, release_read, release_write, exec_read,
                           exec_write}) {
                ::close(fd);
            }
            return fail(
                err == EWOULDBLOCK ? moat::errc::invalid_argument : moat::errc::layer_unavailable,
                err,
                err == EWOULDBLOCK
                    ? std::string("the template is being removed")
                    : "lock the template layer " + lock_path + ": " + errno_name(err));
        }
    }
    args.layer_lock = layer_lock;
    args.base_binds = base_binds_.data();
    args.base_bind_count = base_overlay ? base_bind_count_ : 0;
    int layer_parent = -1;
    args.layer_socket = -1;
    if (!layer.empty()) {
        int layer_pair[2];
        if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, layer_pair) != 0) {
            const int err = errno;
            close_fd(layer_lock);
            for (int fd : {library_socket, agent_socket, release_read, release_write, exec_read,
                           exec_write}) {
                ::close(fd);
            }
            return fail(moat::errc::backend_failure, err,
                        std::string("socketpair: ") + errno_name(err));
        }
        layer_parent = layer_pair[0];
        args.layer_socket = layer_pair[1];
        format_options(args.layer_options, sizeof args.layer_options, request.workspace_bytes,
                       "mode=0755");
    }
    args.survive_owner = request.survive_owner;
    args.template_path = template_path_.c_str();
    format_options(args.tmp_options, sizeof args.tmp_options, request.tmp_bytes, "mode=1777");
    char workspace_rest[48];
    std::snprintf(workspace_rest, sizeof workspace_rest, "mode=0755,uid=%u,gid=%u",
                  wire::sandbox_user_id, wire::sandbox_group_id);
    format_options(args.workspace_options, sizeof args.workspace_options, request.workspace_bytes,
                   workspace_rest);
    // /home is a second tmpfs of /workspace's size, charged to the same memory cgroup.
    format_options(args.home_options, sizeof args.home_options, request.workspace_bytes,
                   "mode=0755");
    format_options(args.root_options, sizeof args.root_options, request.workspace_bytes,
                   "mode=0755,uid=0,gid=0");
    args.filter.len = static_cast<unsigned short>(filter_.size());
    args.filter.filter = filter_.data();
    std::snprintf(args.ttl_text, sizeof args.ttl_text, "%llu",
                  static_cast<unsigned long long>(request.ttl_ms));
    std::snprintf(args.max_processes_text, sizeof args.max_processes_text, "%u",
                  request.max_processes);
    args.argv[0] = "moat-sandboxd";
    args.argv[1] = "agent";
    args.argv[2] = "--ttl-ms";
    args.argv[3] = args.ttl_text;
    args.argv[4] = "--max-processes";
    args.argv[5] = args.max_processes_text;
    std::snprintf(args.open_files_text, sizeof args.open_files_text, "%u", request.open_files);
    args.argv[6] = "--open-files";
    args.argv[7] = args.open_files_text;
    std::size_t next_arg = 8;
    if (request.survive_owner) args.argv[next_arg++] = "--survive-owner";
    if (request.allow_sudo) args.argv[next_arg++] = "--allow-sudo";
    if (request.egress_port != 0) {
        std::snprintf(args.egress_port_text, sizeof args.egress_port_text, "%u",
                      static_cast<unsigned>(request.egress_port));
        args.argv[next_arg++] = "--egress-port";
        args.argv[next_arg++] = args.egress_port_text;
    }
    args.argv[next_arg] = nullptr;
    args.envp[0] = "PATH=/usr/bin:/bin";
    args.envp[1] = nullptr;

    cgroup_join_fds attach_fds;
    {
        std::string attach_detail;
        if (const int err =
                hierarchy.open_join(group, attach_fds, request.best_effort, attach_detail)) {
            for (int fd : {library_socket, agent_socket, release_read, release_write, exec_read,
                           exec_write, layer_parent, args.layer_socket, layer_lock}) {
                if (fd >= 0) ::close(fd);
            }
            return fail(moat::errc::layer_unavailable, err, std::move(attach_detail));
        }
    }
    std::copy(attach_fds.init.begin(), attach_fds.init.end(), args.attach_fds);
    args.unified_before_namespace = attach_fds.unified_before_namespace;
    args.unified_after_namespace = attach_fds.unified_after_namespace;
    args.command_cgroup = attach_fds.commands_dir;
    args.command_cgroup_kill = attach_fds.commands_kill;
    args.freezer_commands = attach_fds.freezer_commands;
    args.freezer_state = attach_fds.freezer_state;
    const auto close_attach_fds = [&attach_fds] { attach_fds.close_all(); };

    int pidfd = -1;
    char* stack_top = static_cast<char*>(stack_) + guard_bytes + stack_bytes;
    // The new user namespace is owned by the creator's effective uid, and the kernel charges its
    // per-user counts (inotify instances and watches, nested namespaces, ...) to that owner. So
    // clone as the sandbox's own unprivileged host uid, not as root: a sandbox can exhaust only
    // its own quotas, never root's or another sandbox's. Raw calls: this process is
    // single-threaded and glibc's set*id would broadcast to threads.
    pid_t pid = -1;
    int clone_errno = 0;
    if (::syscall(SYS_setresgid, -1, slot.uid_base, -1) == 0 &&
        ::syscall(SYS_setresuid, -1, slot.uid_base, -1) == 0) {
        if (attach_fds.unified_dir >= 0) {
            // Straight into its v2 cgroup: a write to cgroup.procs would wait for an RCU grace
            // period on a global lock (milliseconds, and creates queue behind each other). The
            // kernel checks the move against the file system uid, which goes back to root for it
            // (the namespace's owner is the effective uid, which stays the sandbox's).
            (void)::setfsuid(0);
            (void)::setfsgid(0);
            clone_args ca{};
            ca.flags = static_cast<std::uint64_t>(clone_flags & ~0xff) | CLONE_INTO_CGROUP;
            ca.exit_signal = SIGCHLD;
            ca.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
            ca.stack = reinterpret_cast<std::uint64_t>(static_cast<char*>(stack_) + guard_bytes);
            ca.stack_size = stack_bytes;
            ca.cgroup = static_cast<std::uint64_t>(attach_fds.unified_dir);
            const int saved_join = args.unified_before_namespace;
            args.unified_before_namespace = -1;
            const long made = clone3_run(&ca, child_main, &args);
            if (made > 0) {
                pid = static_cast<pid_t>(made);
            } else {
                args.unified_before_namespace = saved_join;  // no child: it joins by writing
                clone_errno = static_cast<int>(-made);
            }
            (void)::setfsuid(slot.uid_base);
            (void)::setfsgid(slot.uid_base);
        }
        if (pid < 0) {
            pid = ::clone(child_main, stack_top, clone_flags, &args, &pidfd);
            clone_errno = errno;
        }
    }
    if (pid < 0 && clone_errno == 0) clone_errno = errno;
    // Back to euid 0, which restores the effective capabilities from the permitted set.
    if (::syscall(SYS_setresuid, -1, 0, -1) != 0 || ::syscall(SYS_setresgid, -1, 0, -1) != 0) {
        ::abort();  // a helper that cannot become root again must not go on
    }
    close_attach_fds();  // the child has its own copies
    errno = clone_errno;
    ::close(exec_write);
    ::close(release_read);
    // The child's copy of its layer socket stays; ours goes (args itself is the child's now:
    // never written after clone).
    if (args.layer_socket >= 0) ::close(args.layer_socket);
    close_fd(layer_lock);  // the child's copy holds the lock
    if (pid < 0) {
        const int err = errno;
        close_fd(layer_parent);
        for (int fd : {library_socket, agent_socket, release_write, exec_read}) ::close(fd);
        return fail(moat::errc::backend_failure, err, std::string("clone: ") + errno_name(err));
    }

    moat::errc code = moat::errc::backend_failure;
    std::string detail;
    int err = prepare_child(pid, slot, detail);
    if (err == 0 && layer_parent >= 0) err = send_layer(pid, layer, layer_parent, code, detail);
    close_fd(layer_parent);
    if (err == 0 && ::write(release_write, "x", 1) != 1) {
        err = errno;
        detail = std::string("release child: ") + errno_name(err);
    }
    if (err != 0) {
        ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
    }
    const bool reached_end = wait_for_exec(exec_read);
    close_fd(release_write);
    close_fd(exec_read);
    close_fd(agent_socket);
    if (err == 0 && !reached_end) {
        err = ETIMEDOUT;
        detail = "child did not reach exec";
        ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
    }
    const int failed_step = __atomic_load_n(&args.failed_step, __ATOMIC_ACQUIRE);
    if (err == 0 && failed_step != 0) {
        err = args.failed_errno;
        detail = std::string(step_name(failed_step)) + ": " + errno_name(err);
    }
    // pid 1 runs the agent and has left the sandbox's top v2 cgroup: now its children may get
    // controllers, and `commands` goes to the sandbox's root (per-command cgroups).
    if (err == 0) {
        err = hierarchy.delegate(group, slot.uid_base, detail);
        if (err != 0) {
            code = moat::errc::layer_unavailable;
            ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
        }
    }
    if (err != 0) {
        // The child is dead or dying: reap it before the stack can be reused.
        siginfo_t info{};
        while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED) !=
                   0 &&
               errno == EINTR) {
        }
        ::close(pidfd);
        ::close(library_socket);
        return fail(code, err, std::move(detail));
    }
    out.pidfd = pidfd;
    out.library_socket = library_socket;
    out.host_pid = pid;
    out.start_time_ticks = read_start_time(pid);
    return true;
}

}  // namespace moat::sandboxd
