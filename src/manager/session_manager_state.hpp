// What the session manager's files share: the manager's state (session_manager::state) and the
// contract between them.
//
// - session_manager.cpp: the manager itself: its events, the specs and labels of the sandboxes it
//   creates, leases and what dropping one does, one-shot runs, the warm pool, and the public
//   entry points (each binds the state and puts the one exception boundary on top).
// - session_acquire.cpp: how a key gets its sandbox: the session already in this process, else
//   through the store (attach to the entry's sandbox, or claim the key, create, seed and commit
//   fenced, or wait for the claim's holder), else, with local_fallback, this process alone.
// - session_policies.cpp: how sessions end (docs/policies.md): the watcher (idle timeout, max
//   lifetime, heartbeats, lost sandboxes), an end by key, the idle end over a shared store, and
//   the shutdown.
//
// The state is confined to the manager's executor; background work (touches, heartbeats, ends,
// refills, claim renewals) runs in `tasks` and holds the state by a shared_ptr.
#pragma once

#include <moat/log.hpp>
#include <moat/session_manager.hpp>
#include <moat/task_group.hpp>

#include "core/async_event.hpp"

#include <asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moat {

namespace manager_detail {

inline bool usable(const sandbox& box) {
    return box.state() == handle_state::ready || box.state() == handle_state::busy;
}

// Label values are printable ASCII (sandbox_spec); other keys are simply not labelled.
inline bool printable_label(const std::string& text) {
    return !text.empty() && text.size() <= 200 &&
           std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

// A store failure as the acquire reports it: store_unavailable, whatever the store said, except
// the caller's own cancellation.
inline error store_failure(error e) {
    if (e.code == errc::cancelled || e.code == errc::store_unavailable) return e;
    return make_error(errc::store_unavailable, "the session store failed: " + e.to_string());
}

// How long an end or a background step may wait for the store.
inline constexpr std::chrono::seconds store_step_limit{5};

}  // namespace manager_detail

struct session_manager::state : std::enable_shared_from_this<session_manager::state> {
    using clock = std::chrono::steady_clock;

    struct session {
        std::string key;
        std::shared_ptr<sandbox> box;
        clock::time_point created;
        clock::time_point last_used;
        clock::time_point last_heartbeat;
        clock::time_point last_touch;
        std::size_t holds = 0;
        bool local_only = false;     // options.local_fallback made it: not in the store
        bool idle_checking = false;  // an idle end is being decided with the store
        bool paused = false;         // paused while idle (pause_when_idle), since paused_at
        clock::time_point paused_at;
    };

    struct opened_session {
        std::shared_ptr<session> s;
        bool rebuilt = false;
    };

    // Concurrent first users of one key wait for the one create.
    struct pending {
        explicit pending(const asio::any_io_executor& ex) : done(ex) {}
        async_event done;
        std::optional<result<opened_session>> outcome;
    };

    // Dropped with the lease: the session is no longer in use (touched here and in the store).
    struct hold {
        std::weak_ptr<session> s;
        std::weak_ptr<state> owner;
        ~hold();
    };

    // The claim holder's lease renewal, stopped when the create is over (session_acquire.cpp).
    struct claim_keeper;

    state(runtime& rt, manager_options o, std::shared_ptr<session_store> st)
        : sandboxes(rt),
          executor(rt.get_backend().get_executor()),
          options(std::move(o)),
          layout(rt.get_backend().layout_for(options.spec.layout)),
          store(std::move(st)),
          tasks(executor, "session manager") {}

    // --- the manager (session_manager.cpp)

    // Logs an end and calls options.on_event.
    void emit(manager_event::kind what, const std::string& key, const std::string& id,
              std::optional<end_reason> reason = std::nullopt, std::string detail = {});
    // The spec of a sandbox made for `policy` ("session", "pool", "call"), labelled with the key.
    sandbox_spec spec_for(const char* policy, const std::string& key) const;
    session_lease lease(const std::shared_ptr<session>& s, bool rebuilt);
    std::shared_ptr<session> new_session(const std::string& key, std::shared_ptr<sandbox> box);
    // Why a session whose sandbox is no longer usable ended.
    static end_reason lost_reason(const sandbox& box);

    asio::awaitable<result<exec_result>> run_once(exec_request request,
                                                  std::vector<file_write> inputs, deadline limit);
    static asio::awaitable<result<exec_result>> use_once(std::shared_ptr<sandbox> box,
                                                         exec_request request,
                                                         std::vector<file_write> inputs,
                                                         deadline limit);
    asio::awaitable<result<std::shared_ptr<sandbox>>> take_warm(deadline limit);
    static asio::awaitable<void> destroy_quietly(std::shared_ptr<sandbox> box);
    void start_refill();
    static asio::awaitable<void> refill(std::shared_ptr<state> self);

    // --- acquiring a session (session_acquire.cpp)

    asio::awaitable<result<session_lease>> acquire(std::string key, deadline limit);

    // The session in this process, if its sandbox still runs and the store still names it.
    // None: go through the store (lost says the sandbox is gone).
    struct local_outcome {
        std::optional<session_lease> lease;
        bool lost = false;
    };
    asio::awaitable<result<local_outcome>> reuse_local(std::string key, deadline limit);

