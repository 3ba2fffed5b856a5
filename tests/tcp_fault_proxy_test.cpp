// The fault-injecting TCP proxy (support/tcp_fault_proxy.hpp) proven against a real server: moat's
// http::server on loopback, reached through the proxy by moat's http::client. Each fault is seen
// by the client as the fault it stands for (a reset, a truncation, a stall, garbage, a canned
// status), traffic without a fault passes unchanged, and the proxy leaves no descriptor behind.
#include "http/client.hpp"
#include "http/server.hpp"

#include <moat/errc.hpp>
#include <moat/task_group.hpp>

#include "support/async_test.hpp"
#include "support/host_inspect.hpp"
#include "support/tcp_fault_proxy.hpp"

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <dirent.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace http = moat::http;
using moat::test::tcp_fault_proxy;

namespace {

using moat::test::open_descriptors;

const std::string big_body = [] {
    std::string s;
    for (int i = 0; s.size() < 64 * 1024; ++i) s += "line " + std::to_string(i) + "\n";
    return s;
}();

asio::awaitable<void> serve_big(http::server_request&, http::server_response& response) {
    http::header_list headers;
    headers.add("Content-Type", "text/plain");
    auto sent = co_await response.async_send(200, std::move(headers), big_body);
    (void)sent;
}

// Ten frames "frame <i>\n", each its own chunk.
asio::awaitable<void> serve_stream(http::server_request&, http::server_response& response) {
    http::header_list headers;
    headers.add("Content-Type", "text/plain");
    auto begun = co_await response.async_begin(200, std::move(headers));
    if (!begun) co_return;
    for (int i = 0; i < 10; ++i) {
        const std::string frame = "frame " + std::to_string(i) + "\n";
        auto written = co_await response.async_write(frame);
        if (!written) co_return;
    }
    auto ended = co_await response.async_end();
    (void)ended;
}

struct proxied_server {
    proxied_server() : server(io.get_executor(), http::server_options{}) {
        REQUIRE(server.route("GET", "/big", serve_big));
        REQUIRE(server.route("GET", "/stream", serve_stream));
        auto bound = server.start();
        REQUIRE(bound.has_value());
        proxy = std::make_unique<tcp_fault_proxy>("127.0.0.1", bound->port());
    }
    ~proxied_server() {
        client.reset();
        proxy.reset();
        moat::test::run_async(io, server.async_stop(1s));
    }

    moat::result<http::full_response> get(const std::string& path,
                                          std::chrono::milliseconds limit = 10s) {
        http::request req;
        req.url = proxy->url() + path;
        req.limit = moat::deadline::after(limit);
        return moat::test::run_async(io, client->async_fetch(std::move(req), 1 << 20));
    }

    asio::io_context io;
    http::server server;
    std::unique_ptr<tcp_fault_proxy> proxy;
    std::unique_ptr<http::client> client = std::make_unique<http::client>(io.get_executor());
};

bool is(const moat::error& e, moat::errc code) {
    return e.code == moat::make_error_code(code);
}

}  // namespace

TEST_CASE("the fault proxy passes traffic unchanged, keeps connections alive and rewrites Host") {
    const std::size_t before = open_descriptors();
    {
        proxied_server s;
        for (int i = 0; i < 3; ++i) {
            const auto r = s.get("/big");
            REQUIRE_MESSAGE(r.has_value(), r.error().detail);
            CHECK(r->status() == 200);  // not 421: the Host names the upstream's port
            CHECK(r->body == big_body);
        }
        const auto streamed = s.get("/stream");
        REQUIRE(streamed.has_value());
        std::string expected;
        for (int i = 0; i < 10; ++i) expected += "frame " + std::to_string(i) + "\n";
        CHECK(streamed->body == expected);
        CHECK(s.proxy->connections_accepted() == 1);
        CHECK(s.proxy->requests_seen() == 4);
        CHECK(s.proxy->fired() == 0);
    }
    CHECK(open_descriptors() == before);
}

