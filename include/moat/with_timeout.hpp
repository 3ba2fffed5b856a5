// with_timeout: runs an operation under a deadline.
//
// Runs `operation` on the current executor. If `limit` passes first, the operation receives
// terminal cancellation, with_timeout waits for it to finish (operations in moat clean up before
// completing: a started process is killed and its end confirmed), and the result is
// errc::deadline_exceeded. Otherwise the operation's own result is returned unchanged.
//
// Per-operation cancellation: cancelling the awaiting coroutine cancels `operation` the same way
// and yields errc::cancelled unless the operation already produced a result.
#pragma once

#include <moat/deadline.hpp>
#include <moat/result.hpp>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/deferred.hpp>
#include <asio/experimental/parallel_group.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <exception>
#include <string>

namespace moat {

namespace detail {
error timeout_error(const std::exception_ptr& failure, bool timer_fired);
error deadline_error(const std::string& what_happened);
}  // namespace detail

template <class T>
asio::awaitable<result<T>> with_timeout(asio::awaitable<result<T>> operation, deadline limit) {
    if (limit.is_never()) co_return co_await std::move(operation);
    auto executor = co_await asio::this_coro::executor;
    asio::steady_timer timer(executor, limit.when());
    auto op = asio::co_spawn(executor, std::move(operation), asio::experimental::deferred);
    auto wait = timer.async_wait(asio::experimental::deferred);
    auto group = asio::experimental::make_parallel_group(std::move(op), std::move(wait));
    auto outcome =
        co_await group.async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
    auto& [order, failure, value, timer_error] = outcome;
    const bool timer_fired = order[0] == 1 && !timer_error;
    if (failure) co_return detail::timeout_error(failure, timer_fired);
    // A result the operation produced is returned even if the timer fired first; only the
    // cancellation the timer caused is reported as the deadline.
    if (timer_fired && !value && value.error().code == errc::cancelled) {
        co_return detail::deadline_error(value.error().detail);
    }
    co_return std::move(value);
}

}  // namespace moat
