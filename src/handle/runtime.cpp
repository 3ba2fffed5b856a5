#include <moat/runtime.hpp>
#include <moat/with_timeout.hpp>

#include "handle/admission.hpp"
#include "handle/sandbox_impl.hpp"

#include <asio/this_coro.hpp>

namespace moat {

struct runtime::state {
    state(backend& b, runtime_options o)
        : sandboxes(b), options(o), gate(b.get_executor(), o.admission) {}
    backend& sandboxes;
    runtime_options options;
    admission gate;
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

runtime::~runtime() = default;

admission_stats runtime::stats() const noexcept {
    return state_->gate.stats();
}

backend& runtime::get_backend() const noexcept {
    return state_->sandboxes;
}

asio::awaitable<result<std::shared_ptr<sandbox>>> runtime::async_create(sandbox_spec spec,
                                                                        deadline limit) {
    auto s = state_;
    auto admitted = co_await s->gate.async_admit(limit);
    if (!admitted) co_return std::move(admitted).error();
    auto creating = s->sandboxes.async_create(std::move(spec));
    auto created = co_await with_timeout(std::move(creating), limit);
    s->gate.create_finished(created.has_value());
    if (!created) co_return std::move(created).error();
    const bool survivor = created->survive_owner;
    auto shared = std::make_shared<sandbox::impl>(s->sandboxes, std::move(*created),
                                                  s->options.handle, end_hook(s));
    shared->detach_on_drop = survivor;
    co_return std::make_shared<sandbox>(std::move(shared));
}

asio::awaitable<result<std::shared_ptr<sandbox>>> runtime::async_attach(std::string id,
                                                                        deadline limit) {
    auto s = state_;
    auto attaching = s->sandboxes.async_attach(std::move(id));
    auto attached = co_await with_timeout(std::move(attaching), limit);
    if (!attached) co_return std::move(attached).error();
    s->gate.sandbox_attached();
    auto shared = std::make_shared<sandbox::impl>(s->sandboxes, std::move(*attached),
                                                  s->options.handle, end_hook(s));
    shared->detach_on_drop = true;
    co_return std::make_shared<sandbox>(std::move(shared));
}

}  // namespace moat
