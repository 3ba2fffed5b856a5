// The e2b backend's heartbeat over 500 sandboxes, measured (dev build only, ctest label "load"):
// a real `moat serve` holds them, and a tcp_fault_proxy in front of its control plane sees every
// renewal (POST /sandboxes/{id}/timeout). One round is timed as it comes (on loopback), then one
// with every renewal answered 200 ms late, as a distant or rate-limited control plane would: one
// at a time, that round would take 500 x 200 ms = 100 s, more than the 90 s between the default
// heartbeat_timeout (2 min) and heartbeat_interval (30 s), and sandboxes would expire while in
// use. The test prints each round's time (seen at the proxy, and as the backend logged it) and
// how many renewals were in flight at once; it asserts only that every sandbox was renewed, that
// more than one but no more than half the connection budget was in flight, and that every sandbox
// is still alive afterwards, never a time.
#include <moat/e2b_backend.hpp>
#include <moat/log.hpp>
#include <moat/task_group.hpp>

#include "support/async_test.hpp"
#include "support/local_fixture.hpp"
#include "support/serve_api.hpp"
#include "support/serve_process.hpp"
#include "support/tcp_fault_proxy.hpp"

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using moat::test::tcp_fault_proxy;

constexpr std::size_t sandbox_count = 500;
constexpr std::size_t create_concurrency = 8;
constexpr auto renewal_delay = 200ms;

// What the creators and destroyers share: the ids, the next one to take, the failures.
struct fleet {
    moat::backend* backend = nullptr;
    std::vector<std::string> ids;
    std::size_t next = 0;
    std::vector<std::string> failures;
};

asio::awaitable<void> create_some(fleet* f) {
    while (f->next < sandbox_count) {
        ++f->next;
        moat::sandbox_spec spec;
        spec.ttl = 30min;
        spec.labels["test"] = "heartbeat-load";
        auto made = co_await f->backend->async_create(spec);
        if (made) {
            f->ids.push_back(made->id);
        } else {
            f->failures.push_back(made.error().to_string());
        }
    }
}

asio::awaitable<void> destroy_some(fleet* f) {
    while (f->next < f->ids.size()) {
        const std::string id = f->ids[f->next++];
        auto destroyed = co_await f->backend->async_destroy(id);
        if (!destroyed) f->failures.push_back(id + ": " + destroyed.error().to_string());
    }
}

asio::awaitable<void> in_parallel(fleet* f, bool creating) {
    moat::task_group workers(co_await asio::this_coro::executor, "heartbeat load");
    for (std::size_t i = 0; i < create_concurrency; ++i) {
        if (creating) {
            workers.spawn(create_some(f));
        } else {
            workers.spawn(destroy_some(f));
        }
    }
    co_await workers.async_wait_all();
}

