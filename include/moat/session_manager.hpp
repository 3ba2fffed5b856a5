// moat::session_manager: what an agent server uses directly. It maps the server's conversations
// to sandboxes under one of three policies (docs/policies.md) and keeps them within their time
// limits:
//
// - per call (async_run_once): one request in a fresh sandbox, destroyed and confirmed whatever
//   happens (success, error, cancellation, deadline);
// - per session (async_acquire): the server's key (a conversation or thread id, never something a
//   model chose) maps to one sandbox. A live sandbox is reused; one that is gone, expired or
//   quarantined is replaced, the seed hook runs again, and the lease says `rebuilt` so the tool
//   layer can tell the model its earlier state is gone. Concurrent first use of one key creates
//   exactly one sandbox, across every worker sharing the store (the store's claim,
//   session_store.hpp); distinct keys proceed in parallel. The session store holds ids, not
//   objects; when it and the backend disagree, the backend is the truth, and a sandbox found
//   through the store is handed out only if it carries the label moat.session=KEY. With a
//   shared store, keys must be printable ASCII of at most 200 bytes (they are labels);
// - pooled (async_take_warm): warm sandboxes handed out once each and never returned; refilled in
//   the background through the runtime's admission control; none is handed out near its TTL.
//
// Time limits: a session idle for idle_timeout (no lease held, none taken) ends; a session older
// than max_lifetime ends even in use. While a lease is held the manager extends the sandbox's TTL
// every heartbeat_interval. Every end is reported with its reason through on_event.
//
// Confined to the runtime's executor. The runtime outlives the manager; call async_shutdown()
// before destroying the manager.
#pragma once

#include <moat/deadline.hpp>
#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>
#include <moat/session_store.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moat {

enum class end_reason { user_request, idle_timeout, max_lifetime, ttl, shutdown, error };

// "user_request", "idle_timeout", "max_lifetime", "ttl", "shutdown", "error".
const char* to_string(end_reason reason) noexcept;

// What happened, for logs and metrics. Carries no secrets (no environment, no output).
struct manager_event {
    // entry_refused: a store entry named a sandbox that does not carry this session's label (stale
    // or poisoned); it was not handed out, and the session was rebuilt. store_fallback: the store
    // failed and options.local_fallback served the acquire from this process alone.
    enum class kind {
        created,
        attached,
        rebuilt,
        ended,
        pool_refilled,
        pool_discarded,
        entry_refused,
        store_fallback
    };
    kind what = kind::created;
    std::string session_key;  // "" outside sessions
    std::string sandbox_id;
    std::optional<end_reason> reason;  // for `ended`
    std::string detail;
};

// "created", "attached", "rebuilt", "ended", "pool_refilled", "pool_discarded", "entry_refused",
// "store_fallback".
const char* to_string(manager_event::kind kind) noexcept;

struct manager_options {
    // The spec of every sandbox the manager creates. The manager adds labels moat.policy
    // (session, call, pool), moat.created (RFC 3339) and moat.session (the key, when printable).
    // The owner instance and the expiry are sandbox_info fields (and in the local records): the
    // expiry moves with every heartbeat, so a label would go stale.
    sandbox_spec spec;
    std::chrono::milliseconds idle_timeout = std::chrono::minutes(10);
    std::optional<std::chrono::milliseconds> max_lifetime;
    // A session that ends other than by async_end (idle_timeout, max_lifetime, shutdown) leaves a
    // marker in the store for this long (session_record::ended). If the conversation comes back
    // within it, on any worker, its next sandbox is a rebuild: the lease says `rebuilt`, once, so
    // the model learns that its files and variables are gone. 0: no marker (the next sandbox is
    // simply created).
    std::chrono::milliseconds remember_ended = std::chrono::hours(24);
    // While a lease is held, the sandbox's TTL is moved to spec.ttl from now this often.
    std::chrono::milliseconds heartbeat_interval = std::chrono::minutes(1);
    // Runs on every sandbox a session gets (rebuilt: it replaces one that was lost), before the
    // lease is handed out: upload inputs, install things. A failure fails the acquire and
    // destroys the new sandbox.
    std::function<asio::awaitable<result<void>>(std::shared_ptr<sandbox> box, bool rebuilt)> seed;
    // Warm sandboxes kept for async_take_warm; 0 disables the pool.
    std::size_t pool_size = 0;
    // A warm sandbox with less TTL left than this is destroyed instead of handed out.
    std::chrono::milliseconds pool_min_remaining_ttl = std::chrono::minutes(5);
    // Called for every event (on the executor); must not block.
    std::function<void(const manager_event&)> on_event;

    // On idle_timeout, pause the session's sandbox (sandbox::async_pause: its processes, memory
    // and files kept, no CPU used, its TTL standing still) instead of ending it. At most
    // max_paused sandboxes stay paused, holding at most paused_memory_bytes together (0: no
    // budget); past either, the one paused longest ago is ended (reason idle_timeout). The next
    // acquire of the key resumes it and its lease says `resumed`. max_lifetime and the sandbox's
    // paused lifetime (sandbox_spec::paused_lifetime) still end it. Off by default.
    bool pause_when_idle = false;
    std::size_t max_paused = 16;
    std::uint64_t paused_memory_bytes = 0;

