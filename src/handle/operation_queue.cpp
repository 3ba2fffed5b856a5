#include "handle/operation_queue.hpp"

#include <algorithm>

namespace moat {

asio::awaitable<operation_queue::turn> operation_queue::async_acquire(deadline limit) {
    if (running_ < width_ && waiters_.empty()) {
        ++running_;
        co_return turn::granted;
    }
    auto me = std::make_shared<waiter>(executor_);
    waiters_.push_back(me);
    struct leave_unless_taken {
        operation_queue* queue;
        std::shared_ptr<waiter> w;
        bool taken = false;
        ~leave_unless_taken() {
            if (!taken) queue->leave(w);
        }
    } line{this, me};
    // The caller's co_await checked for a pending cancellation and nothing here suspended
    // since, so this co_await cannot throw; async_wait itself never does.
    const auto outcome = co_await me->event.async_wait(limit);
    switch (outcome) {
        case async_event::wait_outcome::set:
            if (!me->granted) co_return turn::refused;
            line.taken = true;
            co_return turn::granted;
        case async_event::wait_outcome::deadline_passed:
            co_return turn::deadline_passed;
        case async_event::wait_outcome::cancelled:
            co_return turn::cancelled;
    }
    co_return turn::refused;
}

void operation_queue::leave(const std::shared_ptr<waiter>& w) {
    if (w->granted) {
        w->granted = false;
        release();  // granted just as the caller gave up: pass the turn on
        return;
    }
    auto it = std::find(waiters_.begin(), waiters_.end(), w);
    if (it != waiters_.end()) waiters_.erase(it);
}

void operation_queue::release() {
    if (!waiters_.empty()) {
        auto next = waiters_.front();
        waiters_.pop_front();
        next->granted = true;
        next->event.set();
        return;  // the place is now `next`'s
    }
    if (running_ > 0) --running_;
}

void operation_queue::refuse_all() {
    auto refused = std::move(waiters_);
    waiters_.clear();
    for (auto& w : refused) w->event.set();
}

}  // namespace moat
