// http::connection_pool, the one pool of the HTTP and Redis clients, against real peers: idle
// connections to origins never used again are closed by the pool's sweep (loopback servers on
// 127.0.0.x, one origin each), and a Redis waiter whose coroutine frame is destroyed leaves no
// dangling entry in the wait list (a real redis-server; the suite runs under ASan too).
#include <moat/deadline.hpp>

#include "core/asio_compat.hpp"
#include "core/loopback.hpp"
#include "http/client.hpp"
#include "store/redis_client.hpp"
#include "support/async_test.hpp"
#include "support/loopback_peer.hpp"
#include "support/redis_server.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <doctest/doctest.h>

#include <dirent.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace http = moat::http;
using moat::as_tuple;

std::size_t open_descriptors() {
    std::size_t n = 0;
    DIR* dir = ::opendir("/proc/self/fd");
    REQUIRE(dir != nullptr);
    while (const auto* entry = ::readdir(dir)) {
        if (entry->d_name[0] != '.') ++n;
    }
    ::closedir(dir);
    return n - 1;  // the directory stream itself
}

struct served {
    int answered = 0;
    int saw_close = 0;
};

// One keep-alive exchange on the first connection accepted, then waits for the client to close.
asio::awaitable<void> serve_once(asio::ip::tcp::acceptor& acceptor, served& counts) {
    auto [accept_error, peer] = co_await acceptor.async_accept(as_tuple(asio::use_awaitable));
    if (accept_error) co_return;
    std::string request;
    auto [read_error, n] = co_await asio::async_read_until(
        peer, asio::dynamic_buffer(request), "\r\n\r\n", as_tuple(asio::use_awaitable));
    if (read_error) co_return;
    const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    auto [write_error, written] =
        co_await asio::async_write(peer, asio::buffer(reply), as_tuple(asio::use_awaitable));
    if (write_error) co_return;
    ++counts.answered;
    char byte = 0;
    auto [eof, got] =
        co_await peer.async_read_some(asio::buffer(&byte, 1), as_tuple(asio::use_awaitable));
    if (eof) ++counts.saw_close;
}

struct ignore_outcome {
    void operator()(std::exception_ptr) const {}
};

asio::awaitable<void> use_each_origin(http::client& client, std::vector<std::string> urls) {
    for (const auto& url : urls) {
        http::request req;
        req.url = url;
        req.limit = moat::deadline::after(10s);
        auto got = co_await client.async_fetch(std::move(req), 1024);
        REQUIRE_MESSAGE(got, got.error().to_string());
        CHECK(got->body == "ok");
    }
}

asio::awaitable<void> wait_until_closed(const served& counts, int expected, http::client& client) {
    asio::steady_timer pause(co_await asio::this_coro::executor);
    const auto limit = moat::deadline::after(20s);
    while (counts.saw_close < expected && !limit.has_expired()) {
        pause.expires_after(50ms);
        co_await pause.async_wait(asio::use_awaitable);
    }
    CHECK(counts.saw_close == expected);
    CHECK(client.idle_connections() == 0);
    CHECK(client.origins_held() == 0);
}

}  // namespace

TEST_CASE(
    "idle connections to origins never used again are closed by the pool's sweep, and the "
    "origins are forgotten") {
    moat::test::raise_open_files(4096);
    asio::io_context io;
    constexpr int origins = 40;
    std::vector<std::unique_ptr<asio::ip::tcp::acceptor>> acceptors;
    std::vector<std::string> urls;
    served counts;
    for (int i = 0; i < origins; ++i) {
        const auto address = asio::ip::make_address("127.0.0." + std::to_string(10 + i));
        acceptors.push_back(
            std::make_unique<asio::ip::tcp::acceptor>(io, asio::ip::tcp::endpoint(address, 0)));
        urls.push_back("http://" + address.to_string() + ":" +
                       std::to_string(acceptors.back()->local_endpoint().port()) + "/");
        asio::co_spawn(io, serve_once(*acceptors.back(), counts), ignore_outcome{});
    }
    http::client_options options;
    options.idle_timeout = 300ms;
    http::client client(io.get_executor(), options);
    const auto before = open_descriptors();
    moat::test::run_async(io, use_each_origin(client, urls));
    CHECK(counts.answered == origins);
    CHECK(client.connections_opened() == origins);
    // Each origin's connection is idle in the pool and holds a descriptor on both sides.
    CHECK(client.idle_connections() == origins);
    CHECK(open_descriptors() >= before + 2 * origins);
    // No further request to any of them: the sweep alone closes them.
    moat::test::run_async(io, wait_until_closed(counts, origins, client));
    CHECK(open_descriptors() <= before + origins);  // what is left: the servers' ends, closing
}

