// How a key gets its sandbox: the session already in this process if its sandbox still runs and
// the store still names it; else through the store: attach to the entry's sandbox, or claim the
// key and create, seed and commit fenced (sweeping what a dead predecessor left), or wait for the
// claim's holder; else, with local_fallback, this process alone. Concurrent first users of one key
// wait for the one create (session_manager_state.hpp).
#include "manager/session_manager_state.hpp"

#include "core/exception_boundary.hpp"

#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>

#include "core/asio_compat.hpp"

namespace moat {

using manager_detail::printable_label;
using manager_detail::store_failure;
using manager_detail::store_step_limit;
using manager_detail::usable;

// Tries of a commit whose outcome stays unknown.
constexpr int commit_attempts = 3;

// The fenced commit. A commit that fails with an error has an unknown outcome (the store's
// connection may have dropped after the store applied it, a reply may have timed out), so it is
// tried again with the same token, each try under store_step_limit and the caller's deadline: a
// commit is idempotent for its token (session_store.hpp), so a repeat of one that happened
// confirms it. True or false is the store's known answer; an error, still unknown after every try.
asio::awaitable<result<bool>> commit_until_known(std::shared_ptr<session_store> store,
                                                 std::string key, std::string token,
                                                 std::string sandbox_id, std::uint64_t generation,
                                                 std::chrono::milliseconds ttl, deadline limit) {
    result<bool> committed = make_error(errc::store_unavailable, "the commit was not tried");
    for (int attempt = 1; attempt <= commit_attempts; ++attempt) {
        const deadline step = earliest(limit, deadline::after(store_step_limit));
        auto committing =
            guarded(store->async_commit(key, token, sandbox_id, generation, ttl, step));
        committed = co_await std::move(committing);
        if (committed || committed.error().code == errc::cancelled || limit.has_expired()) break;
        detail::log(log_level::warning, "manager",
                    "committing session " + key + "'s sandbox " + sandbox_id + " (try " +
                        std::to_string(attempt) + " of " + std::to_string(commit_attempts) +
                        "): " + committed.error().to_string());
    }
    co_return committed;
}

// The claim holder's lease renewal, stopped when the create is over.
struct session_manager::state::claim_keeper {
    explicit claim_keeper(const asio::any_io_executor& ex) : timer(ex) {}
    asio::steady_timer timer;
    bool done = false;
    bool lost = false;
};

asio::awaitable<result<session_lease>> session_manager::state::acquire(std::string key,
                                                                       deadline limit) {
    if (shutting_down) co_return make_error(errc::shutting_down, "the manager is shutting down");
    if (key.empty()) co_return make_error(errc::invalid_argument, "empty session key");
    if (store->is_shared() && !printable_label(key)) {
        co_return make_error(errc::invalid_argument,
                             "a shared session key must be 1 to 200 printable ASCII "
                             "characters (it is the sandbox's moat.session label)");
    }
    auto self = shared_from_this();
    auto reusing = reuse_local(key, limit);
    auto local = co_await std::move(reusing);
    if (!local) co_return std::move(local).error();
    if (local->lease) co_return std::move(*local->lease);
    const bool lost = local->lost;
    if (auto it = inflight.find(key); it != inflight.end()) {
        auto p = it->second;
        while (!p->done.is_set()) {
            const auto waited = co_await p->done.async_wait(limit);
            if (waited == async_event::wait_outcome::cancelled) {
                co_return make_error(errc::cancelled, "acquire was cancelled");
            }
            if (waited == async_event::wait_outcome::deadline_passed) {
                co_return make_error(errc::deadline_exceeded,
                                     "acquire: the deadline passed while the session's "
                                     "sandbox was being created");
            }
        }
        if (!*p->outcome) co_return p->outcome->error();
        // The rebuild notice went to the acquire that opened it.
        co_return lease((*p->outcome)->s, false);
    }
    if (sessions.contains(key)) {
        auto again = acquire(key, limit);
        co_return co_await std::move(again);
    }
    auto p = std::make_shared<pending>(executor);
    inflight[key] = p;
    // However this create ends (an exception, this frame destroyed while suspended), the key
    // leaves `inflight` and its waiters are woken with an outcome.
    struct complete_on_exit {
        state* self;
        std::string key;
        std::shared_ptr<pending> p;
        ~complete_on_exit() {
            auto it = self->inflight.find(key);
            if (it != self->inflight.end() && it->second == p) self->inflight.erase(it);
            if (!p->outcome) {
                p->outcome = make_error(errc::cancelled,
                                        "the acquire that was creating this session's sandbox "
                                        "was abandoned");
            }
            p->done.set();
        }
    } completion{this, key, p};
    auto opening = guarded(open_session(key, limit, lost));
    auto opened = co_await std::move(opening);
    auto it = inflight.find(key);
    if (it != inflight.end() && it->second == p) inflight.erase(it);
    if (opened && shutting_down) {
        if (!store->is_shared()) (void)co_await opened->s->box->async_destroy();
        opened = make_error(errc::shutting_down, "the manager is shutting down");
    }
    if (opened) sessions[key] = opened->s;
    p->outcome = opened;
    if (!opened) co_return std::move(opened).error();
    co_return lease(opened->s, opened->rebuilt);
}

asio::awaitable<result<session_manager::state::local_outcome>> session_manager::state::reuse_local(
    std::string key, deadline limit) {
    local_outcome out;
    auto it = sessions.find(key);
    if (it == sessions.end()) co_return out;
    auto existing = it->second;
    // The backend is the truth: the sandbox may have ended without the handle noticing yet.
    bool running = false;
    if (usable(*existing->box)) {
        auto seen = co_await sandboxes.get_backend().async_inspect(existing->box->id());
        running = seen && seen->state != sandbox_state::exited;
    }
    it = sessions.find(key);
    if (it == sessions.end() || it->second != existing) co_return out;
    // Paused while idle, or being paused (the resume then waits for the pause in the handle's
    // queue): resumed now, everything as it was (a failed resume is a lost sandbox).
    bool resumed = false;
    const bool pausing = options.pause_when_idle && existing->idle_checking;
    const bool frozen = sandboxes.get_backend().is_paused(existing->box->id());
    if (running && (existing->paused || frozen || pausing)) {
        auto thawed = co_await existing->box->async_resume(limit);
        running = thawed.has_value();
        resumed = running;
        existing->paused = false;
        it = sessions.find(key);
        if (it == sessions.end() || it->second != existing) co_return out;
    }
    if (!running) {
        out.lost = true;
        sessions.erase(it);
        // The entry stays: the next claim replaces it (compare-and-set) as a rebuild.
        (void)co_await end_session(existing, lost_reason(*existing->box), false);
        co_return out;
    }
    if (existing->local_only) {
        out.lease = lease(existing, false);
        out.lease->resumed = resumed;
        co_return out;
    }
    auto touching =
        guarded(store->async_touch(key, existing->box->id(), options.spec.ttl, true, limit));
    auto touched = co_await std::move(touching);
    if (!touched) {
        auto failure = store_failure(std::move(touched).error());
        if (!options.local_fallback || failure.code == errc::cancelled) co_return failure;
        emit(manager_event::kind::store_fallback, key, existing->box->id(), std::nullopt,
             failure.to_string());
        out.lease = lease(existing, false);
        out.lease->resumed = resumed;
        co_return out;
    }
    if (*touched) {
        existing->last_touch = clock::now();
        out.lease = lease(existing, (*touched)->notice);
        out.lease->resumed = resumed;
        co_return out;
    }
    // The store no longer names this sandbox (another worker ended or replaced it): forget it
    // here and follow the store.
    it = sessions.find(key);
    if (it != sessions.end() && it->second == existing) sessions.erase(it);
    co_return out;
}

asio::awaitable<result<session_manager::state::opened_session>>
session_manager::state::open_session(std::string key, deadline limit, bool lost) {
    const deadline wait_limit = earliest(limit, deadline::after(options.claim_wait));
    asio::steady_timer timer(executor);
    for (;;) {
        auto getting = guarded(store->async_get(key, limit));
        auto stored = co_await std::move(getting);
        if (!stored) {
            auto falling = fall_back(key, limit, lost, stored.error());
            co_return co_await std::move(falling);
        }
        std::string expected;
        std::uint64_t generation = lost ? 1 : 0;
        bool rebuild = lost;
        if (*stored && (*stored)->ended) {
            // Ended for idleness (or its lifetime) on some worker: a rebuild, announced once.
            rebuild = true;
            generation = (*stored)->generation + 1;
        } else if (*stored && !(*stored)->sandbox_id.empty()) {
            expected = (*stored)->sandbox_id;
            auto adopting = adopt(key, expected, limit);
            auto found = co_await std::move(adopting);
            if (!found) co_return std::move(found).error();
            if (*found) {
                auto touching =
                    guarded(store->async_touch(key, expected, options.spec.ttl, true, limit));
                auto touched = co_await std::move(touching);
                if (!touched) {
                    auto falling = fall_back(key, limit, lost, touched.error());
                    co_return co_await std::move(falling);
                }
                if (!*touched) continue;  // the entry changed meanwhile: read it again
                auto s = new_session(key, std::move(*found));
                emit(manager_event::kind::attached, key, s->box->id());
                co_return opened_session{s, (*touched)->notice};
            }
            rebuild = true;
            generation = (*stored)->generation + 1;
        }
        bool claimed_elsewhere = *stored && (*stored)->claimed;
        if (!claimed_elsewhere) {
            auto claiming = guarded(store->async_claim(key, expected, options.claim_lease, limit));
            auto claim = co_await std::move(claiming);
            if (!claim) {
                auto falling = fall_back(key, limit, lost, claim.error());
                co_return co_await std::move(falling);
            }
            if (claim->token) {
                auto creating = create_claimed(key, *claim->token, generation, rebuild, limit);
                auto made = co_await std::move(creating);
                if (!made) co_return std::move(made).error();
                if (*made) co_return std::move(**made);
                continue;  // the claim was lost: attach to the successor's sandbox
            }
            claimed_elsewhere = true;
        }
        // Another worker creates it: read again in a moment, bounded by the deadline.
        if (wait_limit.has_expired()) {
            co_return make_error(errc::deadline_exceeded,
                                 "acquire: the deadline passed while another worker created "
                                 "the session's sandbox");
        }
        const auto left = wait_limit.remaining();
        const auto poll = std::min<clock::duration>(options.claim_poll, left);
        timer.expires_after(poll);
        auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
        if (ec) co_return make_error(errc::cancelled, "acquire was cancelled");
    }
}

asio::awaitable<result<std::shared_ptr<sandbox>>> session_manager::state::adopt(
    const std::string& key, const std::string& id, deadline limit) {
    auto attached = co_await sandboxes.async_attach(id, limit);
    if (!attached) {
        const auto code = attached.error().code;
        if (code == errc::sandbox_not_found || code == errc::sandbox_unavailable) {
            co_return std::shared_ptr<sandbox>();
        }
        co_return std::move(attached).error();
    }
    auto box = std::move(*attached);
    if (printable_label(key)) {
        const auto& labels = box->info().labels;
        auto it = labels.find("moat.session");
        if (it == labels.end() || it->second != key) {
            emit(manager_event::kind::entry_refused, key, id, std::nullopt,
                 "the store named a sandbox that does not carry moat.session=" + key);
            co_return std::shared_ptr<sandbox>();
        }
    }
    co_return box;
}

asio::awaitable<result<std::optional<session_manager::state::opened_session>>>
session_manager::state::create_claimed(std::string key, std::string token, std::uint64_t generation,
                                       bool rebuild, deadline limit) {
    auto self = shared_from_this();
    auto keeper = std::make_shared<claim_keeper>(executor);
    tasks.spawn(renew_claim(self, key, token, keeper));
    struct stop_renewing {
        std::shared_ptr<claim_keeper> k;
        ~stop_renewing() {
            k->done = true;
            k->timer.cancel();
        }
    } stop{keeper};
    auto sweeping = sweep_strays(key, limit);
    co_await std::move(sweeping);
    auto creating = create_seeded(key, rebuild, limit);
    auto created = co_await std::move(creating);
    if (!created) {
        auto releasing = release_claim(key, token);
        co_await std::move(releasing);
        co_return std::move(created).error();
    }
    auto box = std::move(*created);
    auto committing =
        commit_until_known(store, key, token, box->id(), generation, options.spec.ttl, limit);
    auto committed = co_await std::move(committing);
    if (!committed) {
        // Still unknown: the store may name this sandbox now, so it is not destroyed. Either the
        // next acquire attaches to it (the commit happened), or the next claimer sweeps it as a
        // stray (it carries moat.session=KEY and no entry names it); its TTL bounds it anyway.
        // The handle goes without destroying a shared session's sandbox (survive_owner).
        detail::log(log_level::warning, "manager",
                    "session " + key + ": the commit of sandbox " + box->id() +
                        " has an unknown outcome; the sandbox is kept for the store to decide");
        auto releasing = release_claim(key, token);
        co_await std::move(releasing);
        co_return store_failure(std::move(committed).error());
    }
    if (!*committed) {
        (void)co_await box->async_destroy();
        detail::log(log_level::warning, "manager",
                    "lost the claim on session " + key + " before committing its sandbox");
        co_return std::optional<opened_session>();
    }
    auto s = new_session(key, std::move(box));
    bool notice = false;
    if (generation > 0) {
        auto touching =
            guarded(store->async_touch(key, s->box->id(), options.spec.ttl, true, limit));
        auto touched = co_await std::move(touching);
        notice = touched && *touched && (*touched)->notice;
    }
    emit(rebuild ? manager_event::kind::rebuilt : manager_event::kind::created, key, s->box->id());
    co_return opened_session{s, notice};
}

asio::awaitable<void> session_manager::state::release_claim(const std::string& key,
                                                            const std::string& token) {
    co_await asio::this_coro::reset_cancellation_state();
    auto releasing = guarded(store->async_release(key, token, deadline::after(store_step_limit)));
    (void)co_await std::move(releasing);
}

asio::awaitable<void> session_manager::state::sweep_strays(const std::string& key, deadline limit) {
    if (!store->is_shared() || !printable_label(key)) co_return;
    label_filter filter = options.spec.labels;
    filter["moat.session"] = key;
    filter["moat.policy"] = "session";
    auto listing = sandboxes.get_backend().async_list(filter);
    auto listed = co_await std::move(listing);
    if (!listed) {
        detail::log(log_level::warning, "manager",
                    "could not list strays of session " + key + ": " + listed.error().to_string());
        co_return;
    }
    for (auto& info : *listed) {
        if (limit.has_expired()) break;
        auto destroying = sandboxes.get_backend().async_destroy(info.id);
        auto destroyed = co_await std::move(destroying);
        emit(manager_event::kind::ended, key, info.id, end_reason::error,
             destroyed ? "left by a worker that did not commit it" : destroyed.error().to_string());
    }
}

asio::awaitable<void> session_manager::state::renew_claim(std::shared_ptr<state> self,
                                                          std::string key, std::string token,
                                                          std::shared_ptr<claim_keeper> keeper) {
    const auto every = std::max<std::chrono::milliseconds>(self->options.claim_lease / 3,
                                                           std::chrono::milliseconds(1));
    while (!keeper->done) {
        keeper->timer.expires_after(every);
        auto [ec] = co_await keeper->timer.async_wait(as_tuple(asio::use_awaitable));
        if (ec || keeper->done) co_return;
        auto renewing = guarded(self->store->async_renew(key, token, self->options.claim_lease,
                                                         deadline::after(every)));
        auto renewed = co_await std::move(renewing);
        if (renewed && !*renewed) {
            keeper->lost = true;
            co_return;
        }
        if (!renewed) {
            detail::log(
                log_level::warning, "manager",
                "renewing the claim on session " + key + " failed: " + renewed.error().to_string());
        }
    }
}

asio::awaitable<result<session_manager::state::opened_session>> session_manager::state::fall_back(
    std::string key, deadline limit, bool lost, error failure) {
    failure = store_failure(std::move(failure));
    if (!options.local_fallback || failure.code == errc::cancelled) co_return failure;
    emit(manager_event::kind::store_fallback, key, "", std::nullopt, failure.to_string());
    auto creating = create_seeded(key, lost, limit);
    auto created = co_await std::move(creating);
    if (!created) co_return std::move(created).error();
    auto s = new_session(key, std::move(*created));
    s->local_only = true;
    emit(lost ? manager_event::kind::rebuilt : manager_event::kind::created, key, s->box->id(),
         std::nullopt, "local fallback: not in the store");
    co_return opened_session{s, lost};
}

asio::awaitable<result<std::shared_ptr<sandbox>>> session_manager::state::create_seeded(
    const std::string& key, bool rebuilt, deadline limit) {
    const sandbox_spec spec = spec_for("session", key);
    auto created = co_await sandboxes.async_create(spec, limit);
    if (!created) co_return std::move(created).error();
    auto box = std::move(*created);
    if (options.seed) {
        auto seeding = guarded(call_seed(options.seed, box, rebuilt));
        auto seeded = co_await std::move(seeding);
        if (!seeded) {
            (void)co_await box->async_destroy();
            co_return std::move(seeded).error();
        }
    }
    co_return box;
}

asio::awaitable<result<void>> session_manager::state::call_seed(
    std::function<asio::awaitable<result<void>>(std::shared_ptr<sandbox>, bool)> seed,
    std::shared_ptr<sandbox> box, bool rebuilt) {
    auto seeding = seed(std::move(box), rebuilt);
    co_return co_await std::move(seeding);
}

}  // namespace moat
