// The session manager itself: its events, the specs and labels of the sandboxes it creates, the
// leases it hands out (and what dropping one does), one-shot runs, the warm pool, and the public
// entry points. How a key gets its sandbox is in session_acquire.cpp, how sessions end in
// session_policies.cpp; session_manager_state.hpp is their contract.
#include "manager/session_manager_state.hpp"

#include "core/exception_boundary.hpp"
#include "core/rfc3339.hpp"

#include <asio/this_coro.hpp>

#include <algorithm>

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

using manager_detail::printable_label;
using manager_detail::usable;

namespace {

// RFC 3339, seconds.
std::string utc_now() {
    return detail::format_rfc3339(std::chrono::system_clock::now());
}

}  // namespace

session_manager::state::hold::~hold() {
    auto alive = s.lock();
    if (!alive) return;
    --alive->holds;
    alive->last_used = clock::now();
    auto manager = owner.lock();
    if (manager && !manager->shutting_down && !alive->local_only) {
        manager->tasks.spawn(touch_in_background(manager, alive));
    }
}

void session_manager::state::emit(manager_event::kind what, const std::string& key,
                                  const std::string& id, std::optional<end_reason> reason,
                                  std::string detail) {
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

sandbox_spec session_manager::state::spec_for(const char* policy, const std::string& key) const {
    sandbox_spec spec = options.spec;
    spec.labels["moat.policy"] = policy;
    spec.labels["moat.created"] = utc_now();
    if (printable_label(key)) spec.labels["moat.session"] = key;
    // Another worker attaches to it, and it must outlive the worker that made it.
    if (store->is_shared() && !key.empty()) spec.survive_owner = true;
    return spec;
}

session_lease session_manager::state::lease(const std::shared_ptr<session>& s, bool rebuilt) {
    ++s->holds;
    s->last_used = clock::now();
    auto h = std::make_shared<hold>();
    h->s = s;
    h->owner = weak_from_this();
    return session_lease{s->box, rebuilt, std::move(h)};
}

std::shared_ptr<session_manager::state::session> session_manager::state::new_session(
    const std::string& key, std::shared_ptr<sandbox> box) {
    auto s = std::make_shared<session>();
    s->key = key;
    s->box = std::move(box);
    s->created = s->last_used = s->last_heartbeat = s->last_touch = clock::now();
    return s;
}

end_reason session_manager::state::lost_reason(const sandbox& box) {
    return std::chrono::system_clock::now() >= box.info().expires_at ? end_reason::ttl
                                                                     : end_reason::error;
}

asio::awaitable<result<exec_result>> session_manager::state::run_once(
    exec_request request, std::vector<file_write> inputs, deadline limit) {
    if (shutting_down) co_return make_error(errc::shutting_down, "the manager is shutting down");
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

asio::awaitable<result<exec_result>> session_manager::state::use_once(
    std::shared_ptr<sandbox> box, exec_request request, std::vector<file_write> inputs,
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

asio::awaitable<result<std::shared_ptr<sandbox>>> session_manager::state::take_warm(
    deadline limit) {
    if (shutting_down) co_return make_error(errc::shutting_down, "the manager is shutting down");
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

asio::awaitable<void> session_manager::state::destroy_quietly(std::shared_ptr<sandbox> box) {
    co_await asio::this_coro::reset_cancellation_state();
    (void)co_await box->async_destroy();
}

void session_manager::state::start_refill() {
    if (options.pool_size == 0 || refilling || shutting_down) return;
    refilling = true;
    tasks.spawn(refill(shared_from_this()));
}

asio::awaitable<void> session_manager::state::refill(std::shared_ptr<state> self) {
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
