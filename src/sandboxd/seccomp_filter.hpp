// The sandbox's seccomp filter, compiled once in the helper (libseccomp) and kept as a BPF program
// so each sandbox child only makes one seccomp() call on precomputed memory.
//
// An allow-list shaped like Docker's default profile: the syscalls a shell and coreutils, Python,
// pip, git, gcc and make use; everything else fails with EPERM. clone passes without CLONE_NEW*
// flags; clone3 returns ENOSYS (so libc falls back to clone, whose flags a filter can see), as
// does any syscall numbered above the newest the filter knows (a later kernel's additions stay
// closed, and callers fall back as on an older kernel). socket and socketpair pass for unix, inet,
// inet6 and netlink (other families fail with EAFNOSUPPORT); personality only for PER_LINUX and
// the query; ioctl for everything but TIOCSTI and TIOCLINUX. A foreign architecture (i386 through
// int 0x80, or the x32 ABI) kills the process: nothing in a sandbox needs them, and one
// architecture keeps the list reviewable. docs/security.md lists the allowed families.
#pragma once

#include <linux/filter.h>
#include <string>
#include <vector>

namespace moat::sandboxd {

// Compiles the filter into `out`. Returns 0 or an errno, with `detail` naming the failed step.
int compile_seccomp_filter(std::vector<sock_filter>& out, std::string& detail);

}  // namespace moat::sandboxd