    // Sharing a store between workers (session_store.hpp). The creator of a session's sandbox
    // holds the key's claim for claim_lease and renews it every claim_lease / 3 while it creates
    // and seeds; if it dies, another worker takes over once the lease has run out. Set it above
    // the longest create + seed plus a renewal's latency.
    std::chrono::milliseconds claim_lease = std::chrono::seconds(15);
    // While another worker holds the claim, a waiter reads the store this often, until the entry
    // is committed, the lease expires (it then claims itself) or its deadline passes.
    std::chrono::milliseconds claim_poll = std::chrono::milliseconds(20);
    // The longest an acquire without a deadline waits for another worker's create.
    std::chrono::milliseconds claim_wait = std::chrono::minutes(2);
    // When the store fails (store_unavailable), serve the acquire from this process alone (its
    // own sessions, or a fresh sandbox not recorded in the store) instead of failing it. RISK:
    // other workers cannot see that sandbox, so one conversation may get two sandboxes and its
    // state splits between them; the fallback is reported as a store_fallback event. Off by
    // default: an acquire fails with store_unavailable within its deadline.
    bool local_fallback = false;
};

// A session's sandbox while the caller uses it. Holding it keeps the session from idling out and
// keeps its TTL extended; dropping it touches the session.
struct session_lease {
    std::shared_ptr<sandbox> box;
    // A previous sandbox of this key was lost and this is the first lease handed out since, on
    // any worker sharing the store: its state is gone, tell the model. Exactly one acquire per
    // rebuild sees true (the store's generation and its `noticed` mark).
    bool rebuilt = false;
    std::shared_ptr<void> hold;
    // The session's sandbox was paused while idle (manager_options::pause_when_idle) and this
    // acquire resumed it: everything is as the caller left it, its processes and variables too.
    bool resumed = false;

    // Lets the session go before the lease itself goes out of scope (the same as dropping it):
    // the session is touched, and it may idle out from now on.
    void reset() noexcept {
        hold.reset();
        box.reset();
        rebuilt = false;
        resumed = false;
    }
};

struct shutdown_report {
    std::size_t destroyed = 0;
    std::vector<std::string> left;  // sandbox ids whose destroy was not confirmed
};

class session_manager {
  public:
    // Workers that share conversations share one store (make_host_session_store, the Redis store);
    // each worker has its own manager and runtime.
    session_manager(runtime& sandboxes, manager_options options,
                    std::shared_ptr<session_store> store = make_memory_session_store());
    ~session_manager();
    session_manager(const session_manager&) = delete;
    session_manager& operator=(const session_manager&) = delete;

    // Per call: `inputs` are written first (any failure fails the call), then `request` runs.
    asio::awaitable<result<exec_result>> async_run_once(exec_request request,
                                                        std::vector<file_write> inputs = {},
                                                        deadline limit = {});

    // The layout of the sandboxes it creates (backend::layout_for options.spec.layout), for the
    // layers above.
    const sandbox_layout& layout() const noexcept;
    // What the sandboxes it creates may reach (options.spec.network), for the tool descriptions.
    const sandbox_network& network() const noexcept;

    // Per session: attach-or-create for `key`. Through the store: attach to the sandbox its entry
    // names (checked live and labelled for this key), else claim the key and create (or rebuild);
    // while another worker holds the claim, wait for its entry. Errors: store_unavailable when the
    // store fails (unless options.local_fallback), deadline_exceeded when the deadline (or
    // claim_wait) passes while another worker creates, invalid_argument for an empty key or, with
    // a shared store, one that cannot be a label; the create's and the seed hook's errors.
    asio::awaitable<result<session_lease>> async_acquire(std::string key, deadline limit = {});

    // Ends a session (reason user_request unless given) and confirms its sandbox is gone. A key
    // this manager has not used itself is looked up in the store (another worker's session);
    // sandbox_not_found when neither knows it.
    asio::awaitable<result<void>> async_end(std::string key,
                                            end_reason reason = end_reason::user_request);

    // Pooled: a warm sandbox if one is ready (a queue pop), else a fresh one. The caller owns it;
    // it is never handed out again.
    asio::awaitable<result<std::shared_ptr<sandbox>>> async_take_warm(deadline limit = {});

    // Stops admitting work, destroys every session and pooled sandbox (reason shutdown; running
    // operations on them fail), and confirms within `grace`.
    asio::awaitable<shutdown_report> async_shutdown(
        std::chrono::milliseconds grace = std::chrono::seconds(10));

    std::size_t sessions() const noexcept;
    std::size_t warm() const noexcept;
    // Keys whose sandbox is being created or attached right now (their first acquirers wait for
    // that one create). Back to 0 whenever no acquire is under way, whatever happened to the
    // acquires before: for operators' checks and leak accounting.
    std::size_t acquiring() const noexcept;

    // The executor this manager (and its runtime's backend) is confined to.
    asio::any_io_executor get_executor() const;

    struct state;

  private:
    std::shared_ptr<state> state_;
};

}  // namespace moat