TEST_CASE("one loopback rule: IP literals in 127.0.0.0/8 and ::1, and the name localhost") {
    using moat::detail::is_loopback_authority;
    using moat::detail::is_loopback_host;
    for (const char* yes : {"localhost", "LocalHost", "127.0.0.1", "127.1.2.3", "::1"}) {
        CHECK_MESSAGE(is_loopback_host(yes), yes);
    }
    for (const char* no : {"", "128.0.0.1", "127.1", "::ffff:127.0.0.1", "a.localhost",
                           "localhost.", "10.0.0.1", "::2", "example.com"}) {
        CHECK_FALSE_MESSAGE(is_loopback_host(no), no);
    }
    for (const char* yes : {"localhost:8080", "127.0.0.2:1", "[::1]:49983", "[::1]", "::1"}) {
        CHECK_MESSAGE(is_loopback_authority(yes), yes);
    }
    for (const char* no : {"[::1", "example.com:80", "[::2]:80"}) {
        CHECK_FALSE_MESSAGE(is_loopback_authority(no), no);
    }
}

namespace {

struct outcome_flag {
    bool* done;
    void operator()(std::exception_ptr, moat::result<moat::store::redis_reply>) const {
        *done = true;
    }
};

asio::awaitable<moat::result<moat::store::redis_reply>> run_command(
    std::shared_ptr<moat::store::redis_client> client, moat::store::redis_command command) {
    auto limit = moat::deadline::after(30s);
    co_return co_await client->async_command(std::move(command), limit);
}

}  // namespace

TEST_CASE(
    "a Redis waiter whose coroutine frame is destroyed leaves the wait list, and the next "
    "release wakes a live waiter") {
    moat::test::redis_server redis;
    asio::io_context io;
    auto config = redis.unix_config();
    config.max_connections = 1;
    config.command_timeout = 10s;
    auto client = std::make_shared<moat::store::redis_client>(io.get_executor(), config, nullptr);

    // The only connection is busy for about a second.
    bool busy_done = false;
    asio::co_spawn(io, run_command(client, {"BLPOP", "moat-pool-test-nothing", "1"}),
                   outcome_flag{&busy_done});
    io.run_for(200ms);
    REQUIRE_FALSE(busy_done);

    // A waiter on its own io_context: destroying that context destroys the waiter's frame while
    // it is in the wait list.
    {
        asio::io_context other;
        bool abandoned_done = false;
        asio::co_spawn(other, run_command(client, {"PING"}), outcome_flag{&abandoned_done});
        other.run_for(200ms);
        REQUIRE_FALSE(abandoned_done);
    }

    // A live waiter, then the busy command ends: its release must wake the live one (the
    // destroyed waiter is no longer listed, and nothing touches its freed timer).
    bool waiter_done = false;
    std::optional<moat::result<moat::store::redis_reply>> waited;
    struct keep {
        std::optional<moat::result<moat::store::redis_reply>>* into;
        bool* done;
        void operator()(std::exception_ptr e, moat::result<moat::store::redis_reply> r) const {
            if (!e) into->emplace(std::move(r));
            *done = true;
        }
    };
    asio::co_spawn(io, run_command(client, {"PING"}), keep{&waited, &waiter_done});
    const auto limit = moat::deadline::after(20s);
    while ((!busy_done || !waiter_done) && !limit.has_expired()) io.run_one_for(100ms);
    CHECK(busy_done);
    REQUIRE(waiter_done);
    REQUIRE(waited);
    REQUIRE_MESSAGE(*waited, waited->error().to_string());
    CHECK((*waited)->text == "PONG");
    CHECK(client->connections_opened() == 1);
}
