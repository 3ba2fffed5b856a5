// Waiting inside a test coroutine while other coroutines on the same executor run.
#pragma once

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>

namespace moat::test {

// Polls `condition` every 10 ms until it holds (true) or `bound` passes (false).
template <class Predicate>
asio::awaitable<bool> until(Predicate condition,
                            std::chrono::milliseconds bound = std::chrono::seconds(20)) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    const auto limit = std::chrono::steady_clock::now() + bound;
    while (!condition()) {
        if (std::chrono::steady_clock::now() > limit) co_return false;
        timer.expires_after(std::chrono::milliseconds(10));
        co_await timer.async_wait(asio::use_awaitable);
    }
    co_return true;
}

inline asio::awaitable<void> pause(std::chrono::milliseconds d) {
    asio::steady_timer timer(co_await asio::this_coro::executor, d);
    co_await timer.async_wait(asio::use_awaitable);
}

}  // namespace moat::test
