// moat::sandbox: the handle to one sandbox, made by moat::runtime (runtime.hpp). This is what
// code above the backend uses: it orders operations, enforces deadlines, and stops vouching for a
// sandbox the moment it cannot.
//
// Ordering: operations on one handle run one at a time in arrival order (FIFO); different handles
// run in parallel. A caller's deadline counts from the call, time spent queued included; an
// operation whose deadline passes or whose caller cancels it while queued leaves the queue without
// running (errc::deadline_exceeded / errc::cancelled).
//
// The side lane: a caller to whom an operation's order does not matter (a stat, a listing, a
// read, a process or transfer independent of the others, as every call of E2B's envd is) passes
// lane::side. Side operations run beside the ordered queue, at most
// handle_options::side_lane_width at once (more wait their turn, FIFO, under their deadline); they
// neither wait for the ordered lane nor hold it up, and the handle's state (ready/busy) speaks of
// the ordered lane alone. Everything else applies to both lanes alike: deadlines, cancellation,
// quarantine (queued operations of both lanes are refused) and destroy (running ones are stopped).
//
// Transfers that stall: a streamed file transfer whose other side makes no progress for
// handle_options::transfer_stall_limit (a read stream nobody pulls, a write whose byte_source
// yields nothing) gives up its place in its lane and fails with errc::deadline_exceeded (a write
// is abandoned and its temporary file removed; a read stream is closed, and its next pull says
// why), so an idle peer cannot hold a sandbox.
//
// Stopping a running operation (Asio per-operation cancellation, or its deadline): the handle
// tells the backend to stop it (an exec's process group is killed), waits up to the backend's own
// stop grace (backend::stop_grace()) plus handle_options::kill_grace for the stop to be
// confirmed, and completes with errc::cancelled or errc::deadline_exceeded. A confirmed stop
// leaves the sandbox ready; the outer bound strictly covers the backend's, so a stop the backend
// confirms within its own grace never quarantines.
//
// No exception escapes these operations: each is its own exception boundary, and the queue turn
// an operation holds is handed on however it ends (a cancellation at any point, an exception).
//
// States (docs/lifecycle.md):
//
//   ready <-> busy                 one operation at a time
//   ready/busy -> quarantined      the handle can no longer vouch for the sandbox
//   quarantined -> destroying      at once, by the handle itself
//   ready/busy -> destroying       async_destroy()
//   destroying -> destroyed        absence confirmed by the backend
//   destroying -> destroy_failed   not confirmed; the sandbox's record stays for the janitor
//
// Quarantine causes: a backend or transport failure in the middle of an operation
// (backend_failure, protocol_error), the sandbox ending or vanishing underneath the handle
// (sandbox_unavailable, sandbox_not_found: pid 1 died, its helper died, someone else destroyed
// it), a stop that was not confirmed within the kill grace, an operation that outlived its
// deadline by the kill grace. Afterwards every operation fails at once with
// errc::sandbox_unavailable whose detail names the original cause. A program that exits non-zero,
// hits its wall limit or runs out of memory, truncated output, caller errors (invalid_argument,
// per-path file errors) and limit_exceeded never quarantine.
//
// Confined to the runtime's executor. The runtime and its backend must outlive every handle.
#pragma once

#include <moat/backend.hpp>
#include <moat/deadline.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moat {

enum class handle_state { ready, busy, quarantined, destroying, destroyed, destroy_failed };

// "ready", "busy", "quarantined", "destroying", "destroyed", "destroy_failed".
const char* to_string(handle_state state) noexcept;

// Which lane an operation takes (see "The side lane" above).
enum class lane {
    ordered,  // the default: after every operation called before it, one at a time
    side,     // beside the ordered queue, a bounded number at once
};

// What an operation does when it finds its sandbox paused (sandbox::async_pause, by this handle or
// another process): resume it first (the default: code that knows nothing of pauses works on, and
// the resume is the operation's first step, under its deadline), or fail at once with
// errc::sandbox_paused, the sandbox left paused. Pause, resume, usage, extend_ttl and destroy
// never resume.
enum class paused_policy { resume, fail };

struct handle_options {
    // How long beyond the backend's own stop grace (backend::stop_grace(), 2 s for the local
    // backend) a cancelled or timed-out operation may take to confirm that it stopped before the
    // handle quarantines the sandbox.
    std::chrono::milliseconds kill_grace = std::chrono::seconds(1);
    // Side-lane operations that may run at once on one sandbox (at least 1).
    std::size_t side_lane_width = 8;
    // How long a streamed transfer may go without progress: between two pulls of a read stream
    // (the time a pull takes does not count), and for one call of a write's byte_source. Zero:
    // no limit.
    std::chrono::milliseconds transfer_stall_limit = std::chrono::seconds(30);
    // Directory watches (async_watch_dir) one handle may have open at once.
    std::size_t max_watches = 64;
    // Operations on a paused sandbox (see paused_policy).
    paused_policy on_paused = paused_policy::resume;
};

