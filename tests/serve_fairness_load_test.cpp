// `moat serve` when one client misbehaves, measured (dev build only, ctest label "load"): while a
// client stalls a 1 GiB download from a sandbox, 100 Stats on that sandbox; and with 2,000
// unauthenticated idle connections open, an authenticated create. The test prints the latencies
// and asserts only that every call completes within 5 s, never a latency threshold.
#include "e2b/envd_client.hpp"
#include "http/client.hpp"
#include "support/async_test.hpp"
#include "support/serve_process.hpp"

#include <moat/backend.hpp>
#include <moat/deadline.hpp>

#include <asio/io_context.hpp>

#include <doctest/doctest.h>
#include <simdjson.h>

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr auto every_call_within = 5s;

struct sandbox_ref {
    std::string id;
    std::string token;
};

asio::awaitable<moat::result<sandbox_ref>> create_sandbox(moat::http::client& client,
                                                          const moat::test::serve_process& serve) {
    moat::http::request request;
    request.method = "POST";
    request.url = serve.api_url() + "/v2/sandboxes";
    request.headers.add("X-API-Key", serve.api_key());
    request.headers.add("Content-Type", "application/json");
    request.body = R"({"templateID":"base","timeout":600})";
    request.limit = moat::deadline::after(60s);
    auto reply = co_await client.async_fetch(std::move(request), 1 << 20);
    if (!reply) co_return reply.error();
    if (reply->status() != 201)
        co_return moat::make_error(moat::errc::backend_failure,
                                   "create answered " + std::to_string(reply->status()));
    simdjson::dom::parser parser;
    const simdjson::padded_string text(reply->body);
    simdjson::dom::element root = parser.parse(text);
    sandbox_ref ref;
    ref.id = std::string(std::string_view(root["sandboxID"]));
    ref.token = std::string(std::string_view(root["envdAccessToken"]));
    co_return ref;
}

int connect_loopback(unsigned short port, int receive_window = 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    if (receive_window > 0)
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_window, sizeof receive_window);
    timeval bound{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
    return fd;
}

void send_all(int fd, const std::string& data) {
    REQUIRE(::send(fd, data.data(), data.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(data.size()));
}

double ms(clock_type::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
}

// The q-th quantile (0..1) of `samples` (sorted here).
double quantile(std::vector<double> samples, double q) {
    std::sort(samples.begin(), samples.end());
    const auto at = static_cast<std::size_t>(q * static_cast<double>(samples.size() - 1) + 0.5);
    return samples[at];
}

}  // namespace

TEST_CASE(
    "moat serve, measured: 100 Stats beside a stalled 1 GiB download, and an authenticated create "
    "beside 2000 idle unauthenticated connections") {
    // The test's own 2,000 sockets need more than a default soft limit of 1024.
    rlimit files{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &files) == 0);
    if (files.rlim_cur < 8192 && files.rlim_max >= 8192) {
        files.rlim_cur = 8192;
        REQUIRE(::setrlimit(RLIMIT_NOFILE, &files) == 0);
    }
    moat::test::serve_process serve;
    asio::io_context io;
    auto http = std::make_shared<moat::http::client>(io.get_executor());
    auto created = moat::test::run_async(io, create_sandbox(*http, serve));
    REQUIRE_MESSAGE(created, created.error().to_string());
    moat::e2b::envd_endpoint endpoint;
    endpoint.base_url = serve.envd_url();
    endpoint.sandbox_id = created->id;
    endpoint.access_token = created->token;
    moat::e2b::envd_client envd(http, endpoint, {});

    // A sparse 1 GiB file: read back as zeros, without taking a GiB of the sandbox's disk.
    std::string path;
    moat::test::run_async(io, [&]() -> asio::awaitable<void> {
        moat::exec_request make;
        make.shell = "truncate -s 1G \"$HOME/big\" && printf %s \"$HOME/big\"";
        make.wall_limit = 30s;
        const auto limits = make.output;
        auto stream = co_await envd.async_exec_stream(std::move(make));
        REQUIRE_MESSAGE(stream, stream.error().to_string());
        auto made = co_await moat::async_collect(std::move(*stream), limits);
        REQUIRE_MESSAGE(made, made.error().to_string());
        REQUIRE(made->exit_code == 0);
        path = made->out.head;
    }());
    REQUIRE(path.rfind('/', 0) == 0);

    // The download nobody reads.
    const int stalled = connect_loopback(serve.envd_port(), 4096);
    send_all(stalled, "GET /files?path=" + path + " HTTP/1.1\r\nHost: 127.0.0.1:" +
                          std::to_string(serve.envd_port()) + "\r\nE2b-Sandbox-Id: " + created->id +
                          "\r\nX-Access-Token: " + created->token + "\r\n\r\n");
    char first[64];
    REQUIRE(::recv(stalled, first, sizeof first, MSG_PEEK) > 0);  // the body has begun

    std::vector<double> stat_ms;
    moat::test::run_async(io, [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 100; ++i) {
            const auto started = clock_type::now();
            auto st = co_await envd.async_stat(path);
            const auto took = clock_type::now() - started;
            REQUIRE_MESSAGE(st, st.error().to_string());
            CHECK(st->size == 1024ull * 1024 * 1024);
            CHECK(took < every_call_within);
            stat_ms.push_back(ms(took));
        }
    }());
    ::close(stalled);
    std::printf(
        "serve fairness: 100 Stats beside a stalled 1 GiB download: p50 %.2f ms, p99 %.2f "
        "ms, max %.2f ms\n",
        quantile(stat_ms, 0.5), quantile(stat_ms, 0.99), quantile(stat_ms, 1.0));

    // 2,000 keep-alive connections that asked GET /health once and sit idle, unauthenticated.
    std::vector<int> idle;
    for (const auto port : {serve.api_port(), serve.envd_port()}) {
        const std::string health =
            "GET /health HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n\r\n";
        for (int i = 0; i < 1000; ++i) {
            const int fd = connect_loopback(port);
            idle.push_back(fd);
            (void)::send(fd, health.data(), health.size(), MSG_NOSIGNAL);
            char reply[512];
            (void)::recv(fd, reply, sizeof reply, 0);
        }
    }
    std::this_thread::sleep_for(1500ms);  // past the grace of a new connection (1 s)
    const auto started = clock_type::now();
    auto second = moat::test::run_async(io, create_sandbox(*http, serve));
    const auto took = clock_type::now() - started;
    REQUIRE_MESSAGE(second, second.error().to_string());
    CHECK(took < every_call_within);
    std::printf(
        "serve fairness: an authenticated create beside 2000 idle unauthenticated "
        "connections: %.1f ms\n",
        ms(took));
    for (const int fd : idle) ::close(fd);
}
