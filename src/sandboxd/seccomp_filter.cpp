#include "sandboxd/seccomp_filter.hpp"

#include <linux/audit.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <string_view>

namespace moat::sandboxd {
namespace {

// The allow-list, shaped like Docker's default profile: what a shell and coreutils, Python and its
// standard library, pip, git, gcc and make call, and what moat's own pid 1 calls. Everything else
// fails with EPERM (the default action), except the cases below that return ENOSYS so that callers
// fall back. Names the running architecture lacks (libseccomp resolves them to negative pseudo
// numbers) are skipped.
// clang-format off
constexpr const char* allowed[] = {
    // files and descriptors
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
    "pwritev2", "open", "openat", "openat2", "creat", "close", "close_range", "lseek", "_llseek",
    "dup", "dup2", "dup3", "fcntl", "fcntl64", "flock", "fsync", "fdatasync", "sync", "syncfs",
    "sync_file_range", "truncate", "truncate64", "ftruncate", "ftruncate64", "fallocate",
    "fadvise64", "fadvise64_64", "readahead", "sendfile", "sendfile64", "copy_file_range", "splice",
    "tee", "vmsplice", "stat", "stat64", "lstat", "lstat64", "fstat", "fstat64", "newfstatat",
    "fstatat64", "statx", "statfs", "statfs64", "fstatfs", "fstatfs64", "access", "faccessat",
    "faccessat2", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat",
    "rmdir", "rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat", "symlink",
    "symlinkat", "readlink", "readlinkat", "mknod", "mknodat", "chmod", "fchmod", "fchmodat",
    "chown", "fchown", "lchown", "fchownat", "chown32", "fchown32", "lchown32", "umask", "utime",
    "utimes", "futimesat", "utimensat", "getxattr", "lgetxattr", "fgetxattr", "setxattr",
    "lsetxattr", "fsetxattr", "listxattr", "llistxattr", "flistxattr", "removexattr",
    "lremovexattr", "fremovexattr", "ioctl", "pipe", "pipe2", "memfd_create", "memfd_secret",
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "eventfd", "eventfd2",
    "signalfd", "signalfd4", "timerfd_create", "timerfd_settime", "timerfd_gettime", "cachestat",
    "fchmodat2",
    // polling and asynchronous I/O (Linux AIO; io_uring is denied)
    "poll", "ppoll", "select", "_newselect", "pselect6", "epoll_create", "epoll_create1",
    "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "io_setup", "io_destroy", "io_submit",
    "io_cancel", "io_getevents", "io_pgetevents",
    // memory
    "brk", "mmap", "mmap2", "munmap", "mremap", "mprotect", "madvise", "msync", "mincore", "mlock",
    "mlock2", "mlockall", "munlock", "munlockall", "remap_file_pages", "membarrier", "pkey_alloc",
    "pkey_free", "pkey_mprotect", "map_shadow_stack",
    // processes, threads and signals (clone is allowed below without namespace flags)
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "waitpid",
    "kill", "tkill", "tgkill", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending",
    "rt_sigsuspend", "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack",
    "sigreturn", "sigprocmask", "pause", "restart_syscall", "pidfd_open", "pidfd_send_signal",
    "process_mrelease", "set_tid_address", "set_robust_list", "get_robust_list", "rseq", "futex",
    "futex_waitv", "futex_wake", "futex_wait", "futex_requeue", "arch_prctl", "set_thread_area",
    "get_thread_area", "prctl", "seccomp", "personality", "landlock_create_ruleset",
    "landlock_add_rule", "landlock_restrict_self",
    // identity, limits and scheduling (no capabilities: a process can only give its own away)
    "getpid", "getppid", "gettid", "getuid", "geteuid", "getgid", "getegid", "getresuid",
    "getresgid", "getgroups", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
    "setgroups", "setfsuid", "setfsgid", "getuid32", "geteuid32", "getgid32", "getegid32",
    "getresuid32", "getresgid32", "getgroups32", "setuid32", "setgid32", "setreuid32", "setregid32",
    "setresuid32", "setresgid32", "setgroups32", "setfsuid32", "setfsgid32", "capget", "capset",
    "getpgid", "setpgid", "getpgrp", "getsid", "setsid", "getpriority", "setpriority", "getrlimit",
    "ugetrlimit", "setrlimit", "prlimit64", "getrusage", "sched_yield", "sched_getaffinity",
    "sched_setaffinity", "sched_getparam", "sched_setparam", "sched_getscheduler",
    "sched_setscheduler", "sched_getattr", "sched_setattr", "sched_get_priority_max",
    "sched_get_priority_min", "sched_rr_get_interval", "ioprio_get", "ioprio_set", "getcpu",
    // time
    "clock_gettime", "clock_getres", "clock_nanosleep", "gettimeofday", "time", "nanosleep",
    "times", "alarm", "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete",
    // sockets (socket and socketpair are allowed below for some families only)
    "bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername", "getsockopt",
    "setsockopt", "shutdown", "send", "sendto", "sendmsg", "sendmmsg", "recv", "recvfrom",
    "recvmsg", "recvmmsg",
    // System V and POSIX IPC, inside the sandbox's own IPC namespace
    "ipc", "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
    "mq_timedreceive", "mq_notify", "mq_getsetattr",
    // system information
    "uname", "sysinfo", "getrandom",
};
// clang-format on

// Syscalls newer than libseccomp 2.5.4, by number. From 424 on, every architecture but alpha
// shares one numbering.
constexpr int highest_known_syscall = 469;
constexpr int allowed_by_number[] = {
    462,                 // mseal
    463, 464, 465, 466,  // setxattrat, getxattrat, listxattrat, removexattrat
    468, 469,            // file_getattr, file_setattr
};
// Not allowed, so EPERM (the default): 457 statmount, 458 listmount, 459-461 lsm_*, 467
// open_tree_attr. Above highest_known_syscall, the prologue returns ENOSYS: a syscall a later
// kernel adds is closed until it is reviewed, and ENOSYS is what a caller probing for it expects
// from an older kernel (it falls back), as runc does for syscalls newer than its profile.

// Denied families, named so that compile_seccomp_filter can check none of them slipped into the
// allow-list (and documented in docs/security.md). Not an exhaustive list: whatever is not allowed
// is denied.
// clang-format off
constexpr const char* denied[] = {
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev",
    "process_madvise", "pidfd_getfd", "kcmp", "keyctl", "add_key", "request_key", "bpf",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "perf_event_open",
    "fanotify_init", "unshare", "setns", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl",
    "quotactl_fd", "open_by_handle_at", "name_to_handle_at", "syslog", "iopl", "ioperm",
    "modify_ldt", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname",
    "setdomainname", "lookup_dcookie", "vhangup", "uselib", "ustat", "sysfs", "mbind",
    "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
};
// clang-format on

// clone's flags word also carries the exit signal in its low byte, so CLONE_NEWTIME (0x80) cannot
// be filtered there; it is only reachable through clone3 (closed to commands by command_filter) and
// unshare (denied).
constexpr unsigned long clone_namespace_flags = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS |
                                                CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
                                                CLONE_NEWNET;

#if defined(__x86_64__)
constexpr std::uint32_t native_audit_arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr std::uint32_t native_audit_arch = AUDIT_ARCH_AARCH64;
#else
#error "moat-sandboxd: add this architecture's AUDIT_ARCH"
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr std::uint32_t arg_low(int index) {
    return static_cast<std::uint32_t>(offsetof(seccomp_data, args) + 8 * index);
}
#else
constexpr std::uint32_t arg_low(int index) {
    return static_cast<std::uint32_t>(offsetof(seccomp_data, args) + 8 * index + 4);
}
#endif

// What libseccomp cannot express in one rule, as a prologue that runs before libseccomp's program
// and falls through to it (label `end`) for everything else: personality's argument and ioctl's
// request are compared on their low 32 bits only (the kernel truncates both), personality passes
// only PER_LINUX and the 0xffffffff query, ioctl refuses TIOCSTI (typing into a terminal) and
// TIOCLINUX (console selection and input); and syscall numbers above highest_known_syscall return
// ENOSYS. x32 numbers (bit 30) fall through, and libseccomp kills the process for them.
enum label : std::uint8_t { next, personality, ioctl, enosys, eperm, end };

struct instruction {
    sock_filter op;
    label if_true = next;
    label if_false = next;
    label defines = next;  // this instruction is where the label points
};

std::vector<sock_filter> build_prologue() {
    constexpr std::uint32_t ld = BPF_LD | BPF_W | BPF_ABS;
    constexpr std::uint32_t jeq = BPF_JMP | BPF_JEQ | BPF_K;
    const instruction program[] = {
        {BPF_STMT(ld, offsetof(seccomp_data, arch))},
        {BPF_JUMP(jeq, native_audit_arch, 0, 0), next, end},
        {BPF_STMT(ld, offsetof(seccomp_data, nr))},
        {BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 0), end, next},
        {BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, highest_known_syscall, 0, 0), enosys, next},
        {BPF_JUMP(jeq, __NR_personality, 0, 0), personality, next},
        {BPF_JUMP(jeq, __NR_ioctl, 0, 0), ioctl, end},
        {BPF_STMT(ld, arg_low(0)), next, next, personality},
        {BPF_JUMP(jeq, 0, 0, 0), end, next},
        {BPF_JUMP(jeq, 0xffffffff, 0, 0), end, eperm},
        {BPF_STMT(ld, arg_low(1)), next, next, ioctl},
        {BPF_JUMP(jeq, TIOCSTI, 0, 0), eperm, next},
        {BPF_JUMP(jeq, TIOCLINUX, 0, 0), eperm, end},
        {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS), next, next, enosys},
        {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM), next, next, eperm},
    };
    constexpr std::size_t size = std::size(program);
    std::size_t at[end + 1] = {};
    at[end] = size;
    for (std::size_t i = 0; i < size; ++i) {
        if (program[i].defines != next) at[program[i].defines] = i;
    }
    std::vector<sock_filter> out;
    for (std::size_t i = 0; i < size; ++i) {
        sock_filter op = program[i].op;
        // Jumps are relative to the next instruction and only go forward.
        if (program[i].if_true != next)
            op.jt = static_cast<std::uint8_t>(at[program[i].if_true] - i - 1);
        if (program[i].if_false != next)
            op.jf = static_cast<std::uint8_t>(at[program[i].if_false] - i - 1);
        out.push_back(op);
    }
    return out;
}

