// Running coroutines in tests: run_async() drives an io_context until the coroutine finishes,
// rethrows what it threw, and fails the test (instead of hanging) if it runs past a watchdog.
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <optional>

namespace moat::test {

template <class T>
struct store_outcome {
    std::optional<T>* value;
    std::exception_ptr* failure;
    bool* done;
    void operator()(std::exception_ptr e, T v) const {
        *failure = e;
        if (!e) value->emplace(std::move(v));
        *done = true;
    }
};

// Runs `task` on `io` to completion. A test that hangs fails after `watchdog`.
template <class T>
T run_async(asio::io_context& io, asio::awaitable<T> task,
            std::chrono::seconds watchdog = std::chrono::seconds(120)) {
    std::optional<T> value;
    std::exception_ptr failure;
    bool done = false;
    asio::co_spawn(io, std::move(task), store_outcome<T>{&value, &failure, &done});
    const auto limit = std::chrono::steady_clock::now() + watchdog;
    while (!done) {
        if (std::chrono::steady_clock::now() > limit) {
            FAIL("watchdog: the coroutine did not finish within " << watchdog.count() << " s");
        }
        io.run_one_for(std::chrono::milliseconds(100));
        if (io.stopped()) io.restart();
    }
    if (failure) std::rethrow_exception(failure);
    return std::move(*value);
}

struct void_result {};

inline asio::awaitable<void_result> as_value(asio::awaitable<void> task) {
    co_await std::move(task);
    co_return void_result{};
}

inline void run_async(asio::io_context& io, asio::awaitable<void> task,
                      std::chrono::seconds watchdog = std::chrono::seconds(120)) {
    (void)run_async(io, as_value(std::move(task)), watchdog);
}

}  // namespace moat::test
