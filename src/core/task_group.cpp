#include <moat/log.hpp>
#include <moat/task_group.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <cstdint>
#include <exception>
#include <map>
#include <optional>

namespace moat {

struct task_group::state {
    state(asio::any_io_executor ex, std::string n)
        : executor(std::move(ex)), name(std::move(n)), idle(executor) {}

    asio::any_io_executor executor;
    std::string name;
    // One signal per running task. A signal is destroyed only from a posted handler, never while
    // it might be emitting.
    std::map<std::uint64_t, asio::cancellation_signal> tasks;
    std::uint64_t next_id = 0;
    std::optional<asio::cancellation_type> cancelled;
    asio::steady_timer idle;  // waiters in async_wait_all sleep on it; cancelled when empty
};

namespace {

struct task_done {
    std::shared_ptr<task_group::state> group;
    std::uint64_t id;

    void operator()(const std::exception_ptr& failure) const {
        if (failure) {
            try {
                std::rethrow_exception(failure);
            } catch (const std::exception& e) {
                detail::log(log_level::error, "task_group",
                            group->name + ": a task ended with an exception: " + e.what());
            } catch (...) {
                detail::log(log_level::error, "task_group",
                            group->name + ": a task ended with a non-standard exception");
            }
        }
        asio::post(group->executor, [g = group, i = id] {
            g->tasks.erase(i);
            if (g->tasks.empty()) g->idle.cancel();
        });
    }
};

}  // namespace

task_group::task_group(asio::any_io_executor executor, std::string name)
    : state_(std::make_shared<state>(std::move(executor), std::move(name))) {}

task_group::~task_group() {
    // Once only: after cancel_all() the tasks' pending operations may already have been torn down
    // (an io_context being destroyed destroys suspended frames, which can release the last owner
    // of this group); emitting to them again would touch freed operations.
    if (!state_->tasks.empty() && !state_->cancelled) cancel_all(asio::cancellation_type::terminal);
}

std::uint64_t task_group::spawn(asio::awaitable<void> task) {
    const std::uint64_t id = state_->next_id++;
    auto& signal = state_->tasks[id];
    asio::co_spawn(state_->executor, std::move(task),
                   asio::bind_cancellation_slot(signal.slot(), task_done{state_, id}));
    if (state_->cancelled) signal.emit(*state_->cancelled);
    return id;
}

bool task_group::cancel(std::uint64_t task_id, asio::cancellation_type type) {
    auto it = state_->tasks.find(task_id);
    if (it == state_->tasks.end()) return false;
    it->second.emit(type);
    return true;
}

void task_group::cancel_all(asio::cancellation_type type) {
    state_->cancelled = type;
    for (auto& [id, signal] : state_->tasks) signal.emit(type);
}

asio::awaitable<void> task_group::async_wait_all() {
    auto keep = state_;
    while (!keep->tasks.empty()) {
        keep->idle.expires_at(asio::steady_timer::time_point::max());
        std::error_code ignored;
        co_await keep->idle.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    }
}

std::size_t task_group::size() const noexcept {
    return state_->tasks.size();
}

const asio::any_io_executor& task_group::get_executor() const noexcept {
    return state_->executor;
}

}  // namespace moat