// Socket families a sandbox may use. Everything else (AF_VSOCK above all: vsock ignores network
// namespaces and reaches the VM host or other guests' listeners; AF_PACKET, AF_ALG, Bluetooth and
// the rest of the rarely used, module-loaded families) fails with EAFNOSUPPORT.
constexpr int allowed_families[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};
// Well above AF_MAX (46 in Linux 6.x); the kernel itself refuses families from AF_MAX up.
constexpr int highest_family = 63;

int add_socket_family_rules(scmp_filter_ctx ctx, std::string& detail) {
    for (const int syscall : {SCMP_SYS(socket), SCMP_SYS(socketpair)}) {
        for (int family = 0; family <= highest_family; ++family) {
            const bool permitted =
                std::find(std::begin(allowed_families), std::end(allowed_families), family) !=
                std::end(allowed_families);
            const std::uint32_t action = permitted ? SCMP_ACT_ALLOW : SCMP_ACT_ERRNO(EAFNOSUPPORT);
            // The kernel reads the family as an int: compare the low 32 bits only.
            const int rc = ::seccomp_rule_add(
                ctx, action, syscall, 1,
                SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, static_cast<std::uint32_t>(family)));
            if (rc < 0) {
                detail = "seccomp: socket family rule";
                return -rc;
            }
        }
    }
    return 0;
}

