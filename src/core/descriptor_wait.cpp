#include "core/descriptor_wait.hpp"

#include "core/cancellation.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

namespace moat {
namespace {

asio::awaitable<void> wait_for(asio::posix::stream_descriptor& descriptor,
                               asio::posix::descriptor_base::wait_type what) {
    co_await descriptor.async_wait(what, asio::use_awaitable);
}

asio::awaitable<void> wait_for(asio::steady_timer& timer) {
    co_await timer.async_wait(asio::use_awaitable);
}

}  // namespace

asio::awaitable<wait_result> async_wait_until(asio::posix::stream_descriptor& descriptor,
                                              asio::posix::descriptor_base::wait_type what,
                                              deadline limit,
                                              asio::posix::stream_descriptor* other) {
    using namespace asio::experimental::awaitable_operators;
    if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
        co_await asio::this_coro::reset_cancellation_state();
        co_return wait_result::cancelled;
    }
    if (limit.has_expired()) co_return wait_result::deadline_passed;
    asio::steady_timer timer(descriptor.get_executor(), limit.when());
    try {
        auto ready = wait_for(descriptor, what);
        auto expired = wait_for(timer);
        if (other != nullptr) {
            auto other_ready = wait_for(*other, what);
            const auto which =
                co_await (std::move(ready) || std::move(other_ready) || std::move(expired));
            co_return which.index() == 2 ? wait_result::deadline_passed : wait_result::ready;
        }
        const auto which = co_await (std::move(ready) || std::move(expired));
        co_return which.index() == 0 ? wait_result::ready : wait_result::deadline_passed;
    } catch (const std::exception&) {
        // Both waits failed (asio::multiple_exceptions): the caller cancelled.
    }
    co_await asio::this_coro::reset_cancellation_state();
    co_return wait_result::cancelled;
}

}  // namespace moat
