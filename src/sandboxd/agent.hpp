// `moat-sandboxd agent --ttl-ms N [--max-processes N] [--survive-owner]`: pid 1 of every
// sandbox, exec'd by the helper's clone child. fd 3 is its control socket to the library, fd 4
// the uid slot lock. --max-processes sets RLIMIT_NPROC for commands (uid 1000 of this sandbox's
// user namespace), a second line behind the pids cgroup.
//
// It sends `ready`, then runs `exec` requests (SCM_RIGHTS: stdin, stdout, stderr) as uid/gid
// 1000 with no capabilities, each in its own session and process group, replying `started` and,
// when the command's main process exits, `exited` (spawn failures reply `exited` with
// exited_spawn_failed right away). Whatever the command left in its process group is killed when
// it exits, and once no command is running everything else in the sandbox is killed too, so an
// idle sandbox runs nothing but pid 1. `kill` signals a command's process group; a wall limit
// SIGKILLs it and reports exited_timed_out. `set_ttl` moves the sandbox's end and is answered
// with `ttl_set`.
//
// EOF on the control socket ends the sandbox (pid 1 exits and the kernel kills the namespace)
// unless --survive-owner was given; the TTL, when non-zero, ends it regardless.
//
// On cgroup v2, fd 8 and fd 9 are the commands' cgroup.procs and cgroup.kill (opened by the
// helper, see cgroups.hpp): each command moves itself in through fd 8 before exec, and an idle
// sandbox's leftovers are killed through fd 9 as well as by signal. Neither is inherited.
//
// With --survive-owner, fd 7 is a unix SOCK_SEQPACKET socket the helper bound in its 0700 state
// directory; the agent listens on it, so other host processes can attach. Each accepted
// connection (at most 32 besides the owner's; the peer must be outside this sandbox's pid
// namespace, checked with SO_PEERCRED) gets its own `ready` and speaks the same protocol. A
// command belongs to the connection that started it: only that connection can signal it and hears
// its exit, and it is killed when that connection closes. Replies never block pid 1: a peer whose
// socket buffer is full is disconnected.
#pragma once

#include <cstdint>

namespace moat::sandboxd {

// Runs the agent. Returns the process exit code.
int run_agent(std::uint64_t ttl_ms, std::uint32_t max_processes, std::uint32_t open_files,
              bool survive_owner);

}  // namespace moat::sandboxd