TEST_CASE("the fault proxy resets a connection after N response bytes, once") {
    proxied_server s;
    s.proxy->arm(tcp_fault_proxy::reset_after(20'000));
    const auto broken = s.get("/big");
    REQUIRE(!broken.has_value());
    CHECK_MESSAGE(is(broken.error(), moat::errc::backend_failure), broken.error().detail);
    CHECK(s.proxy->fired() == 1);
    const auto next = s.get("/big");
    REQUIRE_MESSAGE(next.has_value(), next.error().detail);
    CHECK(next->body == big_body);
}

TEST_CASE("the fault proxy truncates a body, and a fault armed for another path does not fire") {
    proxied_server s;
    s.proxy->arm(tcp_fault_proxy::truncate_after(5, "/stream", true));
    const auto whole = s.get("/big");
    REQUIRE(whole.has_value());
    CHECK(s.proxy->fired() == 0);
    const auto cut = s.get("/stream");
    REQUIRE(!cut.has_value());
    CHECK_MESSAGE(is(cut.error(), moat::errc::protocol_error), cut.error().detail);
    CHECK(s.proxy->fired() == 1);
    CHECK(s.proxy->armed() == 0);
}

TEST_CASE("the fault proxy stalls a response or every connection until resumed") {
    proxied_server s;
    s.proxy->arm(tcp_fault_proxy::stall_after(10, "/big", true));
    const auto stalled = s.get("/big", 300ms);
    REQUIRE(!stalled.has_value());
    CHECK_MESSAGE(is(stalled.error(), moat::errc::deadline_exceeded), stalled.error().detail);
    s.proxy->stall();
    const auto all_stalled = s.get("/stream", 300ms);
    REQUIRE(!all_stalled.has_value());
    CHECK(is(all_stalled.error(), moat::errc::deadline_exceeded));
    s.proxy->resume();
    const auto flowing = s.get("/big");
    REQUIRE_MESSAGE(flowing.has_value(), flowing.error().detail);
    CHECK(flowing->body == big_body);
}

TEST_CASE("the fault proxy injects garbage or a well-framed extra chunk into a response") {
    proxied_server s;
    s.proxy->arm(tcp_fault_proxy::inject_after(0, "\x01\x02garbage\r\n", "/stream", true));
    const auto garbled = s.get("/stream");
    REQUIRE(!garbled.has_value());
    CHECK_MESSAGE(is(garbled.error(), moat::errc::protocol_error), garbled.error().detail);
    s.proxy->arm(
        tcp_fault_proxy::inject_after(0, tcp_fault_proxy::chunk("EXTRA"), "/stream", true));
    const auto extra = s.get("/stream");
    REQUIRE_MESSAGE(extra.has_value(), extra.error().detail);
    CHECK(extra->body.rfind("EXTRAframe 0\n", 0) == 0);
    CHECK(tcp_fault_proxy::envelope_header(2, 0x01020304) ==
          std::string("\x02\x01\x02\x03\x04", 5));
}

asio::awaitable<void> fetch_into(http::client* client, std::string url,
                                 std::optional<moat::result<http::full_response>>* out) {
    http::request req;
    req.url = std::move(url);
    req.limit = moat::deadline::after(10s);
    *out = co_await client->async_fetch(std::move(req), 1 << 20);
}

// Three fetches at once, each on its own connection.
asio::awaitable<void> fetch_three(
    http::client* client, std::string url,
    std::vector<std::optional<moat::result<http::full_response>>>* out) {
    moat::task_group group(co_await asio::this_coro::executor, "fetches");
    for (auto& slot : *out) group.spawn(fetch_into(client, url, &slot));
    co_await group.async_wait_all();
}

TEST_CASE("the fault proxy delays responses whole and counts how many it held at once") {
    proxied_server s;
    s.proxy->arm(tcp_fault_proxy::delay_after(0, 200ms, "/big"), 4);
    const auto alone = s.get("/big");
    REQUIRE_MESSAGE(alone.has_value(), alone.error().detail);
    CHECK(alone->body == big_body);
    CHECK(s.proxy->peak_delayed() == 1);
    std::vector<std::optional<moat::result<http::full_response>>> together(3);
    moat::test::run_async(s.io, fetch_three(s.client.get(), s.proxy->url() + "/big", &together));
    for (const auto& r : together) {
        REQUIRE(r.has_value());
        REQUIRE_MESSAGE(r->has_value(), r->error().detail);
        CHECK((*r)->body == big_body);
    }
    CHECK(s.proxy->fired() == 4);
    CHECK(s.proxy->peak_delayed() == 3);
    CHECK(s.proxy->armed() == 0);
}

TEST_CASE("the fault proxy answers canned 500, 429 with Retry-After and 502 without forwarding") {
    proxied_server s;
    const auto requests_before = s.server.stats().requests;
    s.proxy->arm(tcp_fault_proxy::answer(tcp_fault_proxy::status_response(500)));
    s.proxy->arm(
        tcp_fault_proxy::answer(tcp_fault_proxy::status_response(429, "Retry-After: 3\r\n")));
    s.proxy->arm(tcp_fault_proxy::answer(tcp_fault_proxy::status_response(502)), 2);
    const auto first = s.get("/big");
    REQUIRE(first.has_value());
    CHECK(first->status() == 500);
    const auto second = s.get("/big");
    REQUIRE(second.has_value());
    CHECK(second->status() == 429);
    CHECK(http::parse_retry_after(second->head.headers) == std::chrono::seconds(3));
    for (int i = 0; i < 2; ++i) {
        const auto bad_gateway = s.get("/big");
        REQUIRE(bad_gateway.has_value());
        CHECK(bad_gateway->status() == 502);
        CHECK(bad_gateway->body.find("injected by the test proxy") != std::string::npos);
    }
    CHECK(s.server.stats().requests == requests_before);
    const auto real = s.get("/big");
    REQUIRE(real.has_value());
    CHECK(real->status() == 200);
    CHECK(s.proxy->fired() == 4);
}