// Runs the backend's executor until `done` says so, looking every 10 ms.
template <class Done>
asio::awaitable<void> run_until(Done done, std::chrono::seconds bound) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    const auto limit = clock_type::now() + bound;
    while (!done() && clock_type::now() < limit) {
        timer.expires_after(10ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
}

asio::awaitable<std::size_t> count_running(moat::backend* observer, std::vector<std::string> ids) {
    std::size_t running = 0;
    for (const auto& id : ids) {
        auto seen = co_await observer->async_inspect(id);
        if (seen && seen->state == moat::sandbox_state::running) ++running;
    }
    co_return running;
}

double seconds(clock_type::duration d) {
    return std::chrono::duration<double>(d).count();
}

// The backend's own "a round of N renewals took X ms" lines.
struct round_log {
    round_log() {
        moat::set_log_sink([this](const moat::log_record& r) {
            if (r.message.find("heartbeat: a round of") == std::string_view::npos) return;
            const std::lock_guard lock(mutex);
            lines.emplace_back(r.message);
        });
    }
    ~round_log() { moat::set_log_sink({}); }
    std::vector<std::string> all() {
        const std::lock_guard lock(mutex);
        return lines;
    }
    std::mutex mutex;
    std::vector<std::string> lines;
};

struct round_measure {
    double seconds = 0;
    std::uint64_t renewals = 0;
    std::size_t peak_in_flight = 0;
    std::string backend_line;
    std::string describe() const {
        return std::to_string(seconds) + " s at the proxy (" + std::to_string(renewals) +
               " renewals, at most " + std::to_string(peak_in_flight) +
               " in flight at once); the backend logged \"" + backend_line + "\"";
    }
};

// Every renewal from now on answered `delay` late; then, between two rounds (the renewals stand
// still for 3 s), one whole round: as many renewals as sandboxes, timed from its first renewal's
// answer to its last's (plus one delay: the last answer is held that long).
round_measure measure_round(asio::io_context& io, tcp_fault_proxy& api, round_log& rounds,
                            std::chrono::milliseconds delay) {
    api.disarm();
    api.arm(tcp_fault_proxy::delay_after(0, delay, "/timeout HTTP"), 1'000'000);
    api.reset_peak_delayed();
    std::uint64_t seen = api.fired();
    auto quiet_since = clock_type::now();
    const auto is_quiet = [&] {
        if (api.fired() != seen) {
            seen = api.fired();
            quiet_since = clock_type::now();
        }
        return clock_type::now() - quiet_since > 3s;
    };
    moat::test::run_async(io, run_until(is_quiet, 300s), 330s);
    const std::uint64_t before = api.fired();
    const std::size_t logged_before = rounds.all().size();
    moat::test::run_async(io, run_until([&] { return api.fired() > before; }, 60s), 90s);
    const auto start = clock_type::now();
    moat::test::run_async(
        io, run_until([&] { return api.fired() >= before + sandbox_count; }, 300s), 330s);
    round_measure m;
    m.seconds = seconds(clock_type::now() - start) + std::chrono::duration<double>(delay).count();
    m.renewals = api.fired() - before;
    m.peak_in_flight = api.peak_delayed();
    // The backend's line for this round comes once its last renewal's answer is through.
    moat::test::run_async(io, run_until([&] { return rounds.all().size() > logged_before; }, 30s),
                          60s);
    const auto logged = rounds.all();
    m.backend_line = logged.size() > logged_before ? logged.back() : "(none)";
    return m;
}

}  // namespace

TEST_CASE(
    "the e2b heartbeat, measured: a round over 500 sandboxes on moat serve, each renewal 200 ms "
    "late, stays inside the 90 s margin") {
    MOAT_REQUIRE_NAMESPACES();
    moat::test::serve_process serve;
    tcp_fault_proxy api("127.0.0.1", serve.api_port());
    round_log rounds;
    asio::io_context io;
    auto direct = moat::test::e2b_config_for(serve);
    direct.request_timeout = 60s;
    auto config = direct;
    config.api_url = api.url();
    auto backend = moat::make_e2b_backend(io.get_executor(), config);
    auto observer = moat::make_e2b_backend(io.get_executor(), direct);

    fleet f;
    f.backend = backend.get();
    const auto create_start = clock_type::now();
    moat::test::run_async(io, in_parallel(&f, true), 900s);
    const double create_seconds = seconds(clock_type::now() - create_start);
    const std::string first_failure = f.failures.empty() ? "" : f.failures.front();
    REQUIRE_MESSAGE(f.failures.empty(), first_failure);
    REQUIRE(f.ids.size() == sandbox_count);

    const std::size_t agents = serve.sandbox_agents().size();
    const auto undelayed = measure_round(io, api, rounds, 0ms);
    const auto delayed = measure_round(io, api, rounds, renewal_delay);
    const auto running = moat::test::run_async(io, count_running(observer.get(), f.ids), 300s);
    MESSAGE("created " << f.ids.size() << " sandboxes in " << create_seconds << " s ("
                       << create_concurrency << " at a time); " << agents
                       << " sandbox agents on the host");
    MESSAGE("one heartbeat round over " << sandbox_count
                                        << " sandboxes, straight: " << undelayed.describe());
    MESSAGE("one heartbeat round over " << sandbox_count << " sandboxes, each renewal answered "
                                        << renewal_delay.count()
                                        << " ms late: " << delayed.describe());
    MESSAGE(running << " of " << sandbox_count << " sandboxes still running afterwards");
    CHECK(undelayed.renewals >= sandbox_count);
    CHECK(delayed.renewals >= sandbox_count);
    CHECK(delayed.peak_in_flight > 1);
    CHECK(delayed.peak_in_flight <= 8);
    CHECK(running == sandbox_count);

    api.disarm();
    f.next = 0;
    f.failures.clear();
    moat::test::run_async(io, in_parallel(&f, false), 900s);
    const std::string first_destroy_failure = f.failures.empty() ? "" : f.failures.front();
    CHECK_MESSAGE(f.failures.empty(), first_destroy_failure);
    observer.reset();
    backend.reset();
    io.run_for(1s);
    CHECK(serve.stop() == 0);
}