class sandbox {
  public:
    struct impl;
    explicit sandbox(std::shared_ptr<impl> state) : impl_(std::move(state)) {}
    // Dropping the handle without destroying it destroys the sandbox in the background
    // (confirmed through the backend), unless the handle was attached or its sandbox was
    // created with survive_owner: those are detached, and the sandbox lives on.
    ~sandbox();
    sandbox(const sandbox&) = delete;
    sandbox& operator=(const sandbox&) = delete;

    const std::string& id() const noexcept;
    // What create or attach reported.
    const sandbox_info& info() const noexcept;
    handle_state state() const noexcept;
    // Why the handle was quarantined; nullopt if it was not.
    const std::optional<error>& quarantine_cause() const noexcept;
    // Operations waiting for their turn, in either lane (not counting those running).
    std::size_t queued() const noexcept;
    // Side-lane operations running now (streams that hold a place included).
    std::size_t running_beside() const noexcept;

    // The backend's operations (backend.hpp), ordered (or in the side lane) and bounded as above.
    // A default deadline never passes: the operation is then bounded by its own limits (an exec
    // by its wall limit).
    asio::awaitable<result<exec_result>> async_exec(exec_request request, deadline limit = {},
                                                    lane in = lane::ordered);
    // The stream holds its place in its lane until it ends or is dropped (dropping kills the
    // program); `limit` bounds the whole stream: past it the next pull stops the program and
    // fails with deadline_exceeded.
    asio::awaitable<result<exec_stream>> async_exec_stream(exec_request request,
                                                           deadline limit = {},
                                                           lane in = lane::ordered);
    // Starts a background process and returns once it runs; it does not hold the turn (exec.hpp,
    // moat::process). `limit` bounds the start only.
    asio::awaitable<result<process>> async_spawn(exec_request request, deadline limit = {},
                                                 lane in = lane::ordered);
    // A command on a terminal of the sandbox's own, and a reattachment to one (terminal.hpp,
    // backend.hpp). Like a spawn, the call returns once the command runs and the terminal never
    // holds a place in a lane; the side lane by default, so opening one neither waits for nor
    // holds up the ordered queue.
    asio::awaitable<result<terminal>> async_open_terminal(exec_request request, terminal_size size,
                                                          deadline limit = {},
                                                          lane in = lane::side);
    asio::awaitable<result<terminal>> async_attach_terminal(int pid, deadline limit = {},
                                                            lane in = lane::side);
    asio::awaitable<result<std::vector<file_write_result>>> async_write_files(
        std::vector<file_write> files, deadline limit = {}, lane in = lane::ordered);
    asio::awaitable<result<std::vector<file_read_result>>> async_read_files(
        std::vector<std::string> paths, deadline limit = {}, lane in = lane::ordered);
    // Streaming file transfer (backend.hpp, files.hpp). The write holds its place in its lane
    // until it completes (or stalls: transfer_stall_limit); `limit` bounds the whole write (the
    // source's calls included): past it the write is abandoned (temporary file removed) and fails
    // with deadline_exceeded.
    asio::awaitable<result<file_write_result>> async_write_file_stream(file_write_target target,
                                                                       byte_source source,
                                                                       deadline limit = {},
                                                                       lane in = lane::ordered);
    // The stream holds its place in its lane until its last chunk was pulled, a pull failed, it
    // is dropped, or nobody pulled it for transfer_stall_limit; `limit` bounds the whole stream:
    // past it the next pull fails with deadline_exceeded and the stream is finished.
    asio::awaitable<result<file_read_stream>> async_read_file_stream(std::string path,
                                                                     deadline limit = {},
                                                                     lane in = lane::ordered);
    asio::awaitable<result<std::vector<file_metadata_result>>> async_read_metadata(
        std::vector<std::string> paths, deadline limit = {}, lane in = lane::ordered);
    asio::awaitable<result<file_stat>> async_stat(std::string path, deadline limit = {},
                                                  lane in = lane::ordered);
    asio::awaitable<result<std::vector<dir_entry>>> async_list_dir(std::string path,
                                                                   deadline limit = {},
                                                                   lane in = lane::ordered);
    asio::awaitable<result<sandbox_info>> async_extend_ttl(std::chrono::milliseconds ttl,
                                                           deadline limit = {});
    // Pause in place and resume (backend::async_pause, async_resume): its commands frozen, its
    // memory, processes and files kept; its TTL stands still and its paused lifetime
    // (sandbox_spec::paused_lifetime) counts instead. Ordered: a pause waits for the operations
    // called before it. Both are idempotent and return the sandbox's info (state `paused` or
    // `running`). What other operations do meanwhile: handle_options::on_paused.
    asio::awaitable<result<sandbox_info>> async_pause(deadline limit = {});
    asio::awaitable<result<sandbox_info>> async_resume(deadline limit = {});
    // What the sandbox uses now (backend::async_usage, moat/usage.hpp), on the side lane by
    // default: a reading never waits behind a long command. Keep readings in a usage_history for
    // a series (CPU as a share of the sandbox's CPUs between two readings).
    asio::awaitable<result<sandbox_usage>> async_usage(deadline limit = {}, lane in = lane::side);

