// moat::backend: where sandboxes live. The local backend (Linux namespaces on this host) is the
// embedded default; a remote backend speaks the E2B protocol to a fleet.
//
// Every operation is a coroutine on the backend's executor and returns result<T>; exceptions do
// not escape it. Parameters are taken by value (coroutines outlive their callers' temporaries).
// Unless an operation says otherwise, Per-Operation Cancellation is terminal: the operation stops
// what it started (a process is killed and its end confirmed within a grace period) and completes
// with errc::cancelled; if the end could not be confirmed, with errc::backend_failure. Wrap a
// call in with_timeout() for a deadline (errc::deadline_exceeded).
//
// A backend keeps work on its executor (it listens to its helper or service) until it is
// destroyed, so io_context::run() does not return while one is alive.
//
// A backend does not order operations on one sandbox; the sandbox handle above it does.
#pragma once

#include <moat/exec.hpp>
#include <moat/files.hpp>
#include <moat/result.hpp>
#include <moat/sandbox_spec.hpp>
#include <moat/terminal.hpp>
#include <moat/usage.hpp>
#include <moat/watch.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace moat {

// A sandbox matches when every key in the filter has the same value in its labels.
using label_filter = std::map<std::string, std::string>;

// What a backend can enforce where it runs (for `moat doctor` and operators' checks).
struct host_report {
    // Isolation layers every sandbox can get, named as in sandbox_info::layers.
    std::vector<std::string> layers;
    // Why a layer is missing, or why the backend cannot create sandboxes at all; "" if neither.
    std::string detail;
    // Backend-specific facts, e.g. local: "state_dir", "owner_instance".
    std::map<std::string, std::string> facts;
};

// One thing the janitor did (or, in a dry run, would do).
struct janitor_action {
    std::string action;  // "destroy", "remove_record", "remove_cgroup", "remove_file", "report"
    std::string target;  // a sandbox id or a path
    std::string reason;  // why
    bool done = false;   // carried out and confirmed (always false in a dry run)
    std::string error;   // why it could not be done, if it was tried
};

class backend {
  public:
    virtual ~backend() = default;

    virtual asio::any_io_executor get_executor() const = 0;
    // "local", "e2b", ...
    virtual std::string name() const = 0;

    // The longest this backend takes, once a cancellation has reached one of its operations, to
    // confirm that what the operation started has stopped (or to give up and fail). The sandbox
    // handle waits this long plus its own margin (handle_options::kill_grace) before it stops
    // vouching for the sandbox, so a stop the backend confirms in time never quarantines. A
    // backend that adds a hop (a network, a proxy) includes that hop here.
    virtual std::chrono::milliseconds stop_grace() const { return std::chrono::seconds(2); }

    // The paths a sandbox created with `requested` (sandbox_spec::layout) will have, known before
    // any create: what the layers above (the tool layer, its descriptions) must use. The default
    // is `requested` itself; a backend whose sandboxes have a fixed layout (e2b: /home/user)
    // returns that one for the default request. A layout the backend cannot provide is still
    // refused by async_create.
    virtual sandbox_layout layout_for(const sandbox_layout& requested) const { return requested; }

    // Creates a sandbox and returns once its pid 1 is ready to run commands. Cancelling destroys
    // the half-made sandbox. Errors: invalid_argument (a bad spec field, named), layer_unavailable
    // (a layer or limit this host cannot enforce, named), backend_failure.
    virtual asio::awaitable<result<sandbox_info>> async_create(sandbox_spec spec) = 0;

    // Attaches to a sandbox another process created with survive_owner, so that this backend can
    // exec in it, copy files, extend its TTL and destroy it. Attaching twice returns the same
    // info. Detaching (destroying this backend) leaves the sandbox running but kills the commands
    // this backend started in it. Errors: sandbox_not_found, sandbox_unavailable (ended, or not
    // created to survive its owner).
    virtual asio::awaitable<result<sandbox_info>> async_attach(std::string id) = 0;

    // What this backend can enforce here. The default fails with not_supported.
    virtual asio::awaitable<result<host_report>> async_host_report();

    // Cleans up what crashes left behind (local: stale records, sandboxes past their TTL or
    // whose destroy was never confirmed, orphaned cgroups and files), confirming each. Never
    // touches a live, unexpired sandbox, nor one this backend holds. With dry_run, only reports.
    // The default fails with not_supported.
    virtual asio::awaitable<result<std::vector<janitor_action>>> async_janitor(bool dry_run);

