#include "core/async_event.hpp"

#include "core/cancellation.hpp"

#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include "core/asio_compat.hpp"

#include <algorithm>

namespace moat {

asio::awaitable<async_event::wait_outcome> async_event::async_wait(deadline limit) {
    if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
        co_await asio::this_coro::reset_cancellation_state();
        co_return wait_outcome::cancelled;
    }
    if (is_set_) co_return wait_outcome::set;
    if (limit.has_expired()) co_return wait_outcome::deadline_passed;
    asio::steady_timer timer(executor_, limit.when());
    waiters_.push_back(&timer);
    struct unregister {
        std::vector<asio::steady_timer*>& waiters;
        asio::steady_timer* timer;
        ~unregister() { std::erase(waiters, timer); }
    } registered{waiters_, &timer};
    auto token = as_tuple(asio::use_awaitable);
    auto [ec] = co_await timer.async_wait(token);
    // Checked before is_set_: a cancellation that lost the race to set() is still the caller's.
    if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
        co_await asio::this_coro::reset_cancellation_state();
        co_return wait_outcome::cancelled;
    }
    if (is_set_) co_return wait_outcome::set;
    if (!ec) co_return wait_outcome::deadline_passed;
    co_await asio::this_coro::reset_cancellation_state();  // let the caller's cleanup await
    co_return wait_outcome::cancelled;
}

}  // namespace moat
