// How sessions end (docs/policies.md): the watcher (idle timeout, max lifetime, heartbeats, lost
// sandboxes), an end by key (this worker's session or, through the store, another's), the idle end
// over a shared store, the touches that keep other workers' idle clocks right, and the shutdown
// (session_manager_state.hpp).
#include "manager/session_manager_state.hpp"

#include "core/exception_boundary.hpp"

#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>

#include "core/asio_compat.hpp"

namespace moat {

using manager_detail::store_failure;
using manager_detail::store_step_limit;
using manager_detail::usable;

std::optional<std::chrono::milliseconds> session_manager::state::marker_for(
    end_reason reason) const {
    if (reason == end_reason::user_request || options.remember_ended.count() <= 0) {
        return std::nullopt;
    }
    return options.remember_ended;
}

asio::awaitable<result<void>> session_manager::state::end_session(std::shared_ptr<session> s,
                                                                  end_reason reason,
                                                                  bool erase_entry) {
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

asio::awaitable<result<void>> session_manager::state::end_by_key(std::string key,
                                                                 end_reason reason) {
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

asio::awaitable<void> session_manager::state::touch_in_background(std::shared_ptr<state> self,
                                                                  std::shared_ptr<session> s) {
    auto touching = guarded(self->store->async_touch(s->key, s->box->id(), self->options.spec.ttl,
                                                     false, deadline::after(store_step_limit)));
    auto touched = co_await std::move(touching);
    if (touched) s->last_touch = clock::now();
}

asio::awaitable<void> session_manager::state::end_if_idle(std::shared_ptr<state> self,
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
    auto erasing = guarded(self->store->async_erase(s->key, s->box->id(),
                                                    self->options.idle_timeout, remember, limit));
    auto erased = co_await std::move(erasing);
    if (!erased) {
        detail::log(log_level::warning, "manager",
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
    if (it != self->sessions.end() && it->second == s && s->holds == 0) self->sessions.erase(it);
}

session_manager::state::clock::duration session_manager::state::tick() const {
    auto shortest = std::min(options.idle_timeout, options.heartbeat_interval);
    if (options.max_lifetime) shortest = std::min(shortest, *options.max_lifetime);
    const auto quarter = std::chrono::duration_cast<clock::duration>(shortest) / 4;
    return std::clamp<clock::duration>(quarter, std::chrono::milliseconds(10),
                                       std::chrono::seconds(1));
}

asio::awaitable<void> session_manager::state::watch(std::shared_ptr<state> self) {
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
            } else if (s->holds == 0 && !s->paused &&
                       now - s->last_used >= self->options.idle_timeout) {
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
        for (auto& s : idle) {
            if (self->options.pause_when_idle) {
                self->tasks.spawn(pause_if_idle(self, s));
            } else {
                self->tasks.spawn(end_if_idle(self, s));
            }
        }
    }
}

asio::awaitable<void> session_manager::state::heartbeat(std::shared_ptr<state> self,
                                                        std::shared_ptr<sandbox> box) {
    if (self->shutting_down) co_return;
    auto extended =
        co_await self->sandboxes.get_backend().async_extend_ttl(box->id(), self->options.spec.ttl);
    if (!extended) {
        detail::log(log_level::warning, "manager",
                    "heartbeat failed: " + extended.error().to_string(), box->id());
    }
}

asio::awaitable<void> session_manager::state::end_in_background(std::shared_ptr<state> self,
                                                                std::shared_ptr<session> s,
                                                                end_reason reason,
                                                                bool erase_entry) {
    if (self->shutting_down) co_return;
    (void)co_await self->end_session(std::move(s), reason, erase_entry);
}

asio::awaitable<void> session_manager::state::destroy_into(std::shared_ptr<sandbox> box,
                                                           std::string key,
                                                           std::shared_ptr<state> self,
                                                           std::shared_ptr<std::size_t> remaining) {
    co_await asio::this_coro::reset_cancellation_state();
    auto destroyed = co_await box->async_destroy();
    if (destroyed) ++self->shutdown_destroyed;
    self->emit(manager_event::kind::ended, key, box->id(), end_reason::shutdown,
               destroyed ? "" : destroyed.error().to_string());
    if (--*remaining == 0) self->drained.set();
}

asio::awaitable<shutdown_report> session_manager::state::shutdown_never_throwing(
    std::chrono::milliseconds grace) {
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

asio::awaitable<shutdown_report> session_manager::state::shutdown(std::chrono::milliseconds grace) {
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

}  // namespace moat