    // Current state of a sandbox (local: any sandbox recorded on this host). sandbox_not_found if
    // unknown.
    virtual asio::awaitable<result<sandbox_info>> async_inspect(std::string id) = 0;

    // Sandboxes whose labels match (local: every sandbox recorded on this host, this backend's
    // first; sandbox_info::owned tells them apart).
    virtual asio::awaitable<result<std::vector<sandbox_info>>> async_list(label_filter filter) = 0;

    // What the sandbox uses now (moat/usage.hpp): CPU time, memory, disk. local: its cgroups and
    // its writable filesystems, read from the host (no message to the sandbox); e2b: not_supported
    // (the default). sandbox_not_found if unknown, sandbox_unavailable once it has ended.
    virtual asio::awaitable<result<sandbox_usage>> async_usage(std::string id);

    // Pause in place: the sandbox's commands are frozen (no CPU; memory, processes, files and
    // connections kept), its TTL stands still and its paused lifetime (sandbox_spec::
    // paused_lifetime) counts instead: past it the sandbox ends. Returns the info, state
    // `paused`, expires_at the end of the paused lifetime. Idempotent. The paused state lives as
    // long as the sandbox's processes: a host reboot loses it with them. local: the commands'
    // cgroup v2 subtree (cgroup.freeze; never pid 1, which keeps answering), where a cgroup2
    // mount exists (hybrid hosts too); elsewhere not_supported. e2b: the provider's pause
    // (POST /sandboxes/{id}/pause; resume is its connect, with what was left of the TTL; a
    // sandbox paused through this backend is skipped by its heartbeat). Errors: sandbox_not_found,
    // sandbox_unavailable (it has ended), not_supported, backend_failure.
    virtual asio::awaitable<result<sandbox_info>> async_pause(std::string id);
    // Thaws a paused sandbox, everything as it was, its TTL running again with what was left of
    // it; a running one is returned as it is. Errors as async_pause.
    virtual asio::awaitable<result<sandbox_info>> async_resume(std::string id);
    // Whether the sandbox's commands are frozen now, by whichever process paused it (local: one
    // read of its cgroup.freeze); false where unknown. Cheap: the handle asks before operations.
    virtual bool is_paused(const std::string& id) const;

    // Moves the sandbox's end to `ttl` from now (1 ms to sandbox_spec::max_ttl), confirmed by the
    // sandbox itself (its pid 1 enforces the TTL), and returns the updated info. Errors:
    // invalid_argument, sandbox_not_found, sandbox_unavailable (it has ended). On a paused
    // sandbox it sets the TTL it will resume with.
    virtual asio::awaitable<result<sandbox_info>> async_extend_ttl(
        std::string id, std::chrono::milliseconds ttl) = 0;

    // Replaces the egress rules of the running sandbox (sandbox_spec::network, docs/network.md)
    // without restarting it, and returns the updated info. Narrowing always works; widening only
    // within the backend's limit (local: local_options::network_limit, else what the sandbox was
    // created with, kept in its record: egress/network_bounds.hpp's rule). Every process serving
    // the sandbox's proxy applies the new rules to the requests it checks from then on; a proxied
    // connection whose host the new rules refuse is closed (at once in this process, within about
    // a second in another). Errors: invalid_argument (a bad entry, named), permission_denied (an
    // entry past the limit, named), not_supported (a sandbox created with network none has no
    // proxy endpoint and gets none while it runs; the default), sandbox_not_found,
    // sandbox_unavailable.
    virtual asio::awaitable<result<sandbox_info>> async_update_network(std::string id,
                                                                       sandbox_network network);

    // Kills every process of the sandbox and returns only once it is confirmed gone (pid 1 reaped,
    // cgroups and mounts released), then forgets the id. A sandbox that ended on its own (TTL,
    // crash) stays listed as `exited` until destroyed; destroying it releases the record and
    // succeeds. An id this backend does not know (never created here, or already destroyed)
    // fails with sandbox_not_found. If the end cannot be confirmed within the backend's bound,
    // backend_failure says so and the record is kept.
    // Per-Operation Cancellation: none; a destroy always runs to its confirmation or its bound.
    virtual asio::awaitable<result<void>> async_destroy(std::string id) = 0;

