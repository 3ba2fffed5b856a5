#include <moat/log.hpp>
#include <moat/session_manager.hpp>
#include <moat/task_group.hpp>

#include "core/async_event.hpp"
#include "core/exception_boundary.hpp"
#include "core/rfc3339.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <ctime>
#include <deque>
#include <map>

#include "core/asio_compat.hpp"

namespace moat {

const char* to_string(end_reason reason) noexcept {
    switch (reason) {
        case end_reason::user_request:
            return "user_request";
        case end_reason::idle_timeout:
            return "idle_timeout";
        case end_reason::max_lifetime:
            return "max_lifetime";
        case end_reason::ttl:
            return "ttl";
        case end_reason::shutdown:
            return "shutdown";
        case end_reason::error:
            return "error";
    }
    return "unknown";
}

const char* to_string(manager_event::kind kind) noexcept {
    switch (kind) {
        case manager_event::kind::created:
            return "created";
        case manager_event::kind::attached:
            return "attached";
        case manager_event::kind::rebuilt:
            return "rebuilt";
        case manager_event::kind::ended:
            return "ended";
        case manager_event::kind::pool_refilled:
            return "pool_refilled";
        case manager_event::kind::pool_discarded:
            return "pool_discarded";
        case manager_event::kind::entry_refused:
            return "entry_refused";
        case manager_event::kind::store_fallback:
            return "store_fallback";
    }
    return "unknown";
}

namespace {

using clock = std::chrono::steady_clock;

bool usable(const sandbox& box) {
    return box.state() == handle_state::ready || box.state() == handle_state::busy;
}

// Label values are printable ASCII (sandbox_spec); other keys are simply not labelled.
bool printable_label(const std::string& text) {
    return !text.empty() && text.size() <= 200 &&
           std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

// RFC 3339, seconds.
std::string utc_now() {
    return detail::format_rfc3339(std::chrono::system_clock::now());
}

// A store failure as the acquire reports it: store_unavailable, whatever the store said, except
// the caller's own cancellation.
error store_failure(error e) {
    if (e.code == errc::cancelled || e.code == errc::store_unavailable) return e;
    return make_error(errc::store_unavailable, "the session store failed: " + e.to_string());
}

// How long an end or a background step may wait for the store.
constexpr std::chrono::seconds store_step_limit{5};

}  // namespace

struct session_manager::state : std::enable_shared_from_this<session_manager::state> {
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
        ~hold() {
            auto alive = s.lock();
            if (!alive) return;
            --alive->holds;
            alive->last_used = clock::now();
            auto manager = owner.lock();
            if (manager && !manager->shutting_down && !alive->local_only) {
                manager->tasks.spawn(touch_in_background(manager, alive));
            }
        }
    };

    // The claim holder's lease renewal, stopped when the create is over.
    struct claim_keeper {
        explicit claim_keeper(const asio::any_io_executor& ex) : timer(ex) {}
        asio::steady_timer timer;
        bool done = false;
        bool lost = false;
    };

    state(runtime& rt, manager_options o, std::shared_ptr<session_store> st)
        : sandboxes(rt),
          executor(rt.get_backend().get_executor()),
          options(std::move(o)),
          layout(rt.get_backend().layout_for(options.spec.layout)),
          store(std::move(st)),
          tasks(executor, "session manager") {}

    void emit(manager_event::kind what, const std::string& key, const std::string& id,
              std::optional<end_reason> reason = std::nullopt, std::string detail = {}) {
        if (reason) {
            detail::log(log_level::info, "manager",
                        std::string("ended (") + to_string(*reason) + ")" +
                            (key.empty() ? "" : " session " + key),
                        id);
        }
        if (!options.on_event) return;
        manager_event e;
        e.what = what;
        e.session_key = key;
        e.sandbox_id = id;
        e.reason = reason;
        e.detail = std::move(detail);
        options.on_event(e);
    }

