// `moat serve` when one client misbehaves, measured (dev build only, ctest label "load"): while a
// client stalls a 1 GiB download from a sandbox, 100 Stats on that sandbox; and with 2,000
// unauthenticated idle connections open, an authenticated create. The test prints the latencies
// and asserts only that every call completes within 5 s, never a latency threshold.
#include "e2b/envd_client.hpp"
#include "http/client.hpp"
#include "support/async_test.hpp"
#include "support/loopback_peer.hpp"
#include "support/serve_api.hpp"
#include "support/serve_process.hpp"

#include <moat/backend.hpp>
#include <moat/deadline.hpp>

#include <asio/io_context.hpp>

#include <doctest/doctest.h>

#include <sys/socket.h>
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
    moat::test::raise_open_files(8192);  // the test's own 2,000 sockets
    moat::test::serve_process serve;
    asio::io_context io;
    auto http = std::make_shared<moat::http::client>(io.get_executor());
    auto created = moat::test::run_async(io, moat::test::async_create_serve_sandbox(*http, serve));
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
    const int stalled = moat::test::connect_loopback(serve.envd_port(), 5s, 4096);
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
    auto idle = moat::test::open_idle_health_clients(serve.api_port(), 1000);
    const auto envd_idle = moat::test::open_idle_health_clients(serve.envd_port(), 1000);
    idle.insert(idle.end(), envd_idle.begin(), envd_idle.end());
    std::this_thread::sleep_for(1500ms);  // past the grace of a new connection (1 s)
    const auto started = clock_type::now();
    auto second = moat::test::run_async(io, moat::test::async_create_serve_sandbox(*http, serve));
    const auto took = clock_type::now() - started;
    REQUIRE_MESSAGE(second, second.error().to_string());
    CHECK(took < every_call_within);
    std::printf(
        "serve fairness: an authenticated create beside 2000 idle unauthenticated "
        "connections: %.1f ms\n",
        ms(took));
    for (const int fd : idle) ::close(fd);
}
