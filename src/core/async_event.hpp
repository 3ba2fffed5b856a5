// A one-shot event coroutines can wait for with a deadline. Any number of waiters; the event must
// outlive them (keep it in the shared state the waiters hold). Confined to one executor.
#pragma once

#include <moat/deadline.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

#include <vector>

namespace moat {

class async_event {
  public:
    enum class wait_outcome { set, deadline_passed, cancelled };

    explicit async_event(asio::any_io_executor executor) : executor_(std::move(executor)) {}

    void set() {
        is_set_ = true;
        for (auto* timer : waiters_) timer->cancel();
    }
    bool is_set() const noexcept { return is_set_; }

    // Waits until set() or `limit`.
    //
    // Cancellation (terminal/partial): reports `cancelled` and resets the coroutine's
    // cancellation state, so that the caller can await its cleanup and must then complete with
    // errc::cancelled itself. A cancellation always wins and is always consumed: one that was
    // already pending when the wait began, and one that arrived after set() woke the waiter but
    // before it resumed (Asio 1.22 would otherwise throw at the caller's next co_await, skipping
    // whatever the caller had to give back). A caller that must know whether the event was set
    // anyway asks is_set().
    //
    // Destroying the waiting coroutine (its io_context going away) unregisters it.
    asio::awaitable<wait_outcome> async_wait(deadline limit);

  private:
    asio::any_io_executor executor_;
    std::vector<asio::steady_timer*> waiters_;
    bool is_set_ = false;
};

}  // namespace moat