    // Replaces the sandbox's egress rules while it runs (backend::async_update_network): the side
    // lane by default, so a long command does not hold it up (its proxied connections meet the
    // new rules). On success info().network is the new network.
    asio::awaitable<result<sandbox_info>> async_update_network(sandbox_network network,
                                                               deadline limit = {},
                                                               lane in = lane::side);

    // Ports (backend.hpp): a TCP connection to `port` on the sandbox's own loopback, made from
    // inside the sandbox, on the runtime's executor; the sandbox never gets a route. The side lane
    // by default: a connection neither waits for nor holds up the ordered lane (a server the
    // sandbox runs in the background answers while a command runs). `limit` bounds the connect.
    // Errors: connection_refused (nothing listens there yet), permission_denied (a port moat
    // itself uses in the sandbox: never forwarded), not_supported (e2b: use async_port_host).
    asio::awaitable<result<asio::ip::tcp::socket>> async_connect_port(std::uint16_t port,
                                                                      deadline limit = {},
                                                                      lane in = lane::side);
    // A stream connection to the unix-domain (SOCK_STREAM) socket at the absolute `path` in the
    // sandbox's filesystem (a supervisor the sandbox runs), connected from inside the sandbox by
    // its agent, on the runtime's executor; the side lane by default, like async_connect_port.
    // `limit` bounds the connect. Errors: invalid_argument (`path` empty, not absolute, with a NUL
    // or longer than 107 bytes: it must fit sockaddr_un::sun_path), connection_refused (nothing
    // listens there: no such file, not a socket, a full backlog, any other connect failure; never
    // a reason to quarantine), permission_denied (the socket's permissions), limit_exceeded (out
    // of descriptors or memory), not_supported (e2b). Cancellation: the connection is dropped.
    asio::awaitable<result<asio::local::stream_protocol::socket>> async_connect_unix(
        std::string path, deadline limit = {}, lane in = lane::side);
    // A watch of the directory at the absolute `path` in the sandbox (watch.hpp): its events,
    // pulled with dir_watch::async_next. The side lane by default: opening it neither waits for
    // nor holds up the ordered lane, and once open the watch holds no place in either lane.
    // `limit` bounds the opening. At most handle_options::max_watches per handle
    // (limit_exceeded past it, until one is dropped). The watch ends (a watch_end) when the
    // directory is removed or the sandbox ends (destroyed, quarantined); dropping it releases
    // everything it holds. Errors: the per-path ones of files.hpp (file_not_found: no such
    // directory; invalid_path: not a directory, a malformed path; permission_denied),
    // limit_exceeded, not_supported (e2b); none of them quarantines.
    asio::awaitable<result<dir_watch>> async_watch_dir(std::string path, watch_options options = {},
                                                       deadline limit = {}, lane in = lane::side);
    // Where an HTTP(S) client reaches `port`, as "host:port" or a host name without scheme: the
    // backend's own name for it (e2b: "<port>-<id>.<domain>"), or, on a backend that connects
    // ports itself (local), "127.0.0.1:<n>": a loopback listener this handle opens on first use
    // (one per port) whose every connection is one async_connect_port, closed when the handle
    // quarantines, is destroyed or is dropped. The name does not check that anything listens:
    // a connection to it then ends at once. Errors: the backend's, or backend_failure when no
    // loopback port can be bound; sandbox_unavailable once the handle no longer vouches.
    asio::awaitable<result<std::string>> async_port_host(std::uint16_t port);

    // Ends the sandbox and returns once the backend confirmed it gone. Queued operations fail with
    // sandbox_unavailable; a running one is stopped first. Idempotent: a handle that is already
    // destroyed (or being destroyed after a quarantine) returns that destroy's outcome.
    // Cancellation: none; the destroy runs to its confirmation or the backend's bound.
    asio::awaitable<result<void>> async_destroy();

  private:
    std::shared_ptr<impl> impl_;
};

}  // namespace moat
