// `moat-sandboxd helper --state-dir DIR`: the single-threaded process a library instance starts
// once (fd 3 is its SOCK_SEQPACKET control socket, the environment is empty). It owns a private
// mount namespace holding the read-only template root, the compiled seccomp filter, the cgroup
// parents and the uid-slot allocator, and creates and reaps sandboxes on request.
//
// Protocol (wire/protocol.hpp): `hello` first; then `create` -> `created` (SCM_RIGHTS: pidfd, the
// library end of the agent's control socket) or `create_failed`; `destroy` -> SIGKILL, and when
// pid 1 has been reaped and its cgroups removed, `reaped` (also sent unsolicited when a sandbox
// ends by itself, and with cleanup_errno = ESRCH for an unknown id). Creates are served one at a
// time. When the control socket closes, every sandbox not created with create_survive_owner is
// killed and reaped, and the helper exits 0.
//
// Without euid 0 the helper still says hello (host_layers = 0, layer_detail says why) and fails
// every create with errc::layer_unavailable.
#pragma once

#include <string>

namespace moat::sandboxd {

// Runs the helper until its control socket (fd 3) closes. Returns the process exit code.
int run_helper(const std::string& state_dir);

}  // namespace moat::sandboxd
