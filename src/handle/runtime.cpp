#include <moat/runtime.hpp>
#include <moat/with_timeout.hpp>

#include "core/exception_boundary.hpp"
#include "handle/admission.hpp"
#include "handle/sandbox_impl.hpp"

#include <asio/this_coro.hpp>

namespace moat {

struct runtime::state {
    state(backend& b, runtime_options o)
        : sandboxes(b),
          options(o),
          gate(b.get_executor(), o.admission),
          telemetry(std::make_shared<moat::telemetry>()) {
        telemetry->sink = options.on_operation;
    }
    void report_create(const std::string& id, const std::optional<error>& failure,
                       std::chrono::steady_clock::time_point called,
                       std::chrono::steady_clock::time_point granted) {
        operation_event e;
        e.sandbox_id = id;
        e.operation = "create";
        e.operation_id = telemetry->next_operation_id++;
        if (failure) e.error = static_cast<errc>(failure->code.value());
        e.queued = granted - called;
        e.ran = std::chrono::steady_clock::now() - granted;
        telemetry->record(e);
    }

    // Hands out a handle and remembers it, so that ~runtime can cut it off from the backend.
    std::shared_ptr<sandbox> adopt(std::shared_ptr<sandbox::impl> impl) {
        std::erase_if(handles, [](const std::weak_ptr<sandbox::impl>& h) { return h.expired(); });
        handles.push_back(impl);
        return std::make_shared<sandbox>(std::move(impl));
    }

    backend& sandboxes;
    runtime_options options;
    admission gate;
    std::vector<std::weak_ptr<sandbox::impl>> handles;
    std::shared_ptr<moat::telemetry> telemetry;
};

namespace {

// The handle tells admission when its sandbox is gone; the runtime may be gone by then.
std::function<void()> end_hook(const std::shared_ptr<runtime::state>& s) {
    return [weak = std::weak_ptr<runtime::state>(s)] {
        if (auto alive = weak.lock()) alive->gate.sandbox_ended();
    };
}

}  // namespace

runtime::runtime(backend& sandboxes, runtime_options options)
    : state_(std::make_shared<state>(sandboxes, options)) {}

runtime::~runtime() {
    for (auto& weak : state_->handles) {
        if (auto handle = weak.lock()) {
            handle->backend_gone = true;
            handle->tasks.cancel_all();
        }
    }
}

admission_stats runtime::stats() const noexcept {
    return state_->gate.stats();
}

runtime_metrics runtime::metrics() const {
    runtime_metrics m = state_->telemetry->metrics;
    m.admission_refused = state_->gate.stats().refused;
    m.live_sandboxes = state_->gate.stats().live_sandboxes;
    return m;
}

backend& runtime::get_backend() const noexcept {
    return state_->sandboxes;
}

namespace {

asio::awaitable<result<std::shared_ptr<sandbox>>> create_handle(std::shared_ptr<runtime::state> s,
                                                                sandbox_spec spec, deadline limit) {
    const auto called = std::chrono::steady_clock::now();
    auto admitted = co_await s->gate.async_admit(limit);
    const auto granted = std::chrono::steady_clock::now();
    if (!admitted) {
        s->report_create("", admitted.error(), called, granted);
        co_return std::move(admitted).error();
    }
    // The ticket counts this create in flight until it goes, however this frame ends.
    auto ticket = std::move(*admitted);
    auto creating = s->sandboxes.async_create(std::move(spec));
    auto created = co_await with_timeout(std::move(creating), limit);
    ticket.finish(created.has_value());
    if (!created) {
        s->report_create("", created.error(), called, granted);
        co_return std::move(created).error();
    }
    s->report_create(created->id, std::nullopt, called, granted);
    const bool survivor = created->survive_owner;
    auto shared = std::make_shared<sandbox::impl>(s->sandboxes, std::move(*created),
                                                  s->options.handle, end_hook(s), s->telemetry);
    shared->detach_on_drop = survivor;
    co_return s->adopt(std::move(shared));
}

asio::awaitable<result<std::shared_ptr<sandbox>>> attach_handle(std::shared_ptr<runtime::state> s,
                                                                std::string id, deadline limit) {
    auto attaching = s->sandboxes.async_attach(std::move(id));
    auto attached = co_await with_timeout(std::move(attaching), limit);
    if (!attached) co_return std::move(attached).error();
    s->gate.sandbox_attached();
    auto shared = std::make_shared<sandbox::impl>(s->sandboxes, std::move(*attached),
                                                  s->options.handle, end_hook(s), s->telemetry);
    shared->detach_on_drop = true;
    co_return s->adopt(std::move(shared));
}

}  // namespace

// Plain functions: the state is bound now, and guarded() is the one exception boundary.
asio::awaitable<result<std::shared_ptr<sandbox>>> runtime::async_create(sandbox_spec spec,
                                                                        deadline limit) {
    return guarded(create_handle(state_, std::move(spec), limit));
}

asio::awaitable<result<std::shared_ptr<sandbox>>> runtime::async_attach(std::string id,
                                                                        deadline limit) {
    return guarded(attach_handle(state_, std::move(id), limit));
}

}  // namespace moat