    sandbox_spec spec_for(const char* policy, const std::string& key) const {
        sandbox_spec spec = options.spec;
        spec.labels["moat.policy"] = policy;
        spec.labels["moat.created"] = utc_now();
        if (printable_label(key)) spec.labels["moat.session"] = key;
        // Another worker attaches to it, and it must outlive the worker that made it.
        if (store->is_shared() && !key.empty()) spec.survive_owner = true;
        return spec;
    }

    session_lease lease(const std::shared_ptr<session>& s, bool rebuilt) {
        ++s->holds;
        s->last_used = clock::now();
        auto h = std::make_shared<hold>();
        h->s = s;
        h->owner = weak_from_this();
        return session_lease{s->box, rebuilt, std::move(h)};
    }

    std::shared_ptr<session> new_session(const std::string& key, std::shared_ptr<sandbox> box) {
        auto s = std::make_shared<session>();
        s->key = key;
        s->box = std::move(box);
        s->created = s->last_used = s->last_heartbeat = s->last_touch = clock::now();
        return s;
    }

    // Why a session whose sandbox is no longer usable ended.
    static end_reason lost_reason(const sandbox& box) {
        return std::chrono::system_clock::now() >= box.info().expires_at ? end_reason::ttl
                                                                         : end_reason::error;
    }