int resolve(const char* name, int& nr, std::string& detail) {
    nr = ::seccomp_syscall_resolve_name(name);
    if (nr != __NR_SCMP_ERROR) return 0;
    detail = std::string("seccomp: unknown syscall ") + name;
    return ENOSYS;
}

int add_rules(scmp_filter_ctx ctx, std::string& detail) {
    for (const char* name : allowed) {
        int nr = 0;
        if (const int err = resolve(name, nr, detail)) return err;
        if (nr < 0) continue;  // not a syscall of this architecture
        if (const int rc = ::seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0); rc < 0) {
            detail = std::string("seccomp: rule for ") + name;
            return -rc;
        }
    }
    for (const int nr : allowed_by_number) {
        if (const int rc = ::seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0); rc < 0) {
            detail = "seccomp: rule for syscall " + std::to_string(nr);
            return -rc;
        }
    }
    for (const char* name : denied) {
        int nr = 0;
        if (const int err = resolve(name, nr, detail)) return err;
        for (const char* other : allowed) {
            if (std::string_view(other) == name) {
                detail = std::string("seccomp: ") + name + " is both allowed and denied";
                return EINVAL;
            }
        }
    }
    int rc = ::seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
                                SCMP_A0(SCMP_CMP_MASKED_EQ, clone_namespace_flags, 0));
    if (rc < 0) {
        detail = "seccomp: rule for clone";
        return -rc;
    }
    // clone3 passes its flags in memory a filter cannot read. It stays open here for pid 1 (the
    // agent clones commands straight into their cgroups with CLONE_INTO_CGROUP); every command
    // stacks command_filter on this one before it execs, which fails clone3 with ENOSYS (so libc
    // falls back to clone), so sandbox code never reaches it.
    if ((rc = ::seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone3), 0)) < 0) {
        detail = "seccomp: rule for clone3";
        return -rc;
    }
    return add_socket_family_rules(ctx, detail);
}

