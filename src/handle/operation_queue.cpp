#include "handle/operation_queue.hpp"

#include <algorithm>

namespace moat {

asio::awaitable<operation_queue::turn> operation_queue::async_acquire(deadline limit) {
    if (!busy_ && waiters_.empty()) {
        busy_ = true;
        co_return turn::granted;
    }
    auto me = std::make_shared<waiter>(executor_);
    waiters_.push_back(me);
    const auto outcome = co_await me->event.async_wait(limit);
    if (me->granted) {
        if (outcome == async_event::wait_outcome::set) co_return turn::granted;
        // Granted just as the caller gave up: pass the turn on.
        release();
    } else {
        auto it = std::find(waiters_.begin(), waiters_.end(), me);
        if (it != waiters_.end()) waiters_.erase(it);
    }
    switch (outcome) {
        case async_event::wait_outcome::set:
            co_return turn::refused;
        case async_event::wait_outcome::deadline_passed:
            co_return turn::deadline_passed;
        case async_event::wait_outcome::cancelled:
            co_return turn::cancelled;
    }
    co_return turn::refused;
}

void operation_queue::release() {
    if (!waiters_.empty()) {
        auto next = waiters_.front();
        waiters_.pop_front();
        next->granted = true;
        next->event.set();
        return;  // still busy: the queue now belongs to `next`
    }
    busy_ = false;
}

void operation_queue::refuse_all() {
    auto refused = std::move(waiters_);
    waiters_.clear();
    for (auto& w : refused) w->event.set();
}

}  // namespace moat
