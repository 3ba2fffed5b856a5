#include "sandboxd/spawn_sandbox.hpp"

#include <fcntl.h>
#include <linux/keyctl.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/fsuid.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
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

#include "sandboxd/raw_syscall.hpp"
#include "sandboxd/template_root.hpp"
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

enum class step : int {
    none,
    wait_release,
    cgroup_attach,
    cgroup_namespace,
    setgroups,
    setresgid,
    bind_template,
    chdir_template,
    setresuid,
    session_keyring,
    setsid,
    pdeathsig,
    owner_gone,
    mount_proc,
    mount_tmp,
    mount_shm,
    mount_workspace,
    layout_etc,
    mount_home,
    layout_dirs,
    pivot_root,
    umount_old_root,
    chdir_root,
    mask_proc,
    sethostname,
    loopback,
    socket_buffers,
    proc_sys_read_only,
    rlimit_core,
    arrange_fds,
    open_dev_null,
    close_range,
    no_new_privs,
    seccomp,
    execveat,
};

constexpr const char* step_names[] = {
    "none",
    "waiting for release",
    "join cgroups",
    "unshare(CLONE_NEWCGROUP)",
    "setgroups",
    "setresgid",
    "bind template root",
    "chdir template root",
    "setresuid",
    "keyctl(KEYCTL_JOIN_SESSION_KEYRING)",
    "setsid",
    "PR_SET_PDEATHSIG",
    "helper exited during create",
    "mount /proc",
    "mount /tmp",
    "mount /dev/shm",
    "mount /workspace",
    "layout: bind /etc/passwd and /etc/group",
    "mount /home",
    "layout: make directories",
    "pivot_root",
    "umount old root",
    "chdir /",
    "mask /proc entries",
    "sethostname",
    "loopback up",
    "net.ipv4.tcp_rmem / tcp_wmem",
    "read-only /proc/sys",
    "RLIMIT_CORE",
    "arrange fds",
    "open /dev/null",
    "close_range",
    "PR_SET_NO_NEW_PRIVS",
    "seccomp",
    "execveat agent",
};
static_assert(std::size(step_names) == static_cast<std::size_t>(step::execveat) + 1);

// Everything the child needs, prepared by the parent before clone; the child only reads it,
// except for the failure record, which the parent reads after the exec pipe reaches EOF.
struct child_args {
    int attach_fds[controller_count];  // v1 cgroup files pid 1 joins through, or -1
    int unified_before_namespace;      // v2 cgroup.procs pid 1 joins before / after it makes its
    int unified_after_namespace;       // cgroup namespace, or -1 (see cgroup_join_fds); the first
                                       // is -1 when pid 1 was cloned into that cgroup
    int command_cgroup;                // v2: the commands' directory (fd 8), or -1
    int command_cgroup_kill;           // v2: the commands' cgroup.kill (fd 9), or -1
    int release_read;
    int release_write;
    int exec_pipe_write;
    int control;
    int slot_lock;
    int agent_exe;
    int listen_socket;  // survivors: the attach socket, else -1
    bool survive_owner;
    const char* template_path;
    char tmp_options[64];
    char workspace_options[96];
    // The layout: /etc/passwd and /etc/group texts to bind over the template's (when
    // has_layout_etc), whether /home gets a tmpfs (home_options), and the directories to make
    // (relative to the template root, parents first), each NUL-terminated, `layout_dir_count`.
    bool has_layout_etc;
    bool mount_home;
    char home_options[96];
    char passwd_text[512];
    char group_text[128];
    std::size_t passwd_length;
    std::size_t group_length;
    char layout_dirs[4096];
    int layout_dir_count;
    sock_fprog filter;
    char ttl_text[24];
    char max_processes_text[24];
    char open_files_text[24];
    char egress_port_text[8];
    const char* argv[12];
    const char* envp[2];
    int failed_step;
    int failed_errno;
};

