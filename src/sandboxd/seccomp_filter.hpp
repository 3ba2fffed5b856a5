// The sandbox's seccomp filter, compiled once in the helper (libseccomp) and kept as a BPF program
// so each sandbox child only makes one seccomp() call on precomputed memory.
//
// Default allow; EPERM for the mount API, ptrace and cross-process memory access, keyrings, bpf,
// io_uring, userfaultfd, perf events, namespace creation and entry, module and kexec loading,
// reboot, swap, accounting, quotas, file handles, the kernel log, raw port I/O, clock setting,
// pidfd_getfd, kcmp, personality changes (only PER_LINUX and the 0xffffffff query pass) and the
// TIOCSTI terminal injection ioctl; clone with any CLONE_NEW* flag fails with EPERM. clone3 is left
// to pid 1 (CLONE_INTO_CGROUP); each command adds a filter failing it with ENOSYS (so libc falls
// back to clone, whose flags a filter can see) before it execs. A foreign architecture or
// the x32 ABI kills the process.
#pragma once

#include <linux/filter.h>
#include <string>
#include <vector>

namespace moat::sandboxd {

// Compiles the filter into `out`. Returns 0 or an errno, with `detail` naming the failed step.
int compile_seccomp_filter(std::vector<sock_filter>& out, std::string& detail);

}  // namespace moat::sandboxd