    // A stored id is a claim about another system: the sandbox must exist, run and carry this
    // session's label. None: it is gone, or it is not this session's (refused, with an event).
    asio::awaitable<result<std::shared_ptr<sandbox>>> adopt(const std::string& key,
                                                            const std::string& id, deadline limit) {
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

    // The session's sandbox through the store: attach to the entry's, else claim the key and
    // create (a rebuild when the entry's sandbox is gone), else wait for the claim's holder.
    asio::awaitable<result<opened_session>> open_session(std::string key, deadline limit,
                                                         bool lost) {
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
                auto claiming =
                    guarded(store->async_claim(key, expected, options.claim_lease, limit));
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

    // Holding the claim: sweep what a dead predecessor left, create, seed, commit fenced. None:
    // the claim was lost before the commit (the new sandbox is destroyed).
    asio::awaitable<result<std::optional<opened_session>>> create_claimed(std::string key,
                                                                          std::string token,
                                                                          std::uint64_t generation,
                                                                          bool rebuild,
                                                                          deadline limit) {
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
        const sandbox_spec spec = spec_for("session", key);
        auto created = co_await sandboxes.async_create(spec, limit);
        if (!created) {
            auto releasing = release_claim(key, token);
            co_await std::move(releasing);
            co_return std::move(created).error();
        }
        auto box = std::move(*created);
        if (options.seed) {
            auto seeding = guarded(call_seed(options.seed, box, rebuild));
            auto seeded = co_await std::move(seeding);
            if (!seeded) {
                (void)co_await box->async_destroy();
                auto releasing = release_claim(key, token);
                co_await std::move(releasing);
                co_return std::move(seeded).error();
            }
        }
        auto committing = guarded(
            store->async_commit(key, token, box->id(), generation, options.spec.ttl, limit));
        auto committed = co_await std::move(committing);
        if (!committed || !*committed) {
            (void)co_await box->async_destroy();
            if (!committed) {
                auto releasing = release_claim(key, token);
                co_await std::move(releasing);
                co_return store_failure(std::move(committed).error());
            }
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
        emit(rebuild ? manager_event::kind::rebuilt : manager_event::kind::created, key,
             s->box->id());
        co_return opened_session{s, notice};
    }

    asio::awaitable<void> release_claim(const std::string& key, const std::string& token) {
        co_await asio::this_coro::reset_cancellation_state();
        auto releasing =
            guarded(store->async_release(key, token, deadline::after(store_step_limit)));
        (void)co_await std::move(releasing);
    }

    // Sandboxes labelled for this session (and with this manager's labels) that the store does not
    // name: what a creator that died before its commit left. Only the claim holder sweeps, so
    // nothing another live worker is still making is touched (a holder whose lease ran out cannot
    // commit what it makes anyway).
    asio::awaitable<void> sweep_strays(const std::string& key, deadline limit) {
        if (!store->is_shared() || !printable_label(key)) co_return;
        label_filter filter = options.spec.labels;
        filter["moat.session"] = key;
        filter["moat.policy"] = "session";
        auto listing = sandboxes.get_backend().async_list(filter);
        auto listed = co_await std::move(listing);
        if (!listed) {
            detail::log(
                log_level::warning, "manager",
                "could not list strays of session " + key + ": " + listed.error().to_string());
            co_return;
        }
        for (auto& info : *listed) {
            if (limit.has_expired()) break;
            auto destroying = sandboxes.get_backend().async_destroy(info.id);
            auto destroyed = co_await std::move(destroying);
            emit(manager_event::kind::ended, key, info.id, end_reason::error,
                 destroyed ? "left by a worker that did not commit it"
                           : destroyed.error().to_string());
        }
    }

    static asio::awaitable<void> renew_claim(std::shared_ptr<state> self, std::string key,
                                             std::string token,
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
                detail::log(log_level::warning, "manager",
                            "renewing the claim on session " + key +
                                " failed: " + renewed.error().to_string());
            }
        }
    }

    // With options.local_fallback, a store failure is served from this process alone.
    asio::awaitable<result<opened_session>> fall_back(std::string key, deadline limit, bool lost,
                                                      error failure) {
        failure = store_failure(std::move(failure));
        if (!options.local_fallback || failure.code == errc::cancelled) co_return failure;
        emit(manager_event::kind::store_fallback, key, "", std::nullopt, failure.to_string());
        const sandbox_spec spec = spec_for("session", key);
        auto created = co_await sandboxes.async_create(spec, limit);
        if (!created) co_return std::move(created).error();
        auto box = std::move(*created);
        if (options.seed) {
            auto seeding = guarded(call_seed(options.seed, box, lost));
            auto seeded = co_await std::move(seeding);
            if (!seeded) {
                (void)co_await box->async_destroy();
                co_return std::move(seeded).error();
            }
        }
        auto s = new_session(key, std::move(box));
        s->local_only = true;
        emit(lost ? manager_event::kind::rebuilt : manager_event::kind::created, key, s->box->id(),
             std::nullopt, "local fallback: not in the store");
        co_return opened_session{s, lost};
    }

    // The session in this process, if its sandbox still runs and the store still names it.
    // None: go through the store (lost says the sandbox is gone).
    struct local_outcome {
        std::optional<session_lease> lease;
        bool lost = false;
    };

    asio::awaitable<result<local_outcome>> reuse_local(std::string key, deadline limit) {
        local_outcome out;
        auto it = sessions.find(key);
        if (it == sessions.end()) co_return out;
        auto existing = it->second;
        // The backend is the truth: the sandbox may have ended without the handle noticing yet.
        bool running = false;
        if (usable(*existing->box)) {
            auto seen = co_await sandboxes.get_backend().async_inspect(existing->box->id());
            running = seen && seen->state == sandbox_state::running;
        }
        it = sessions.find(key);
        if (it == sessions.end() || it->second != existing) co_return out;
        if (!running) {
            out.lost = true;
            sessions.erase(it);
            // The entry stays: the next claim replaces it (compare-and-set) as a rebuild.
            (void)co_await end_session(existing, lost_reason(*existing->box), false);
            co_return out;
        }
        if (existing->local_only) {
            out.lease = lease(existing, false);
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
            co_return out;
        }
        if (*touched) {
            existing->last_touch = clock::now();
            out.lease = lease(existing, (*touched)->notice);
            co_return out;
        }
        // The store no longer names this sandbox (another worker ended or replaced it): forget it
        // here and follow the store.
        it = sessions.find(key);
        if (it != sessions.end() && it->second == existing) sessions.erase(it);
        co_return out;
    }

    asio::awaitable<result<session_lease>> acquire(std::string key, deadline limit) {
        if (shutting_down)
            co_return make_error(errc::shutting_down, "the manager is shutting down");
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

    // How long the store keeps a marker for a session that ends for `reason` (none: the entry
    // goes). Only the caller's own async_end forgets the conversation.
    std::optional<std::chrono::milliseconds> marker_for(end_reason reason) const {
        if (reason == end_reason::user_request || options.remember_ended.count() <= 0) {
            return std::nullopt;
        }
        return options.remember_ended;
    }

    // Ends a session: its entry goes from the store (unless `erase_entry` is false: a lost
    // sandbox's entry stays for the rebuild), its sandbox is destroyed and confirmed.
    asio::awaitable<result<void>> end_session(std::shared_ptr<session> s, end_reason reason,
                                              bool erase_entry = true) {
        auto self = shared_from_this();
        if (auto it = sessions.find(s->key); it != sessions.end() && it->second == s) {
            sessions.erase(it);
        }
        if (erase_entry && !s->local_only) {
            const auto remember = marker_for(reason);
            auto erasing = guarded(store->async_erase(s->key, s->box->id(), std::nullopt, remember,
                                                      deadline::after(store_step_limit)));
            (void)co_await std::move(erasing);
        }
        auto destroyed = co_await s->box->async_destroy();
        emit(manager_event::kind::ended, s->key, s->box->id(), reason,
             destroyed ? "" : destroyed.error().to_string());
        co_return destroyed;
    }

    // A released lease: the store records the use, so other workers' idle clocks restart too.
    static asio::awaitable<void> touch_in_background(std::shared_ptr<state> self,
                                                     std::shared_ptr<session> s) {
        auto touching =
            guarded(self->store->async_touch(s->key, s->box->id(), self->options.spec.ttl, false,
                                             deadline::after(store_step_limit)));
        auto touched = co_await std::move(touching);
        if (touched) s->last_touch = clock::now();
    }

    // The shared idle timeout: the store removes the entry only if no worker used it for
    // idle_timeout; otherwise this worker takes the store's last use as its own.
    static asio::awaitable<void> end_if_idle(std::shared_ptr<state> self,
                                             std::shared_ptr<session> s) {
        struct done_checking {
            session* s;
            ~done_checking() { s->idle_checking = false; }
        } done{s.get()};
        if (s->local_only) {
            (void)co_await self->end_session(s, end_reason::idle_timeout);
            co_return;
        }
        const auto limit = deadline::after(store_step_limit);
        const auto remember = self->marker_for(end_reason::idle_timeout);
        auto erasing = guarded(self->store->async_erase(
            s->key, s->box->id(), self->options.idle_timeout, remember, limit));
        auto erased = co_await std::move(erasing);
        if (!erased) {
            detail::log(
                log_level::warning, "manager",
                "idle check of session " + s->key + " failed: " + erased.error().to_string());
            s->last_used = clock::now();  // try again after another idle_timeout
            co_return;
        }
        if (*erased) {
            (void)co_await self->end_session(s, end_reason::idle_timeout, false);
            co_return;
        }
        auto getting = guarded(self->store->async_get(s->key, limit));
        auto stored = co_await std::move(getting);
        if (stored && *stored && (*stored)->sandbox_id == s->box->id()) {
            const auto used = clock::now() - (*stored)->unused_for;
            s->last_used = std::max(s->last_used, used);
            co_return;
        }
        if (!stored) {
            s->last_used = clock::now();
            co_return;
        }
        // Ended or replaced by another worker: not this worker's to end any more.
        auto it = self->sessions.find(s->key);
        if (it != self->sessions.end() && it->second == s && s->holds == 0)
            self->sessions.erase(it);
    }

    asio::awaitable<result<exec_result>> run_once(exec_request request,
                                                  std::vector<file_write> inputs, deadline limit) {
        if (shutting_down)
            co_return make_error(errc::shutting_down, "the manager is shutting down");
        auto self = shared_from_this();
        const sandbox_spec spec = spec_for("call", "");
        auto created = co_await sandboxes.async_create(spec, limit);
        if (!created) co_return std::move(created).error();
        auto box = std::move(*created);
        one_shots.push_back(box);
        emit(manager_event::kind::created, "", box->id());
        // Whatever happens in the sandbox (an error, a cancellation, an exception: Asio throws at
        // the next co_await when a cancellation arrived just after the create), it goes after.
        result<exec_result> outcome = make_error(errc::cancelled, "not run");
        std::exception_ptr failure;
        try {
            outcome = co_await use_once(box, std::move(request), std::move(inputs), limit);
        } catch (...) {
            failure = std::current_exception();
        }
        if (failure) outcome = error_from_exception(failure);
        co_await asio::this_coro::reset_cancellation_state();
        auto destroying = box->async_destroy();
        auto destroyed = co_await std::move(destroying);
        std::erase(one_shots, box);
        const end_reason reason = outcome ? end_reason::user_request : end_reason::error;
        emit(manager_event::kind::ended, "", box->id(), reason,
             destroyed ? "" : destroyed.error().to_string());
        co_return outcome;
    }

    static asio::awaitable<result<exec_result>> use_once(std::shared_ptr<sandbox> box,
                                                         exec_request request,
                                                         std::vector<file_write> inputs,
                                                         deadline limit) {
        if (!inputs.empty()) {
            auto written = co_await box->async_write_files(std::move(inputs), limit);
            if (!written) co_return std::move(written).error();
            for (auto& w : *written) {
                if (!w.outcome) co_return std::move(w.outcome).error();
            }
        }
        co_return co_await box->async_exec(std::move(request), limit);
    }

    // The application's seed hook, called inside a coroutine so that guarded() also catches what
    // the hook throws before it returns its awaitable.
    static asio::awaitable<result<void>> call_seed(
        std::function<asio::awaitable<result<void>>(std::shared_ptr<sandbox>, bool)> seed,
        std::shared_ptr<sandbox> box, bool rebuilt) {
        auto seeding = seed(std::move(box), rebuilt);
        co_return co_await std::move(seeding);
    }

    asio::awaitable<result<std::shared_ptr<sandbox>>> take_warm(deadline limit) {
        if (shutting_down)
            co_return make_error(errc::shutting_down, "the manager is shutting down");
        auto self = shared_from_this();
        while (!pool.empty()) {
            auto box = pool.front();
            pool.pop_front();
            const auto left = box->info().expires_at - std::chrono::system_clock::now();
            if (usable(*box) && left >= options.pool_min_remaining_ttl) {
                start_refill();
                co_return box;
            }
            emit(manager_event::kind::pool_discarded, "", box->id(), std::nullopt,
                 usable(*box) ? "too close to its TTL" : "no longer usable");
            tasks.spawn(destroy_quietly(box));
        }
        start_refill();
        const sandbox_spec spec = spec_for("pool", "");
        auto created = co_await sandboxes.async_create(spec, limit);
        if (!created) co_return std::move(created).error();
        emit(manager_event::kind::created, "", (*created)->id(), std::nullopt, "pool miss");
        co_return std::move(*created);
    }

    static asio::awaitable<void> destroy_quietly(std::shared_ptr<sandbox> box) {
        co_await asio::this_coro::reset_cancellation_state();
        (void)co_await box->async_destroy();
    }

    void start_refill() {
        if (options.pool_size == 0 || refilling || shutting_down) return;
        refilling = true;
        tasks.spawn(refill(shared_from_this()));
    }

    static asio::awaitable<void> refill(std::shared_ptr<state> self) {
        struct refill_over {
            state* s;
            ~refill_over() { s->refilling = false; }
        } over{self.get()};
        while (!self->shutting_down && self->pool.size() < self->options.pool_size) {
            const sandbox_spec spec = self->spec_for("pool", "");
            auto created = co_await self->sandboxes.async_create(spec);
            if (!created) {
                detail::log(log_level::warning, "manager",
                            "pool refill failed: " + created.error().to_string());
                break;
            }
            if (self->shutting_down) {
                (void)co_await (*created)->async_destroy();
                break;
            }
            self->emit(manager_event::kind::pool_refilled, "", (*created)->id());
            self->pool.push_back(std::move(*created));
        }
    }

    clock::duration tick() const {
        auto shortest = std::min(options.idle_timeout, options.heartbeat_interval);
        if (options.max_lifetime) shortest = std::min(shortest, *options.max_lifetime);
        const auto quarter = std::chrono::duration_cast<clock::duration>(shortest) / 4;
        return std::clamp<clock::duration>(quarter, std::chrono::milliseconds(10),
                                           std::chrono::seconds(1));
    }

    // Idle and lifetime limits, heartbeats, lost sandboxes; the pool's TTL margin.
    static asio::awaitable<void> watch(std::shared_ptr<state> self) {
        asio::steady_timer timer(self->executor);
        self->watch_timer = &timer;
        struct forget_timer {
            state* s;
            ~forget_timer() { s->watch_timer = nullptr; }
        } forget{self.get()};
        while (!self->shutting_down) {
            timer.expires_after(self->tick());
            auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
            if (ec || self->shutting_down) co_return;
            const auto now = clock::now();
            std::vector<std::pair<std::shared_ptr<session>, end_reason>> ending;
            std::vector<std::shared_ptr<session>> idle, beating, touching;
            const auto touch_every =
                std::min(self->options.heartbeat_interval, self->options.idle_timeout / 2);
            for (auto& [key, s] : self->sessions) {
                if (!usable(*s->box)) {
                    ending.emplace_back(s, lost_reason(*s->box));
                } else if (self->options.max_lifetime &&
                           now - s->created >= *self->options.max_lifetime) {
                    ending.emplace_back(s, end_reason::max_lifetime);
                } else if (s->holds == 0 && now - s->last_used >= self->options.idle_timeout) {
                    if (!s->idle_checking) {
                        s->idle_checking = true;
                        idle.push_back(s);
                    }
                } else if (s->holds > 0) {
                    if (now - s->last_heartbeat >= self->options.heartbeat_interval) {
                        s->last_heartbeat = now;
                        beating.push_back(s);
                    }
                    // In use here: other workers must not see it idle.
                    if (!s->local_only && now - s->last_touch >= touch_every) {
                        s->last_touch = now;
                        touching.push_back(s);
                    }
                }
            }
            for (auto& [s, reason] : ending) {
                self->sessions.erase(s->key);
                // A lost sandbox's entry stays for the rebuild (compare-and-set on its id).
                const bool erase_entry = reason == end_reason::max_lifetime;
                self->tasks.spawn(end_in_background(self, s, reason, erase_entry));
            }
            // Spawned after the walk: a task may run up to its first suspension at once and change
            // `sessions`.
            for (auto& s : beating) self->tasks.spawn(heartbeat(self, s->box));
            for (auto& s : touching) self->tasks.spawn(touch_in_background(self, s));
            for (auto& s : idle) self->tasks.spawn(end_if_idle(self, s));
        }
    }

    // Heartbeats go to the backend directly: they must not queue behind the very commands that
    // keep the session in use.
    static asio::awaitable<void> heartbeat(std::shared_ptr<state> self,
                                           std::shared_ptr<sandbox> box) {
        if (self->shutting_down) co_return;
        auto extended = co_await self->sandboxes.get_backend().async_extend_ttl(
            box->id(), self->options.spec.ttl);
        if (!extended) {
            detail::log(log_level::warning, "manager",
                        "heartbeat failed: " + extended.error().to_string(), box->id());
        }
    }

    static asio::awaitable<void> end_in_background(std::shared_ptr<state> self,
                                                   std::shared_ptr<session> s, end_reason reason,
                                                   bool erase_entry) {
        if (self->shutting_down) co_return;
        (void)co_await self->end_session(std::move(s), reason, erase_entry);
    }

    static asio::awaitable<void> destroy_into(std::shared_ptr<sandbox> box, std::string key,
                                              std::shared_ptr<state> self,
                                              std::shared_ptr<std::size_t> remaining) {
        co_await asio::this_coro::reset_cancellation_state();
        auto destroyed = co_await box->async_destroy();
        if (destroyed) ++self->shutdown_destroyed;
        self->emit(manager_event::kind::ended, key, box->id(), end_reason::shutdown,
                   destroyed ? "" : destroyed.error().to_string());
        if (--*remaining == 0) self->drained.set();
    }

    asio::awaitable<result<void>> end_by_key(std::string key, end_reason reason) {
        auto self = shared_from_this();
        auto it = sessions.find(key);
        if (it != sessions.end()) {
            auto found = it->second;
            co_return co_await end_session(std::move(found), reason);
        }
        // Another worker's session: through the store.
        const auto limit = deadline::after(store_step_limit);
        auto getting = guarded(store->async_get(key, limit));
        auto stored = co_await std::move(getting);
        if (!stored) co_return store_failure(std::move(stored).error());
        if (!*stored || (*stored)->sandbox_id.empty()) {
            co_return make_error(errc::sandbox_not_found, "no session with key '" + key + "'");
        }
        const std::string id = (*stored)->sandbox_id;
        auto adopting = adopt(key, id, limit);
        auto found = co_await std::move(adopting);
        if (!found) co_return std::move(found).error();
        const auto remember = marker_for(reason);
        auto erasing = guarded(store->async_erase(key, id, std::nullopt, remember, limit));
        auto erased = co_await std::move(erasing);
        if (!erased) co_return store_failure(std::move(erased).error());
        if (!*found) co_return result<void>{};  // already gone (or not this session's: refused)
        auto destroyed = co_await (*found)->async_destroy();
        emit(manager_event::kind::ended, key, id, reason,
             destroyed ? "" : destroyed.error().to_string());
        co_return destroyed;
    }

    // The boundary of async_shutdown, whose result is a report, not a result<T>: an exception
    // (none is expected: every wait below consumes cancellations) is logged, and every sandbox
    // not confirmed destroyed is reported as left.
    asio::awaitable<shutdown_report> shutdown_never_throwing(std::chrono::milliseconds grace) {
        auto self = shared_from_this();
        std::vector<std::string> known;
        for (auto& [key, s] : sessions) {
            if (!store->is_shared() || s->local_only) known.push_back(s->box->id());
        }
        for (auto& box : pool) known.push_back(box->id());
        for (auto& box : one_shots) known.push_back(box->id());
        std::string failure;
        try {
            co_return co_await shutdown(grace);
        } catch (const std::exception& e) {
            failure = e.what();
        } catch (...) {
            failure = "a non-standard exception";
        }
        detail::log(log_level::error, "manager", "shutdown failed: " + failure);
        shutdown_report report;
        report.destroyed = shutdown_destroyed;
        report.left = std::move(known);
        co_return report;
    }

    asio::awaitable<shutdown_report> shutdown(std::chrono::milliseconds grace) {
        auto self = shared_from_this();
        // Not cancellable: bounded by `grace`.
        co_await asio::this_coro::reset_cancellation_state();
        shutting_down = true;
        if (watch_timer != nullptr) watch_timer->cancel();  // the watcher ends now, not at its tick
        const auto limit = deadline::after(grace);
        std::vector<std::pair<std::shared_ptr<sandbox>, std::string>> all;
        // A shared store's sessions belong to every worker: they stay (the others attach to them).
        for (auto& [key, s] : sessions) {
            if (!store->is_shared() || s->local_only) all.emplace_back(s->box, key);
        }
        sessions.clear();
        for (auto& box : pool) all.emplace_back(box, "");
        pool.clear();
        for (auto& box : one_shots) all.emplace_back(box, "");
        shutdown_report report;
        auto remaining = std::make_shared<std::size_t>(all.size());
        if (!all.empty()) {
            for (auto& [box, key] : all) tasks.spawn(destroy_into(box, key, self, remaining));
            while (!drained.is_set() && !limit.has_expired()) co_await drained.async_wait(limit);
        }
        for (auto& [box, key] : all) {
            if (box->state() != handle_state::destroyed) report.left.push_back(box->id());
        }
        report.destroyed = shutdown_destroyed;
        // Let the manager's own work end too (the watcher within a tick, a refill after its
        // current create), so nothing of it is left suspended when the caller moves on.
        asio::steady_timer timer(executor);
        const auto drained_by = deadline::after(grace + std::chrono::seconds(1));
        while (tasks.size() > 0 && !drained_by.has_expired()) {
            timer.expires_after(std::chrono::milliseconds(10));
            auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
            if (ec) co_await asio::this_coro::reset_cancellation_state();
        }
        co_return report;
    }

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

session_manager::session_manager(runtime& sandboxes, manager_options options,
                                 std::shared_ptr<session_store> store)
    : state_(std::make_shared<state>(sandboxes, std::move(options), std::move(store))) {
    state_->tasks.spawn(state::watch(state_));
    state_->start_refill();
}

session_manager::~session_manager() {
    state_->shutting_down = true;
    state_->tasks.cancel_all();
}

namespace {

// Binds the manager's state to an operation when it is made, so that it may be awaited later.
template <class T>
asio::awaitable<T> keeping([[maybe_unused]] std::shared_ptr<session_manager::state> s,
                           asio::awaitable<T> operation) {
    co_return co_await std::move(operation);
}

}  // namespace

// Plain functions: each binds the state now and puts the one exception boundary on top.

asio::awaitable<result<exec_result>> session_manager::async_run_once(exec_request request,
                                                                     std::vector<file_write> inputs,
                                                                     deadline limit) {
    return guarded(keeping(state_, state_->run_once(std::move(request), std::move(inputs), limit)));
}

asio::awaitable<result<session_lease>> session_manager::async_acquire(std::string key,
                                                                      deadline limit) {
    return guarded(keeping(state_, state_->acquire(std::move(key), limit)));
}

asio::awaitable<result<void>> session_manager::async_end(std::string key, end_reason reason) {
    return guarded(keeping(state_, state_->end_by_key(std::move(key), reason)));
}

asio::awaitable<result<std::shared_ptr<sandbox>>> session_manager::async_take_warm(deadline limit) {
    return guarded(keeping(state_, state_->take_warm(limit)));
}

asio::awaitable<shutdown_report> session_manager::async_shutdown(std::chrono::milliseconds grace) {
    return keeping(state_, state_->shutdown_never_throwing(grace));
}

std::size_t session_manager::sessions() const noexcept {
    return state_->sessions.size();
}

std::size_t session_manager::acquiring() const noexcept {
    return state_->inflight.size();
}

std::size_t session_manager::warm() const noexcept {
    return state_->pool.size();
}

asio::any_io_executor session_manager::get_executor() const {
    return state_->executor;
}

const sandbox_layout& session_manager::layout() const noexcept {
    return state_->layout;
}

const sandbox_network& session_manager::network() const noexcept {
    return state_->options.spec.network;
}

}  // namespace moat