// libseccomp 2.5 can only export to a file descriptor: go through a memfd.
int export_program(scmp_filter_ctx ctx, std::vector<sock_filter>& out, std::string& detail) {
    const int fd = ::memfd_create("moat-seccomp", MFD_CLOEXEC);
    if (fd < 0) {
        detail = "seccomp: memfd_create";
        return errno;
    }
    int err = -::seccomp_export_bpf(ctx, fd);
    struct stat st {};
    if (err == 0 && ::fstat(fd, &st) != 0) err = errno;
    const std::size_t bytes = static_cast<std::size_t>(st.st_size);
    if (err == 0 && (bytes == 0 || bytes % sizeof(sock_filter) != 0)) err = EPROTO;
    if (err == 0) {
        out = build_prologue();
        const std::size_t prologue = out.size();
        out.resize(prologue + bytes / sizeof(sock_filter));
        if (::pread(fd, out.data() + prologue, bytes, 0) != static_cast<ssize_t>(bytes)) {
            err = errno != 0 ? errno : EIO;
        }
    }
    ::close(fd);
    if (err != 0) {
        out.clear();
        detail = "seccomp: export";
    }
    return err;
}

}  // namespace

int compile_seccomp_filter(std::vector<sock_filter>& out, std::string& detail) {
    scmp_filter_ctx ctx = ::seccomp_init(SCMP_ACT_ERRNO(EPERM));
    if (ctx == nullptr) {
        detail = "seccomp: seccomp_init";
        return ENOMEM;
    }
    int err = -::seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
    if (err != 0) detail = "seccomp: bad-arch action";
    // The sandbox child sets no_new_privs itself, right before loading the program.
    if (err == 0 && (err = -::seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0)) != 0) {
        detail = "seccomp: nnp attribute";
    }
    // A binary tree of syscall numbers instead of a linear chain of some 300 comparisons.
    if (err == 0 && (err = -::seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2)) != 0) {
        detail = "seccomp: optimize attribute";
    }
    if (err == 0) err = add_rules(ctx, detail);
    if (err == 0) err = export_program(ctx, out, detail);
    ::seccomp_release(ctx);
    return err;
}

}  // namespace moat::sandboxd
