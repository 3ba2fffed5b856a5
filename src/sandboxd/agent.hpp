// `moat-sandboxd agent --ttl-ms N [--max-processes N] [--survive-owner] [--egress-port N]`: pid 1
// of every sandbox, exec'd by the helper's clone child. fd 3 is its control socket to the library,
// fd 4 the uid slot lock. --max-processes sets RLIMIT_NPROC for commands (uid 1000 of this
// sandbox's user namespace), a second line behind the pids cgroup.
//
// It sends `ready`, then runs `exec` requests (SCM_RIGHTS: stdin, stdout, stderr) as uid/gid
// 1000 with no capabilities, each in its own session and process group, replying `started` and,
// when the command's main process exits, `exited` (a command that cannot be exec'd replies
// `exited` with exited_spawn_failed and the errno). Commands are started with clone3 as copies of
// pid 1 (no CLONE_VM, no CLONE_VFORK): pid 1 never waits for a child, so nothing sandbox code does
// to a half-started one (SIGSTOP once it has the sandbox's uid) can stall it. Whatever the command
// left in its process group is killed when it exits. `kill` signals a command's process group; a
// wall limit SIGKILLs it and reports exited_timed_out. `set_ttl` moves the sandbox's end and is
// answered with `ttl_set`. `set_paused` (answered with `paused_set`) tells pid 1 that the library
// froze (or thawed) the commands' cgroup: wall limits stand still while paused (and are moved by
// the time paused on resume), and the sandbox's end moves to its paused lifetime (or back to what
// was left of its TTL).
//
// EOF on the control socket ends the sandbox (pid 1 exits and the kernel kills the namespace)
// unless --survive-owner was given; the TTL, when non-zero, ends it regardless.
//
// Per-command cgroups: fd 8 is the commands' cgroup v2 directory and fd 9 its cgroup.kill (the
// helper opened them and handed the directory to the sandbox's root, see cgroups.hpp); neither is
// inherited, and fd 9 is not written (a cgroup once killed through cgroup.kill kills every child
// later cloned into it or below it, on Linux 6.18). An exec flagged exec_own_cgroup is cloned
// (CLONE_INTO_CGROUP) into a cgroup of its own, `c<n>` below fd 8 (c0 made by the helper with the
// sandbox, the rest by pid 1), reused while it never had to be killed (at most a few idle ones
// are kept); spawned processes go to fd 8's cgroup itself. When the exec's main process exits,
// anything left in its cgroup is killed at once (cgroup.kill), the cgroup is removed once empty,
// and `exited` carries exited_strays_killed. Without fd 8 (no cgroup2 mount), or if the kernel
// refuses the cgroup, commands share pid 1's cgroup and everything else in the sandbox is killed
// once no command is running, so an idle sandbox runs nothing but pid 1. On v1-only hosts with a
// freezer, fd 11 is the commands' tasks file in the v1 freezer (cgroups.hpp): every command
// writes "0" to it before it execs (not inherited), so that pause freezes all but pid 1; fd 12 is
// its freezer.state, which pid 1 sets THAWED on its way out (a frozen process would not die of
// the SIGKILL pid 1's exit sends, and pid 1 cannot finish exiting before it has).
//
// With --survive-owner, fd 7 is a unix SOCK_SEQPACKET socket the helper bound in its 0700 state
// directory; the agent listens on it, so other host processes can attach. Each accepted
// connection (at most 32 besides the owner's; the peer must be outside this sandbox's pid
// namespace, checked with SO_PEERCRED) gets its own `ready` and speaks the same protocol. A
// command belongs to the connection that started it: only that connection can signal it and hears
// its exit, and it is killed when that connection closes. Replies never block pid 1: a peer whose
// socket buffer is full is disconnected.
//
// With --egress-port N (a sandbox whose network policy is not none), pid 1 binds a TCP socket to
// 127.0.0.1:N inside the sandbox's network namespace and listens on it before `ready`. It never
// accepts there: every `ready` it sends (the owner's and each attached connection's) carries a
// dup of the listening socket (SCM_RIGHTS) and ready_message::egress_port, and the library
// accepts on it from the host's side and hands each connection to its egress proxy. When no
// library holds the sandbox, connections wait in the backlog (128) until one attaches.
//
// Root: pid 1 is non-dumpable from its first step (its memory, environ and descriptors stay
// closed to the sandbox's root, which has pid 1's uid), and it reduces the bounding set to
// wire::root_capabilities. An exec flagged exec_as_root runs as uid/gid 0 with exactly those
// capabilities; every other command drops them from its bounding set and runs as uid 1000 with
// none. The sudo socket (wire::sudo_socket_name, an abstract unix socket of the sandbox's own
// network namespace) is bound before any command runs: each connection from a process of this
// sandbox (SO_PEERCRED) sends one exec record within 5 s, which runs as root in a
// cgroup of its own when --allow-sudo was given and is refused with EPERM otherwise; at most
// 8 running at once (more are answered EAGAIN) and 32 connections held (more are closed). The
// command dies with its connection.
#pragma once

#include <cstdint>

namespace moat::sandboxd {

// Runs the agent. Returns the process exit code.
int run_agent(std::uint64_t ttl_ms, std::uint32_t max_processes, std::uint32_t open_files,
              bool survive_owner, std::uint16_t egress_port = 0, bool allow_sudo = false);

}  // namespace moat::sandboxd
