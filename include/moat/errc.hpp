// moat's error codes and the conditions that group them.
//
// Every failure a moat operation reports is a std::error_code in moat's category (moat::errc) plus
// a one-line detail (see result.hpp). Values are stable and only ever appended, so they can be
// logged, stored and compared across versions. Callers branch on the *condition* (what kind of
// failure it is), not on which layer produced it:
//
//     if (r.error().code == moat::condition::retryable) { ... }
//
// What a sandboxed program did (exit code, signal, wall timeout, OOM kill, truncated output) is
// never an error: it is data in moat::exec_result.
#pragma once

#include <system_error>

namespace moat {

enum class errc : int {
    // The caller cancelled the operation (Asio per-operation cancellation); the work it started was
    // stopped and that was confirmed. (An unconfirmed stop is backend_failure.)
    cancelled = 1,
    // The caller's deadline passed before the operation completed; the work was stopped.
    deadline_exceeded = 2,
    // A request was malformed: a bad argument, an empty command, a negative limit. Not retryable.
    invalid_argument = 3,
    // No sandbox with that id exists (or it was never visible to this caller).
    sandbox_not_found = 4,
    // The sandbox handle can no longer vouch for the sandbox (quarantined, destroyed, or its pid 1
    // died); the detail names the original cause.
    sandbox_unavailable = 5,
    // An admission limit (live sandboxes, create rate, batch size) refused the request.
    limit_exceeded = 6,
    // An isolation layer or resource limit the spec asks for cannot be enforced on this host, and
    // the spec did not allow best effort; or the host is set up so that no sandbox can be made at
    // all (the local helper is not root, its state directory is unreachable). The detail names the
    // layer or the setup step. Retrying does not help until the host changes.
    layer_unavailable = 7,
    // The backend failed: a system call, the helper process, a remote provider's 5xx.
    backend_failure = 8,
    // A peer (helper, agent, remote service) sent something that breaks the protocol.
    protocol_error = 9,
    // The backend does not implement this operation.
    not_supported = 10,
    // The runtime is shutting down and admits no new work.
    shutting_down = 11,
    // File operations (per path).
    file_not_found = 12,
    invalid_path = 13,
    is_directory = 14,
    permission_denied = 15,
    too_large = 16,
    // A remote service rejected the credentials (HTTP 401, Connect unauthenticated). Not
    // retryable with the same credentials.
    unauthorized = 17,
    // A remote service refused the request for its rate (HTTP 429, Connect resource_exhausted).
    // Retryable; when the server said how long to wait (Retry-After), the detail ends with
    // "retry after <N> s" and the HTTP layer's status_error carries it as a duration.
    rate_limited = 18,
    // The session store (a shared store: the host's session files, Redis) could not be reached,
    // timed out within the caller's deadline, or answered outside its protocol. The session
    // manager fails the acquire rather than create a second sandbox for a session it cannot see.
    // The detail never contains the store's credentials. Retry later; it is not the sandbox's
    // fault.
    store_unavailable = 19,
    // Nothing accepted a connection to a sandbox's port (backend::async_connect_port): no server
    // listens there, or not yet. Retryable: a server that is still starting accepts later.
    connection_refused = 20,
    // The sandbox is paused (sandbox::async_pause) and the caller chose to fail rather than
    // resume it (handle_options::on_paused = paused_policy::fail): resume it, then retry.
    sandbox_paused = 21,
};

// Kinds of failure, for branching. A code belongs to at most one condition.
enum class condition : int {
    cancelled = 1,     // errc::cancelled
    timeout = 2,       // errc::deadline_exceeded
    retryable = 3,     // backend_failure, limit_exceeded, rate_limited, connection_refused: the
                       // same request may succeed later
    caller_error = 4,  // invalid_argument, invalid_path, file_not_found, is_directory, too_large,
                       // permission_denied, not_supported, sandbox_not_found, unauthorized,
                       // sandbox_paused
    backend_failure = 5,  // protocol_error, layer_unavailable: the backend cannot do this as is
    unavailable = 6,      // sandbox_unavailable, shutting_down, store_unavailable
};

const std::error_category& error_category() noexcept;
const std::error_category& condition_category() noexcept;

std::error_code make_error_code(errc e) noexcept;
std::error_condition make_error_condition(condition c) noexcept;

// The enumerator's name ("deadline_exceeded"), for logs and JSON.
const char* to_string(errc e) noexcept;

}  // namespace moat

template <>
struct std::is_error_code_enum<moat::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<moat::condition> : std::true_type {};