[[noreturn]] void child_fail(child_args& args, step failed, long result) {
    __atomic_store_n(&args.failed_errno, static_cast<int>(-result), __ATOMIC_RELAXED);
    __atomic_store_n(&args.failed_step, static_cast<int>(failed), __ATOMIC_RELEASE);
    raw(SYS_exit_group, 1);
    __builtin_unreachable();
}

// Runs `number(args...)` and records `failed` if it returns a negative errno.
template <class... Args>
long checked(child_args& a, step failed, long number, Args... args) {
    const long result = raw(number, args...);
    if (result < 0) child_fail(a, failed, result);
    return result;
}

long mount_tmpfs(child_args& a, step failed, const char* target, const char* options) {
    return checked(a, failed, SYS_mount, "tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options);
}

// The layout's own /etc/passwd and /etc/group: written to a scratch tmpfs on the /tmp mount point
// (before /tmp's own tmpfs), each bound read-only over the template's file, then the scratch
// mount is detached (the binds keep it alive). No file of it is writable from inside.
void bind_layout_etc(child_args& a) {
    mount_tmpfs(a, step::layout_etc, "tmp", "size=64k,mode=0755");
    const struct {
        const char* scratch;
        const char* target;
        const char* text;
        std::size_t length;
    } files[] = {{"tmp/passwd", "etc/passwd", a.passwd_text, a.passwd_length},
                 {"tmp/group", "etc/group", a.group_text, a.group_length}};
    for (const auto& f : files) {
        const long fd = checked(a, step::layout_etc, SYS_openat, AT_FDCWD, f.scratch,
                                O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        const long written = checked(a, step::layout_etc, SYS_write, fd, f.text, f.length);
        raw(SYS_close, fd);
        if (static_cast<std::size_t>(written) != f.length) child_fail(a, step::layout_etc, -EIO);
        checked(a, step::layout_etc, SYS_mount, f.scratch, f.target, nullptr, MS_BIND, nullptr);
        checked(a, step::layout_etc, SYS_mount, nullptr, f.target, nullptr,
                MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
    }
    checked(a, step::layout_etc, SYS_umount2, "tmp", MNT_DETACH);
}

// The layout's directories outside /workspace (home, workdir, artifacts_dir and their parents
// below /tmp or /home), owned by the sandbox user. Nothing in the sandbox has run yet, so
// nothing can have planted a link on the way.
void make_layout_dirs(child_args& a) {
    const char* path = a.layout_dirs;
    for (int i = 0; i < a.layout_dir_count; ++i) {
        const long made = raw(SYS_mkdirat, AT_FDCWD, path, 0755);
        if (made < 0 && made != -EEXIST) child_fail(a, step::layout_dirs, made);
        checked(a, step::layout_dirs, SYS_fchownat, AT_FDCWD, path, wire::sandbox_user_id,
                wire::sandbox_group_id, AT_SYMLINK_NOFOLLOW);
        while (*path != '\0') ++path;
        ++path;
    }
}

void bring_up_loopback(child_args& a) {
    const long fd = checked(a, step::loopback, SYS_socket, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq request{};
    request.ifr_name[0] = 'l';
    request.ifr_name[1] = 'o';
    checked(a, step::loopback, SYS_ioctl, fd, SIOCGIFFLAGS, &request);
    request.ifr_flags = static_cast<short>(request.ifr_flags | IFF_UP | IFF_RUNNING);
    checked(a, step::loopback, SYS_ioctl, fd, SIOCSIFFLAGS, &request);
    raw(SYS_close, fd);
}

// The sandbox's own network namespace gets small TCP buffers (the sysctls are per namespace; the
// pool, net.ipv4.tcp_mem, is the host's). The memory cgroup charges socket buffers, but the kernel
// lets every socket past a full charge for one packet on each side; with the host defaults
// (initial buffers 128 KiB to receive, sender autotuning to 4 MiB) that floor was ~64 KiB per
// connection: ~4x the memory limit of a sandbox with thousands of idle connections. With these,
// ~11 KiB. Written through the fresh /proc (relative to the template root), before anything makes
// /proc/sys read-only.
void limit_socket_buffers(child_args& a) {
    static constexpr char sizes[] = "4096 16384 1048576";  // min, initial, autotuning max
    for (const char* file : {"proc/sys/net/ipv4/tcp_rmem", "proc/sys/net/ipv4/tcp_wmem"}) {
        const long fd =
            checked(a, step::socket_buffers, SYS_openat, AT_FDCWD, file, O_WRONLY | O_CLOEXEC);
        checked(a, step::socket_buffers, SYS_write, fd, sizes, sizeof sizes - 1);
        raw(SYS_close, fd);
    }
}

// A fresh, empty session keyring: the inherited one is the embedding process's (often the login
// session's), whose keys a possessor may read. Before seccomp, which denies keyctl. A kernel built
// without keys has nothing to inherit.
void join_session_keyring(child_args& a) {
    const long result = raw(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, nullptr);
    if (result < 0 && result != -ENOSYS) child_fail(a, step::session_keyring, result);
}

// pid 1 leads its own session, without a controlling terminal, instead of staying in the
// embedding application's session.
void lead_own_session(child_args& a) {
    checked(a, step::setsid, SYS_setsid);
}

// What containers mask in /proc (runc's default masked and read-only paths): host-wide kernel
// state that is not the sandbox's. Files are covered by /dev/null, directories by an empty
// read-only tmpfs, and the rest is made read-only; entries this kernel lacks are skipped.
constexpr const char* masked_proc_files[] = {
    "/proc/kcore",      "/proc/keys",        "/proc/key-users",   "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
};
constexpr const char* masked_proc_dirs[] = {"/proc/acpi", "/proc/asound", "/proc/scsi"};
constexpr const char* read_only_proc[] = {"/proc/bus", "/proc/fs", "/proc/irq",
                                          "/proc/sysrq-trigger"};
constexpr unsigned long proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;

void bind_read_only(child_args& a, step failed, const char* path) {
    const long bound = raw(SYS_mount, path, path, nullptr, MS_BIND | MS_REC, nullptr);
    if (bound == -ENOENT) return;
    if (bound < 0) child_fail(a, failed, bound);
    checked(a, failed, SYS_mount, nullptr, path, nullptr,
            MS_BIND | MS_REMOUNT | MS_RDONLY | proc_flags, nullptr);
}

void mask_proc(child_args& a) {
    for (const char* file : masked_proc_files) {
        const long result = raw(SYS_mount, "/dev/null", file, nullptr, MS_BIND, nullptr);
        if (result < 0 && result != -ENOENT) child_fail(a, step::mask_proc, result);
    }
    for (const char* dir : masked_proc_dirs) {
        const long result =
            raw(SYS_mount, "tmpfs", dir, "tmpfs", MS_RDONLY | proc_flags, "size=0,mode=0555");
        if (result < 0 && result != -ENOENT) child_fail(a, step::mask_proc, result);
    }
    for (const char* path : read_only_proc) bind_read_only(a, step::mask_proc, path);
}

// Last of the mount steps: a sysctl the child writes for its own namespaces (net.*) must be
// written before this.
void make_proc_sys_read_only(child_args& a) {
    bind_read_only(a, step::proc_sys_read_only, "/proc/sys");
}

// Final layout: 0-2 /dev/null, 3 control, 4 slot lock, 5 agent executable (close-on-exec),
// 6 exec pipe (close-on-exec), 7 the attach socket (survivors only), 8 and 9 the commands'
// cgroup directory and cgroup.kill (v2, or the hybrid tracking tree). Sources may sit on any of the
// target numbers, so first move them all above the targets.
long move_above(child_args& a, int fd, int first_free) {
    if (fd < 0) return -1;
    return checked(a, step::arrange_fds, SYS_fcntl, fd, F_DUPFD_CLOEXEC, first_free);
}

void arrange_fds(child_args& a) {
    constexpr int first_free = 10;
    const long control =
        checked(a, step::arrange_fds, SYS_fcntl, a.control, F_DUPFD_CLOEXEC, first_free);
    const long lock =
        checked(a, step::arrange_fds, SYS_fcntl, a.slot_lock, F_DUPFD_CLOEXEC, first_free);
    const long exe =
        checked(a, step::arrange_fds, SYS_fcntl, a.agent_exe, F_DUPFD_CLOEXEC, first_free);
    const long exec_pipe =
        checked(a, step::arrange_fds, SYS_fcntl, a.exec_pipe_write, F_DUPFD_CLOEXEC, first_free);
    const long listen = a.listen_socket < 0 ? -1
                                            : checked(a, step::arrange_fds, SYS_fcntl,
                                                      a.listen_socket, F_DUPFD_CLOEXEC, first_free);
    const long command_cgroup = move_above(a, a.command_cgroup, first_free);
    const long command_cgroup_kill = move_above(a, a.command_cgroup_kill, first_free);
    checked(a, step::arrange_fds, SYS_dup3, control, 3, 0);
    checked(a, step::arrange_fds, SYS_dup3, lock, 4, 0);
    checked(a, step::arrange_fds, SYS_dup3, exe, 5, O_CLOEXEC);
    checked(a, step::arrange_fds, SYS_dup3, exec_pipe, 6, O_CLOEXEC);
    if (listen >= 0) checked(a, step::arrange_fds, SYS_dup3, listen, 7, 0);
    if (command_cgroup >= 0) checked(a, step::arrange_fds, SYS_dup3, command_cgroup, 8, 0);
    if (command_cgroup_kill >= 0)
        checked(a, step::arrange_fds, SYS_dup3, command_cgroup_kill, 9, 0);
    const long null = checked(a, step::open_dev_null, SYS_openat, AT_FDCWD, "/dev/null", O_RDWR);
    for (long fd = 0; fd < 3; ++fd) {
        if (fd != null) checked(a, step::arrange_fds, SYS_dup3, null, fd, 0);
    }
    if (null > 2) raw(SYS_close, null);  // it may have landed on 7, 8 or 9
    // The agent looks for 8 and 9: an unused number must be closed, whatever held it before.
    for (const long fd : {7L, 8L, 9L}) {
        const bool used = (fd == 7 && listen >= 0) || (fd == 8 && command_cgroup >= 0) ||
                          (fd == 9 && command_cgroup_kill >= 0);
        if (!used) raw(SYS_close, fd);
    }
    checked(a, step::close_range, SYS_close_range, first_free, ~0u, 0);
}

int child_main(void* opaque) {
    auto& a = *static_cast<child_args*>(opaque);
    raw(SYS_close, a.release_write);
    char byte = 0;
    long got;
    do {
        got = raw(SYS_read, a.release_read, &byte, 1);
    } while (got == -EINTR);
    if (got != 1) child_fail(a, step::wait_release, got == 0 ? -ECANCELED : got);
    // The parent may have cloned with a root file system uid (CLONE_INTO_CGROUP): from here on
    // files are reached as the sandbox's root, its mapped uid 0 (the maps are written now).
    raw(SYS_setfsuid, 0);
    raw(SYS_setfsgid, 0);
    // Join the sandbox's cgroups by moving itself (see cgroups::open_join), before the
    // cgroup namespace is made so that its root is the sandbox's cgroup.
    for (const int fd : a.attach_fds) {
        if (fd >= 0) checked(a, step::cgroup_attach, SYS_write, fd, "0", 1);
    }
    if (a.unified_before_namespace >= 0)
        checked(a, step::cgroup_attach, SYS_write, a.unified_before_namespace, "0", 1);
    checked(a, step::cgroup_namespace, SYS_unshare, CLONE_NEWCGROUP);
    // Under nsdelegate the namespace's root is the sandbox's own v2 cgroup; pid 1 lives in init.
    if (a.unified_after_namespace >= 0)
        checked(a, step::cgroup_attach, SYS_write, a.unified_after_namespace, "0", 1);

    // Without setgroups the child would keep host gid 0 as a supplementary group. pid 1 takes the
    // sandbox's group (its uid stays 0 in the namespace), so that commands, which inherit it,
    // change only their uid; and before the parent-death signal, which a gid change would clear.
    const gid_t group = wire::sandbox_group_id;
    checked(a, step::setgroups, SYS_setgroups, 1, &group);
    checked(a, step::setresgid, SYS_setresgid, group, group, group);
    // Copied mounts are locked in a user namespace and cannot be pivot_root targets, hence the
    // fresh recursive bind of the template (reachable through the 0711 state directory).
    checked(a, step::bind_template, SYS_mount, a.template_path, a.template_path, nullptr,
            MS_BIND | MS_REC, nullptr);
    checked(a, step::chdir_template, SYS_chdir, a.template_path);
    checked(a, step::setresuid, SYS_setresuid, 0, 0, 0);
    join_session_keyring(a);
    lead_own_session(a);

    // After setresuid: changing the euid clears the parent-death signal. The helper keeps the
    // release pipe's write end open until exec, so a hang-up means it already died.
    if (!a.survive_owner) {
        checked(a, step::pdeathsig, SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        pollfd owner{a.release_read, POLLIN, 0};
        timespec zero{};
        checked(a, step::owner_gone, SYS_ppoll, &owner, 1, &zero, nullptr, 0);
        if ((owner.revents & (POLLHUP | POLLERR)) != 0) child_fail(a, step::owner_gone, -ESRCH);
    }

    // A fresh /proc may only be mounted while a full one is visible: before pivot_root.
    checked(a, step::mount_proc, SYS_mount, "proc", "proc", "proc",
            MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
    limit_socket_buffers(a);
    if (a.has_layout_etc) bind_layout_etc(a);
    mount_tmpfs(a, step::mount_tmp, "tmp", a.tmp_options);
    mount_tmpfs(a, step::mount_shm, "dev/shm", a.tmp_options);
    mount_tmpfs(a, step::mount_workspace, "workspace", a.workspace_options);
    if (a.mount_home) mount_tmpfs(a, step::mount_home, "home", a.home_options);
    make_layout_dirs(a);
    checked(a, step::pivot_root, SYS_pivot_root, ".", ".");
    checked(a, step::umount_old_root, SYS_umount2, ".", MNT_DETACH);
    checked(a, step::chdir_root, SYS_chdir, "/");
    mask_proc(a);

    checked(a, step::sethostname, SYS_sethostname, "sandbox", 7);
    bring_up_loopback(a);
    make_proc_sys_read_only(a);
    const rlimit no_core{0, 0};
    checked(a, step::rlimit_core, SYS_prlimit64, 0, RLIMIT_CORE, &no_core, nullptr);
    arrange_fds(a);

    checked(a, step::no_new_privs, SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    checked(a, step::seccomp, SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &a.filter);
    const long result = raw(SYS_execveat, 5, "", a.argv, a.envp, AT_EMPTY_PATH);
    child_fail(a, step::execveat, result);
}

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

int sandbox_spawner::init(std::string template_path, std::vector<sock_filter> filter,
                          int agent_exe_fd, std::string& detail) {
    template_path_ = std::move(template_path);
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
                           exec_write}) {
                ::close(fd);
            }
            return fail(moat::errc::layer_unavailable, err, std::move(attach_detail));
        }
    }
    std::copy(attach_fds.init.begin(), attach_fds.init.end(), args.attach_fds);
    args.unified_before_namespace = attach_fds.unified_before_namespace;
    args.unified_after_namespace = attach_fds.unified_after_namespace;
    args.command_cgroup = attach_fds.commands_dir;
    args.command_cgroup_kill = attach_fds.commands_kill;
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
    if (pid < 0) {
        const int err = errno;
        for (int fd : {library_socket, agent_socket, release_write, exec_read}) ::close(fd);
        return fail(moat::errc::backend_failure, err, std::string("clone: ") + errno_name(err));
    }

    moat::errc code = moat::errc::backend_failure;
    std::string detail;
    int err = prepare_child(pid, slot, detail);
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
        detail = std::string(step_names[failed_step]) + ": " + errno_name(err);
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
