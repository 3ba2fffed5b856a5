// The local backend: sandboxes made of Linux namespaces on this host (the embedded default).
//
// On first use the backend starts one small static helper process (moat-sandboxd, embedded in
// this library and run from a sealed memfd; the application itself never forks). The helper
// creates each sandbox with clone(CLONE_VM | namespaces) from a read-only template root, applies
// cgroup limits, seccomp and a private uid range, and hands back the sandbox's pid 1 (an agent
// that runs commands in their own process groups). See docs/architecture.md.
//
// Embedding contract: the backend is confined to its executor; call it from coroutines running
// there. It installs no signal handlers and never changes the signal mask. Descriptors it holds in
// the application: 1 sealed memfd with the helper image (per process, once used); 2 for the
// helper (control socket, pidfd); 3 per live sandbox (pidfd, control socket, an O_PATH
// descriptor of its root for file access); 2 per running command (stdout and stderr pipes) plus 1
// while stdin bytes are being written. When the application process exits, every sandbox it
// created without survive_owner dies with it.
//
// Streamed file transfers (write_file_stream, read_file_stream) do their blocking work (opening,
// each chunk's read() or write(), the rename, removing an abandoned temporary file) on a small
// pool of moat's own threads (local_options::file_threads), one job per stream at a time, and
// resume on the executor between chunks: a 100 MiB copy never stalls the executor for more than
// one chunk's hand-off. Those threads take the sandbox user's filesystem identity only while they
// open, rename or remove, with every signal blocked.
//
// File operations (write_files, read_files, stat, list_dir) run inline on the calling thread:
// microseconds per small file, bounded by file_limits (a full batch copies up to 100 MiB, tens of
// milliseconds, during which the executor serves nothing else). While one runs, that thread alone
// has the sandbox user's filesystem identity (fsuid/fsgid, no supplementary groups, no effective
// capabilities); it is restored before the operation returns, together with the dumpable flag and
// the thread's parent-death signal that a change of fsuid resets. A signal handler of the
// application that touches files on that thread during that window would do so with the sandbox
// user's rights.
//
// Persistence: the backend records every sandbox in <state_dir>/sandboxes/<id>.json (0700
// directory, atomic writes; the record holds the spec's environment). list() and inspect() see
// every sandbox on the host that shares the state directory, whichever process created it (state
// `exited` for a record whose pid 1 is gone: stale). The first create() or list() of a backend
// sweeps stale records it can prove dead (pid 1 gone, checked through a pidfd and the start time;
// it survived its owner or its owner is gone): their cgroups, attach socket and record go.
// destroy() works on any of them: it kills pid 1 through a pidfd checked against the recorded
// start time, waits for its end, removes the cgroups, the attach socket and the record. attach()
// connects to a sandbox created with survive_owner by another process (its pid 1 listens on
// <id>.sock in the same directory; each side checks the other with SO_PEERCRED); after that, exec,
// files and extend_ttl work on it as on an owned one. Commands an attached process started die when
// it detaches (its connection closes); the sandbox lives on until its TTL or a destroy.
//
// Host requirements: root (the helper writes uid maps and cgroups), user namespaces, and cgroup
// v1 memory, pids and cpu controllers (hybrid hierarchy). cgroup v2-only hosts (stock Debian 12
// with systemd) are not supported yet: create fails with layer_unavailable naming the memory
// cgroup, unless the spec allows best effort.
#pragma once

#include <moat/backend.hpp>

#include <asio/any_io_executor.hpp>

#include <memory>
#include <optional>
#include <string>

namespace moat {

// What each sandbox's egress proxy allows (docs/network.md). A sandbox keeps the values it was
// created with (in its record): a process that attaches to it later applies those, not its own.
struct local_egress_limits {
    // Bytes relayed both ways over the sandbox's life, counted in one meter every process that
    // serves the sandbox charges (a connection that passes it is closed, later ones get 403).
    std::uint64_t max_bytes = std::uint64_t{4} << 30;
    // Proxied connections open at once, per serving process (the next one gets 429).
    std::uint32_t max_connections = 32;
    // Host memory the sandbox's proxied connections may hold in socket buffers and pipes, per
    // serving process (past it, a new connection gets 429). Each connection's own buffers are
    // fixed small, so 32 connections whose reader stalls hold a few MiB.
    std::uint64_t max_buffered_bytes = std::uint64_t{16} << 20;
    bool operator==(const local_egress_limits&) const = default;
};

struct local_options {
    // 0700 directory for the helper's state (template root, sandbox records); every moat process
    // on a host should share it, so that list() and the janitor see every sandbox. (Uid ranges are
    // allocated host-wide whatever the state directory, under /run/moat-uid-ranges.) Default:
    // /run/moat as root, else $XDG_RUNTIME_DIR/moat or /tmp/moat-<uid>. The helper makes it 0711
    // (sandbox setup runs as unprivileged host uids that must reach the read-only template in
    // it); every ancestor must be searchable by others too, or create fails naming the one that
    // is not.
    std::string state_dir;
    // Run this moat-sandboxd binary instead of the embedded one (development, packaging).
    std::string sandboxd_path;
    // How long destroy waits for the helper to confirm a sandbox is gone.
    std::chrono::milliseconds destroy_timeout = std::chrono::seconds(10);
    // How long a killed command may take to report its end before moat stops waiting.
    std::chrono::milliseconds kill_grace = std::chrono::seconds(2);
    // Names this backend instance in the records of the sandboxes it creates (sandbox_info::
    // owner_instance). Default: "<hostname>/<pid>/<6 random hex digits>".
    std::string owner_instance;
    // Threads doing streamed file I/O off the executor (at least 1), started by the first
    // stream. Streams beyond this many wait in the pool's queue, one job per stream.
    std::size_t file_threads = 2;
    // Limits of the egress proxy of each sandbox this backend creates.
    local_egress_limits egress;
    // Where templates live on disk (templates.hpp); "" is default_data_dir() (/var/lib/moat as
    // root).
    std::string data_dir;
    // The most a live update (backend::async_update_network) may allow a sandbox this backend
    // creates: the operator's list of what may ever be reached. Kept in the sandbox's record, so
    // every process bounds its updates alike. Unset: the network the sandbox was created with
    // (an update may narrow it and widen it back, never past it). Creates are not checked
    // against it: the spec's network is the caller's.
    std::optional<sandbox_network> network_limit;
};

std::unique_ptr<backend> make_local_backend(asio::any_io_executor executor,
                                            local_options options = {});

}  // namespace moat
