// moat::session_store: where a session key maps to its sandbox, shared by every worker (process,
// host) that serves the same conversations. This header is the contract every store implements:
// the memory store (one process), the host-local store (processes on one host, lock files under
// the local state directory) and the Redis store (src/store/) behave the same way.
//
// An entry records which sandbox serves a key, its rebuild generation and its last use. Workers
// never create a session's sandbox without first holding the key's *claim*: a lease with a
// fencing token that the store grants to one caller at a time. The claim holder creates the
// sandbox, renews the lease while it works, and commits the entry with its token; a holder whose
// lease expired (it died, or paused too long) cannot commit any more, so it can never overwrite
// its successor's entry. Everyone else waits for the entry (bounded by its own deadline) and
// attaches to the sandbox it names. The same claim, asked for with the id of the sandbox that was
// found gone, is the compare-and-set for rebuilds: of two workers that both saw the sandbox gone,
// one wins and rebuilds, the other finds the new entry.
//
// Every operation is one atomic step of the store (one Redis round trip: `SET NX PX` or one Lua
// script); none holds anything across calls except the claim's lease, which expires by itself.
// The store's own clock measures leases, entry TTLs and idle time, so workers on hosts whose
// clocks disagree still agree on them.
//
// Every operation completes by `limit` (deadline{}: none given, the store's own timeouts bound
// it). Errors: a store that cannot be reached, does not answer by `limit` or answers outside its
// protocol fails the operation with errc::store_unavailable (not deadline_exceeded: the caller
// learns which part failed), with a one-line detail that never contains a credential; the
// caller's cancellation is errc::cancelled. A precondition that does not hold (a lost claim, an
// entry naming another sandbox) is not an error but the operation's answer. Implementations are
// confined to the executor they were made with unless they say otherwise.
#pragma once

#include <moat/deadline.hpp>
#include <moat/result.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace moat {

// What a store knows about one key.
struct session_record {
    // The committed sandbox ("" while the first claim of the key has not been committed yet).
    std::string sandbox_id;
    // 0 for the key's first sandbox, +1 for every rebuild (the committer sets it).
    std::uint64_t generation = 0;
    // The highest generation whose rebuild notice an acquirer has taken (see async_touch). A
    // rebuild is still to be announced while generation > noticed.
    std::uint64_t noticed = 0;
    // Time since the last commit or touch, on the store's clock.
    std::chrono::milliseconds unused_for{0};
    // A claim is held on the key right now (its lease has not expired).
    bool claimed = false;
    // The key's sandbox was ended for idleness and the entry kept as a marker (async_erase with
    // `remember_for`): sandbox_id is "", generation and noticed are the ended sandbox's. The next
    // commit is a rebuild (generation + 1), so the model is told, once, that its files and
    // variables are gone, whichever worker serves the conversation next.
    bool ended = false;
};

// The answer to async_claim.
struct session_claim {
    // Set when this caller now holds the claim: the fencing token for renew, commit and release.
    std::optional<std::string> token;
    // The key's entry as it was when the claim was decided (none: no entry).
    std::optional<session_record> current;
};

// The answer to async_touch when the entry still names the sandbox.
struct session_touch {
    // This touch took the rebuild notice: the entry's generation was above `noticed`, and this
    // call (asked to take it) raised `noticed` to it. Exactly one touch per generation sees true.
    bool notice = false;
    session_record current;  // after the touch
};

class session_store {
  public:
    virtual ~session_store() = default;

    // The key's entry, or none. A lease that expired is reported as not claimed.
    virtual asio::awaitable<result<std::optional<session_record>>> async_get(std::string key,
                                                                             deadline limit) = 0;

    // Claims `key` for `lease` when no live claim is held on it and its committed sandbox id is
    // `expected` ("" for a key with no entry, or one whose entry holds no sandbox yet). On success
    // the answer carries a new token, unique to this claim; otherwise it carries no token and the
    // current entry, so the caller can wait for the holder or attach. An expired lease counts as no
    // claim: its holder's token is dead from then on.
    virtual asio::awaitable<result<session_claim>> async_claim(std::string key,
                                                               std::string expected,
                                                               std::chrono::milliseconds lease,
                                                               deadline limit) = 0;

