// The sandbox's seccomp filter, compiled once in the helper (libseccomp) and kept as a BPF program
// so each sandbox child only makes one seccomp() call on precomputed memory.
//
// An allow-list shaped like Docker's default profile: the syscalls a shell and coreutils, Python,
// pip, git, gcc and make use; everything else fails with EPERM. clone passes without CLONE_NEW*
// flags. clone3 passes this filter for pid 1, which clones commands straight into their cgroups
// (CLONE_INTO_CGROUP); every command stacks command_filter before it execs, which makes clone3
// return ENOSYS (so libc falls back to clone, whose flags a filter can see). Any syscall numbered
// above the newest the filter knows returns ENOSYS too (a later kernel's additions stay closed, and
// callers fall back as on an older kernel). socket and socketpair pass for unix, inet, inet6 and
// netlink (other families fail with EAFNOSUPPORT); personality only for PER_LINUX and the query;
// ioctl for everything but TIOCSTI and TIOCLINUX. A foreign architecture (i386 through int 0x80,
// or the x32 ABI) kills the process: nothing in a sandbox needs them, and one architecture keeps
// the list reviewable. docs/security.md lists the allowed families.
#pragma once

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <cerrno>
#include <cstddef>
#include <string>
#include <vector>

namespace moat::sandboxd {

// Compiles the filter into `out`. Returns 0 or an errno, with `detail` naming the failed step.
int compile_seccomp_filter(std::vector<sock_filter>& out, std::string& detail);

// Stacked by every command on the sandbox's filter before it execs (the sandbox's filter leaves
// clone3 to pid 1): clone3 fails with ENOSYS, so libc falls back to clone, whose flags the
// sandbox's filter checks. 435 is clone3 on every architecture (numbers are shared from 424 on).
inline constexpr unsigned clone3_number = 435;
inline constexpr sock_filter command_filter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, clone3_number, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};

}  // namespace moat::sandboxd