    // Runs a command to completion, keeping head + tail of its output (request.output).
    // The default drains async_exec_stream.
    virtual asio::awaitable<result<exec_result>> async_exec(std::string id, exec_request request);

    // Starts a command and returns its output stream once the process has started.
    virtual asio::awaitable<result<exec_stream>> async_exec_stream(std::string id,
                                                                   exec_request request) = 0;

    // Starts a background process and returns its handle once it has started.
    virtual asio::awaitable<result<process>> async_spawn(std::string id, exec_request request);

    // Sends `signal` to the process group of a command started by async_spawn.
    virtual asio::awaitable<result<void>> async_signal(std::string id, std::uint64_t process_id,
                                                       int signal);

    // Starts a command on a terminal of `size` (terminal.hpp) and returns its handle once it has
    // started. The request is a spawn's (exec_request::resident decides the lifetime; stdin_data
    // must be empty: write input to the terminal; the wall limit is at most
    // max_spawn_wall_limit). TERM is xterm-256color unless the request or the sandbox sets it.
    // Errors: invalid_argument (a size side outside 1..terminal_size::max_side), limit_exceeded
    // (the sandbox has no terminal left), not_supported (the default).
    virtual asio::awaitable<result<terminal>> async_open_terminal(std::string id,
                                                                  exec_request request,
                                                                  terminal_size size);
    // Reattaches to the running terminal command `pid` (terminal::pid) of the sandbox, whoever
    // started it: a handle that does not kill the command when dropped. invalid_argument when no
    // terminal command with that pid runs (it ended, or is no terminal); not_supported (default).
    virtual asio::awaitable<result<terminal>> async_attach_terminal(std::string id, int pid);

    // File transfer. The contract is in files.hpp: absolute paths resolved only inside the
    // sandbox, the sandbox user's permissions, per-path results with normalized errors, sizes
    // bounded by file_limits, atomic writes, no implicit creation of parent directories.
    // The whole call fails only with sandbox_not_found (unknown or destroyed id),
    // sandbox_unavailable (the sandbox ended or its backend can no longer vouch for it) or
    // too_large (the batch exceeds file_limits; nothing was done).
    // Per-Operation Cancellation (local backend): none; the work is synchronous, runs inline on
    // the executor and is bounded by the limits.
    // The defaults fail with not_supported; the streaming calls' defaults fall back to the batch
    // calls for small files.

    // Writes each file (created or replaced atomically, permission bits from file_write::mode),
    // one result per file in order. At most max_files files and max_batch_bytes in all.
    virtual asio::awaitable<result<std::vector<file_write_result>>> async_write_files(
        std::string id, std::vector<file_write> files);
    // Reads each regular file, one result per path in order. At most max_files paths; once the
    // contents read reach max_batch_bytes, the remaining paths get too_large.
    virtual asio::awaitable<result<std::vector<file_read_result>>> async_read_files(
        std::string id, std::vector<std::string> paths);
    // Streaming transfer of one file (files.hpp: file_write_target, byte_source,
    // file_read_stream), for files of any size in bounded memory.
    //
    // Writes the bytes `source` yields into target.path, atomically: they go to a temporary file
    // in the target's directory that is renamed over the target only once the source ended
    // cleanly (an empty chunk). A source error, a write past target.max_bytes (too_large), a
    // write error (no space: too_large) or a cancellation removes the temporary file before the
    // call completes and leaves the target as it was. Per-path problems are in the
    // file_write_result; the whole call fails only as the batch calls do, or with cancelled.
    // Per-Operation Cancellation: terminal. It is seen at the source's pending call and between
    // chunks; the temporary file is removed, then the call completes with errc::cancelled.
    // The default falls back to async_write_files for what fits one batch file
    // (file_limits::max_file_bytes): past that, too_large naming this backend's limit; a target
    // with metadata fails with not_supported.
    virtual asio::awaitable<result<file_write_result>> async_write_file_stream(
        std::string id, file_write_target target, byte_source source);
    // Opens one regular file for reading. Errors are the per-path ones of the batch read
    // (file_not_found, is_directory, invalid_path, permission_denied), plus the whole-call ones;
    // there is no size cap (memory is bounded by the chunk size). The stream may not outlive the
    // backend. Per-Operation Cancellation: none needed; opening is one bounded step.
    // The default falls back to async_stat + async_read_files: only files up to
    // file_limits::max_file_bytes, held in memory (too_large past it).
    virtual asio::awaitable<result<file_read_stream>> async_read_file_stream(std::string id,
                                                                             std::string path);