    // The session's sandbox through the store: attach to the entry's, else claim the key and
    // create (a rebuild when the entry's sandbox is gone), else wait for the claim's holder.
    asio::awaitable<result<opened_session>> open_session(std::string key, deadline limit,
                                                         bool lost);
    // A stored id is a claim about another system: the sandbox must exist, run and carry this
    // session's label. None: it is gone, or it is not this session's (refused, with an event).
    asio::awaitable<result<std::shared_ptr<sandbox>>> adopt(const std::string& key,
                                                            const std::string& id, deadline limit);
    // Holding the claim: sweep what a dead predecessor left, create, seed, commit fenced. None:
    // the claim was lost before the commit (the new sandbox is destroyed).
    asio::awaitable<result<std::optional<opened_session>>> create_claimed(
        std::string key, std::string token, std::uint64_t generation, bool rebuild, deadline limit);
    asio::awaitable<void> release_claim(const std::string& key, const std::string& token);
    // Sandboxes labelled for this session (and with this manager's labels) that the store does not
    // name: what a creator that died before its commit left. Only the claim holder sweeps, so
    // nothing another live worker is still making is touched (a holder whose lease ran out cannot
    // commit what it makes anyway).
    asio::awaitable<void> sweep_strays(const std::string& key, deadline limit);
    static asio::awaitable<void> renew_claim(std::shared_ptr<state> self, std::string key,
                                             std::string token,
                                             std::shared_ptr<claim_keeper> keeper);
    // With options.local_fallback, a store failure is served from this process alone.
    asio::awaitable<result<opened_session>> fall_back(std::string key, deadline limit, bool lost,
                                                      error failure);
    // A new sandbox for the session `key`, seeded (options.seed, told whether it is a rebuild);
    // one whose seed failed is destroyed.
    asio::awaitable<result<std::shared_ptr<sandbox>>> create_seeded(const std::string& key,
                                                                    bool rebuilt, deadline limit);
    // The application's seed hook, called inside a coroutine so that guarded() also catches what
    // the hook throws before it returns its awaitable.
    static asio::awaitable<result<void>> call_seed(
        std::function<asio::awaitable<result<void>>(std::shared_ptr<sandbox>, bool)> seed,
        std::shared_ptr<sandbox> box, bool rebuilt);

    // --- how sessions end (session_policies.cpp)

    // How long the store keeps a marker for a session that ends for `reason` (none: the entry
    // goes). Only the caller's own async_end forgets the conversation.
    std::optional<std::chrono::milliseconds> marker_for(end_reason reason) const;
    // Ends a session: its entry goes from the store (unless `erase_entry` is false: a lost
    // sandbox's entry stays for the rebuild), its sandbox is destroyed and confirmed.
    asio::awaitable<result<void>> end_session(std::shared_ptr<session> s, end_reason reason,
                                              bool erase_entry = true);
    asio::awaitable<result<void>> end_by_key(std::string key, end_reason reason);
    // A released lease: the store records the use, so other workers' idle clocks restart too.
    static asio::awaitable<void> touch_in_background(std::shared_ptr<state> self,
                                                     std::shared_ptr<session> s);
    // The shared idle timeout: the store removes the entry only if no worker used it for
    // idle_timeout; otherwise this worker takes the store's last use as its own.
    static asio::awaitable<void> end_if_idle(std::shared_ptr<state> self,
                                             std::shared_ptr<session> s);
    // pause_when_idle: pauses an idle session's sandbox, then ends the paused ones paused
    // longest ago past max_paused or paused_memory_bytes (session_pause.cpp).
    static asio::awaitable<void> pause_if_idle(std::shared_ptr<state> self,
                                               std::shared_ptr<session> s);
    asio::awaitable<void> hold_paused_budget();
    clock::duration tick() const;
    // Idle and lifetime limits, heartbeats, lost sandboxes; the pool's TTL margin.
    static asio::awaitable<void> watch(std::shared_ptr<state> self);
    // Heartbeats go to the backend directly: they must not queue behind the very commands that
    // keep the session in use.
    static asio::awaitable<void> heartbeat(std::shared_ptr<state> self,
                                           std::shared_ptr<sandbox> box);
    static asio::awaitable<void> end_in_background(std::shared_ptr<state> self,
                                                   std::shared_ptr<session> s, end_reason reason,
                                                   bool erase_entry);
    static asio::awaitable<void> destroy_into(std::shared_ptr<sandbox> box, std::string key,
                                              std::shared_ptr<state> self,
                                              std::shared_ptr<std::size_t> remaining);
    // The boundary of async_shutdown, whose result is a report, not a result<T>: an exception
    // (none is expected: every wait below consumes cancellations) is logged, and every sandbox
    // not confirmed destroyed is reported as left.
    asio::awaitable<shutdown_report> shutdown_never_throwing(std::chrono::milliseconds grace);
    asio::awaitable<shutdown_report> shutdown(std::chrono::milliseconds grace);

    runtime& sandboxes;
    asio::any_io_executor executor;
    manager_options options;
    sandbox_layout layout;  // the sandboxes' effective layout (backend::layout_for the spec's)
    std::shared_ptr<session_store> store;
    task_group tasks;
    std::map<std::string, std::shared_ptr<session>> sessions;
    std::map<std::string, std::shared_ptr<pending>> inflight;
    std::deque<std::shared_ptr<sandbox>> pool;
    std::vector<std::shared_ptr<sandbox>> one_shots;
    bool refilling = false;
    bool shutting_down = false;
    asio::steady_timer* watch_timer = nullptr;  // the watcher's, while it runs
    std::size_t shutdown_destroyed = 0;
    async_event drained{executor};
};

}  // namespace moat
