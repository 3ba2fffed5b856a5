// A queue of operations: at most `width` at a time (one, for a sandbox's ordered lane), granted in
// arrival order. A caller waits for its turn until its deadline (time queued counts against it)
// or its cancellation, and then leaves the queue without running. Confined to one executor.
#pragma once

#include <moat/deadline.hpp>

#include "core/async_event.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <deque>
#include <memory>

namespace moat {

class operation_queue {
  public:
    enum class turn { granted, deadline_passed, cancelled, refused };

    explicit operation_queue(asio::any_io_executor executor, std::size_t width = 1)
        : executor_(std::move(executor)), width_(width == 0 ? 1 : width) {}

    // Waits for the caller's turn. `granted`: the caller holds the queue and must release() it
    // (the sandbox handle does so by RAII). `refused`: refuse_all() emptied the queue.
    // Cancellation: reports `cancelled` and resets the coroutine's cancellation state (see
    // async_event); a cancellation that arrives just as the turn is granted wins, and the turn
    // goes on to the next waiter. Never throws: a caller that leaves the queue any other way (its
    // frame destroyed while parked) still leaves it, and a turn already handed to it goes on.
    asio::awaitable<turn> async_acquire(deadline limit);

    // Hands the caller's place to the next waiter, or frees it.
    void release();

    // Wakes every waiter with `refused` (the sandbox can no longer run anything).
    void refuse_all();

    // Waiters, not counting the operations that hold a place.
    std::size_t waiting() const noexcept { return waiters_.size(); }
    // Operations holding a place (at most width()).
    std::size_t running() const noexcept { return running_; }
    std::size_t width() const noexcept { return width_; }

  private:
    struct waiter {
        explicit waiter(const asio::any_io_executor& ex) : event(ex) {}
        async_event event;
        bool granted = false;
    };

    // `w` is not taking its turn: out of the line, or, if the turn was handed to it, on.
    void leave(const std::shared_ptr<waiter>& w);

    asio::any_io_executor executor_;
    std::deque<std::shared_ptr<waiter>> waiters_;
    std::size_t width_;
    std::size_t running_ = 0;
};

}  // namespace moat
