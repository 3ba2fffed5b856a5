// Connecting to a server a sandbox is still starting (connection_refused until it listens), and
// the optional wrapper the tests run their connects through.
#pragma once

#include <moat/errc.hpp>
#include <moat/result.hpp>

#include "support/async_wait.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <optional>
#include <utility>

namespace moat::test {

// asio's co_spawn needs a default-constructible result, which a socket is not: the tests run
// their connects through this.
template <class Socket>
asio::awaitable<std::optional<result<Socket>>> optional_of(asio::awaitable<result<Socket>> c) {
    co_return co_await std::move(c);
}

// Calls `connect` (which returns an awaitable result<Socket>) until it succeeds, fails with
// anything but connection_refused, or 20 s have passed; the last outcome.
template <class Socket, class Connect>
asio::awaitable<std::optional<result<Socket>>> connect_when_up(Connect connect) {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
        auto attempt = connect();
        auto connected = co_await std::move(attempt);
        if (connected || connected.error().code != errc::connection_refused ||
            std::chrono::steady_clock::now() > limit) {
            co_return std::move(connected);
        }
        co_await pause(std::chrono::milliseconds(50));
    }
}

}  // namespace moat::test
