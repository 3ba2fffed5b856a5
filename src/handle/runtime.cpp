#include <moat/runtime.hpp>
#include <moat/with_timeout.hpp>

#include "handle/admission.hpp"
#include "handle/sandbox_impl.hpp"

#include <asio/this_coro.hpp>

namespace moat {

struct runtime::state {
    state(backend& b, runtime_options o)
        : sandboxes(b), options(o), gate(b.get_executor(), o.admission) {}
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
    co_return s->adopt(std::move(shared));
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
    co_return s->adopt(std::move(shared));
}

}  // namespace moat