    // The metadata (files.hpp, file_metadata) of each path, one result per path in order; a final
    // symlink is followed inside the sandbox (the metadata is its target's). At most
    // file_limits::max_files paths (else too_large for the whole call). A file without metadata,
    // or on a filesystem that keeps no extended attributes, has an empty set; an attribute under
    // the prefix whose name or value breaks the metadata rules (set from inside the sandbox) is
    // left out. Per-path errors as files.hpp. The default fails with not_supported.
    virtual asio::awaitable<result<std::vector<file_metadata_result>>> async_read_metadata(
        std::string id, std::vector<std::string> paths);

    // Type, size and permission bits of one path; a final symlink is reported as the link itself.
    // Errors are the per-path ones of files.hpp.
    virtual asio::awaitable<result<file_stat>> async_stat(std::string id, std::string path);
    // Entries of one directory (without "." and ".."), sorted by name, symlinks not followed.
    // invalid_path if the path is not a directory; too_large past max_dir_entries.
    virtual asio::awaitable<result<std::vector<dir_entry>>> async_list_dir(std::string id,
                                                                           std::string path);

    // Ports: a server in the sandbox reached from outside, without the sandbox getting a route.
    //
    // A TCP connection to `port` on the sandbox's own loopback (127.0.0.1, else ::1), connected
    // from inside its network namespace and handed out as a socket on this backend's executor;
    // the bytes are the caller's to move. A server bound only to another of the sandbox's
    // addresses is not reached (a sandbox has only loopback). Errors: invalid_argument for port 0;
    // permission_denied for a port moat itself listens on inside the sandbox (the egress proxy's,
    // sandbox_network::proxy_port): never forwarded; connection_refused when nothing listens there
    // (yet) or the connect failed otherwise (never a reason to quarantine: it is about the
    // sandbox's server, not the sandbox); not_supported where the backend exposes ports only as
    // hosts (e2b: port_host).
    // Cancellation: the connection is dropped.
    virtual asio::awaitable<result<asio::ip::tcp::socket>> async_connect_port(std::string id,
                                                                              std::uint16_t port);
    // A stream connection to the unix-domain (SOCK_STREAM) socket at the absolute `path` in the
    // sandbox's filesystem, connected from inside the sandbox by its agent and handed out on this
    // backend's executor. Errors: invalid_argument when `path` is empty, not absolute, contains a
    // NUL or is longer than 107 bytes (it must fit sockaddr_un::sun_path with its terminator),
    // before the sandbox is asked; connection_refused when nothing listens there (no such file,
    // not a socket, a refusal, a full backlog) or the connect failed otherwise (never a reason to
    // quarantine); permission_denied when the socket's permissions refuse it; limit_exceeded when
    // out of descriptors or memory; not_supported where the backend has no agent to connect
    // (e2b). Cancellation: the connection is dropped.
    virtual asio::awaitable<result<asio::local::stream_protocol::socket>> async_connect_unix(
        std::string id, std::string path);

    // A watch of the directory at the absolute `path` in the sandbox (watch.hpp): its events
    // read from inside the sandbox (local: an inotify instance the sandbox's pid 1 makes, its
    // watches added there, its events read by this process). The path is resolved as the file
    // calls resolve it, with the sandbox user's permissions. Errors: the per-path ones of
    // files.hpp (file_not_found: no such directory; invalid_path: not a directory, or a malformed
    // path; permission_denied), limit_exceeded (the sandbox's inotify limits, or out of
    // descriptors), not_supported (a backend without watches: the default, e2b).
    virtual asio::awaitable<result<dir_watch>> async_watch_dir(std::string id, std::string path,
                                                               watch_options options);

    // The name (and port) under which an HTTP(S) client reaches `port` of the sandbox, without
    // scheme: e2b "<port>-<id>.<domain>" (the provider's proxy). not_supported when the backend
    // offers no such name (local: sandbox::async_port_host forwards a loopback port instead).
    virtual result<std::string> port_host(const std::string& id, std::uint16_t port) const;
};

// Drains a stream into head + tail captures. Used by backend::async_exec.
asio::awaitable<result<exec_result>> async_collect(exec_stream stream, output_limits limits);

}  // namespace moat