    // Moves the claim's lease to `lease` from now. False: the token no longer holds the claim
    // (expired, or released); the caller must stop and not commit.
    virtual asio::awaitable<result<bool>> async_renew(std::string key, std::string token,
                                                      std::chrono::milliseconds lease,
                                                      deadline limit) = 0;

    // Fenced commit: when `token` still holds the claim, sets the entry to `sandbox_id` with
    // `generation` (keeping `noticed` from the previous entry, 0 if there was none), resets its
    // last use, makes it expire after `ttl` (the sandbox's TTL) and releases the claim. False: the
    // claim was lost and nothing was written (the caller destroys what it made). Idempotent for
    // its token: repeating a commit that happened (the answer was lost: a dropped connection, a
    // timeout) answers true and changes nothing, so a caller retries an error with the same token
    // (the session manager does) and never destroys a sandbox the store names.
    virtual asio::awaitable<result<bool>> async_commit(std::string key, std::string token,
                                                       std::string sandbox_id,
                                                       std::uint64_t generation,
                                                       std::chrono::milliseconds ttl,
                                                       deadline limit) = 0;

    // Gives a claim up without committing (the create failed). A token that no longer holds the
    // claim is ignored.
    virtual asio::awaitable<result<void>> async_release(std::string key, std::string token,
                                                        deadline limit) = 0;

    // Marks a use of the session: when the entry still names `sandbox_id`, resets its last use and
    // moves its expiry to `ttl` from now; with `take_notice`, also takes a pending rebuild notice.
    // None: the entry is gone or names another sandbox (nothing was changed).
    virtual asio::awaitable<result<std::optional<session_touch>>> async_touch(
        std::string key, std::string sandbox_id, std::chrono::milliseconds ttl, bool take_notice,
        deadline limit) = 0;

    // Removes the entry when it still names `sandbox_id` and, given `unused_at_least`, when it has
    // not been used for at least that long (the shared idle timeout: a use on another worker a
    // moment ago keeps it). True: this call removed it. A live claim on the key is not touched.
    // Given `remember_for`, the entry is not deleted but marked ended (session_record::ended) for
    // that long: it names no sandbox, keeps its generation and noticed, and a claim expecting ""
    // takes it like a key with no entry.
    virtual asio::awaitable<result<bool>> async_erase(
        std::string key, std::string sandbox_id,
        std::optional<std::chrono::milliseconds> unused_at_least,
        std::optional<std::chrono::milliseconds> remember_for, deadline limit) = 0;

    // Whether other processes can see this store's entries (host, Redis). The manager checks a
    // shared entry's sandbox for this session's label before handing it out.
    virtual bool is_shared() const noexcept = 0;
};

// In this process only (thread-safe: several managers on several executors may share one).
// Leases, TTLs and idle time are measured on the steady clock, as the shared stores do on theirs.
std::shared_ptr<session_store> make_memory_session_store();

// The host-local store: every process on this host that uses the same directory shares its
// sessions (the CLI's default without --store). One small file per key, replaced atomically
// (a temporary file renamed over it), guarded by a lock file per key (flock). Taking a lock never
// blocks the executor: it is retried on a timer until `lock_wait` passes, then the operation fails
// with store_unavailable. Leases, TTLs and idle time use CLOCK_MONOTONIC, which all processes on
// one host share. Keys are at most 120 bytes (invalid_argument otherwise).
struct host_store_options {
    // Made 0700 if missing. Default: "<the local backend's default state directory>/sessions"
    // (/run/moat/sessions as root).
    std::string directory;
    std::chrono::milliseconds lock_wait = std::chrono::seconds(2);
};

std::shared_ptr<session_store> make_host_session_store(asio::any_io_executor executor,
                                                       host_store_options options = {});

}  // namespace moat
