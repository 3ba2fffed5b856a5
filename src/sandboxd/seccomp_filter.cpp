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

namespace moat::sandboxd {
namespace {

constexpr const char* denied[] = {
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "perf_event_open",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "open_by_handle_at",
    "name_to_handle_at",
    "syslog",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "pidfd_getfd",
    "lookup_dcookie",
    "vhangup",
    "kcmp",
};

// clone's flags word also carries the exit signal in its low byte, so CLONE_NEWTIME (0x80) cannot
// be filtered there; it is only reachable through clone3 and unshare, both denied.
constexpr unsigned long clone_namespace_flags[] = {
    CLONE_NEWNS,   CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
    CLONE_NEWUSER, CLONE_NEWPID,    CLONE_NEWNET,
};

#if defined(__x86_64__)
constexpr std::uint32_t native_audit_arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr std::uint32_t native_audit_arch = AUDIT_ARCH_AARCH64;
#else
#error "moat-sandboxd: add this architecture's AUDIT_ARCH"
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr std::uint32_t arg0_low = offsetof(seccomp_data, args);
#else
constexpr std::uint32_t arg0_low = offsetof(seccomp_data, args) + 4;
#endif

// personality needs "arg not in {0, 0xffffffff}" on the low 32 bits (the kernel truncates the
// argument), which libseccomp cannot express in one rule. This prologue runs before libseccomp's
// program and falls through to it for everything else.
constexpr sock_filter personality_prologue[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, native_audit_arch, 0, 6),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_personality, 0, 4),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, arg0_low),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 2, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffff, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
};

// Socket families a sandbox may use. Everything else (AF_VSOCK above all: vsock ignores network
// namespaces and reaches the VM host or other guests' listeners; AF_PACKET, AF_ALG, Bluetooth and
// the rest of the rarely used, module-loaded families) fails with EAFNOSUPPORT.
constexpr int allowed_families[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};
// Well above AF_MAX (46 in Linux 6.x); the kernel itself refuses families from AF_MAX up.
constexpr int highest_family = 63;

int add_socket_family_rules(scmp_filter_ctx ctx, std::string& detail) {
    const std::uint32_t refuse = SCMP_ACT_ERRNO(EAFNOSUPPORT);
    for (const int syscall : {SCMP_SYS(socket), SCMP_SYS(socketpair)}) {
        for (int family = 0; family <= highest_family; ++family) {
            if (std::find(std::begin(allowed_families), std::end(allowed_families), family) !=
                std::end(allowed_families)) {
                continue;
            }
            // The kernel reads the family as an int: compare the low 32 bits only.
            const int rc = ::seccomp_rule_add(
                ctx, refuse, syscall, 1,
                SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, static_cast<std::uint32_t>(family)));
            if (rc < 0) {
                detail = "seccomp: socket family rule";
                return -rc;
            }
        }
    }
    return 0;
}

int add_rules(scmp_filter_ctx ctx, std::string& detail) {
    const std::uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
    for (const char* name : denied) {
        const int nr = ::seccomp_syscall_resolve_name(name);
        if (nr == __NR_SCMP_ERROR) {
            detail = std::string("seccomp: unknown syscall ") + name;
            return ENOSYS;
        }
        if (const int rc = ::seccomp_rule_add(ctx, eperm, nr, 0); rc < 0) {
            detail = std::string("seccomp: rule for ") + name;
            return -rc;
        }
    }
    for (const unsigned long flag : clone_namespace_flags) {
        const int rc = ::seccomp_rule_add(ctx, eperm, SCMP_SYS(clone), 1,
                                          SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
        if (rc < 0) {
            detail = "seccomp: rule for clone";
            return -rc;
        }
    }
    // clone3 stays open here for pid 1 (the agent clones commands straight into their cgroups
    // with CLONE_INTO_CGROUP); every command stacks a second filter on this one that fails
    // clone3 with ENOSYS before it execs (agent.cpp), so sandbox code never reaches it.
    const int rc = ::seccomp_rule_add(ctx, eperm, SCMP_SYS(ioctl), 1,
                                      SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI));
    if (rc < 0) {
        detail = "seccomp: rule for ioctl";
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
        const std::size_t prologue = std::size(personality_prologue);
        out.assign(personality_prologue, personality_prologue + prologue);
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
    scmp_filter_ctx ctx = ::seccomp_init(SCMP_ACT_ALLOW);
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
    if (err == 0) err = add_rules(ctx, detail);
    if (err == 0) err = export_program(ctx, out, detail);
    ::seccomp_release(ctx);
    return err;
}

}  // namespace moat::sandboxd
