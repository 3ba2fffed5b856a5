// The e2b backend under faults, through moat::sandbox (the handle) as code above the backend uses
// it: a real `moat serve` behind two fault proxies on loopback (support/tcp_fault_proxy.hpp), one
// in front of its control plane and one in front of its envd, which the test tells to reset a
// connection mid-stream, stall, truncate a frame, send an oversized frame or garbage, or answer
// 500 / 429 / 502; and TLS with a wrong host name or an unknown CA (support/test_ca.hpp).
//
// Each fault ends in a typed error or a quarantine, never a hang (the suite's watchdog) or an
// exception. Afterwards the test's process has the same open descriptors as before it made the
// backend, and the server host runs nothing of the command (looked at below the server's pid).
// No secret (the API key, a sandbox's access token) appears in any error detail.
#include <moat/e2b_backend.hpp>
#include <moat/errc.hpp>
#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>

#include "support/async_test.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"
#include "support/serve_api.hpp"
#include "support/serve_process.hpp"
#include "support/tcp_fault_proxy.hpp"
#include "support/test_ca.hpp"

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using moat::errc;
using moat::test::tcp_fault_proxy;

namespace {

// What the descriptors are, for a failure message.
std::string descriptor_list() {
    std::string out;
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return out;
    while (const auto* entry = ::readdir(dir)) {
        if (entry->d_name[0] == '.') continue;
        char target[256] = {};
        const std::string link = std::string("/proc/self/fd/") + entry->d_name;
        const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
        out += std::string(entry->d_name) + "->" + (n > 0 ? std::string(target, n) : "?") + " ";
    }
    ::closedir(dir);
    return out;
}

using moat::test::open_descriptors;

moat::test::test_ca& suite_ca() {
    static moat::test::test_ca ca;
    return ca;
}

// One plain `moat serve` per test process, started on first use.
moat::test::serve_process& plain_serve() {
    static moat::test::serve_process serve;
    return serve;
}

bool is(const moat::error& e, errc code) {
    return e.code == moat::make_error_code(code);
}

bool is_one_of(const moat::error& e, std::initializer_list<errc> codes) {
    for (errc c : codes) {
        if (is(e, c)) return true;
    }
    return false;
}

// A backend whose traffic goes through the two proxies, a runtime over it, and the checks every
// fault case ends with.
struct faults {
    explicit faults(moat::test::serve_process& s = plain_serve(),
                    const std::function<void(moat::e2b_config&)>& adjust = {})
        : serve(s),
          descriptors_before(open_descriptors()),
          io(std::make_unique<asio::io_context>()),
          api(std::make_unique<tcp_fault_proxy>("127.0.0.1", s.api_port())),
          envd(std::make_unique<tcp_fault_proxy>("127.0.0.1", s.envd_port())) {
        moat::e2b_config config;
        config.api_key = s.api_key();
        config.api_url = api->url();
        config.sandbox_url = envd->url();
        config.domain = "localhost";
        config.request_timeout = 3s;
        config.max_retry_after = 2s;
        config.kill_grace = 2s;
        if (adjust) adjust(config);
        b = moat::make_e2b_backend(io->get_executor(), config);
        rt = std::make_unique<moat::runtime>(*b);
    }

    ~faults() { shut_down(); }

    template <class T>
    T run(asio::awaitable<T> task, std::chrono::seconds watchdog = std::chrono::seconds(120)) {
        return moat::test::run_async(*io, std::move(task), watchdog);
    }

    std::shared_ptr<moat::sandbox> create() {
        moat::sandbox_spec spec;
        spec.ttl = 5min;
        auto made = run(rt->async_create(spec));
        REQUIRE_MESSAGE(made.has_value(), made.error().detail);
        return *made;
    }

    // An error detail never carries the key or a token.
    void check_no_secret(const moat::error& e) const {
        CHECK_MESSAGE(e.detail.find(serve.api_key()) == std::string::npos, e.detail);
        CHECK_MESSAGE(e.detail.find("X-Access-Token") == std::string::npos, e.detail);
    }

    // The handle either stayed usable (the backend confirmed the stop) or quarantined itself and
    // destroyed the sandbox; either way the command is gone from the server host.
    void check_handle_and_host(moat::sandbox& box, const std::string& marker) {
        const auto state = box.state();
        if (state == moat::handle_state::ready) {
            moat::exec_request again;
            again.shell = "echo still-ready";
            const auto ok = run(box.async_exec(again));
            REQUIRE_MESSAGE(ok.has_value(), ok.error().detail);
            CHECK(ok->out.text() == "still-ready\n");
        } else {
            CHECK_MESSAGE(
                (state == moat::handle_state::quarantined ||
                 state == moat::handle_state::destroying || state == moat::handle_state::destroyed),
                moat::to_string(state));
            REQUIRE(box.quarantine_cause().has_value());
            check_no_secret(*box.quarantine_cause());
        }
        const bool gone = moat::test::eventually(
            [&] { return serve.sandbox_processes_matching(marker).empty(); }, 15s);
        CHECK_MESSAGE(gone, "left on the server host: "
                                << serve.describe(serve.sandbox_processes_matching(marker)));
    }

    void shut_down() {
        if (!b) return;
        api->disarm();
        envd->disarm();
        api->resume();
        envd->resume();
        rt.reset();
        b.reset();
        io->run_for(std::chrono::seconds(1));
        io.reset();  // its reactor's descriptors are made on first use
        api.reset();
        envd.reset();
        CHECK_MESSAGE(open_descriptors() == descriptors_before, descriptor_list());
    }

    moat::test::serve_process& serve;
    std::size_t descriptors_before;
    std::unique_ptr<asio::io_context> io;
    std::unique_ptr<tcp_fault_proxy> api;
    std::unique_ptr<tcp_fault_proxy> envd;
    std::unique_ptr<moat::backend> b;
    std::unique_ptr<moat::runtime> rt;
};

moat::exec_request started_then_sleeping(const std::string& marker) {
    moat::exec_request r;
    r.shell = "echo started; " + marker + "; echo never";
    r.wall_limit = 60s;
    return r;
}

// Runs the exec through the handle; the fault must end it with an error (the command never ends
// on its own).
moat::error exec_fails(faults& f, moat::sandbox& box, const std::string& marker,
                       moat::deadline limit = {}) {
    auto r = f.run(box.async_exec(started_then_sleeping(marker), limit));
    REQUIRE_MESSAGE(!r.has_value(), "the exec finished: " << r->out.text());
    f.check_no_secret(r.error());
    return r.error();
}

}  // namespace

TEST_CASE("an e2b exec whose stream is reset mid-stream ends in a typed error, nothing left") {
    MOAT_REQUIRE_NAMESPACES();
    faults f;
    auto box = f.create();
    // After the response head and the first frames (the start event), reset the connection.
    f.envd->arm(tcp_fault_proxy::reset_after(40, "Process/Start", true));
    const auto e = exec_fails(f, *box, "sleep 6101");
    CHECK(f.envd->fired() == 1);
    CHECK_MESSAGE(is_one_of(e, {errc::backend_failure, errc::protocol_error}), e.detail);
    f.check_handle_and_host(*box, "sleep 6101");
}

TEST_CASE("an e2b exec on a stalled stream ends at the caller's deadline, nothing left") {
    MOAT_REQUIRE_NAMESPACES();
    faults f;
    auto box = f.create();
    f.envd->arm(tcp_fault_proxy::stall_after(40, "Process/Start", true));
    const auto e = exec_fails(f, *box, "sleep 6102", moat::deadline::after(3s));
    CHECK(f.envd->fired() == 1);
    CHECK_MESSAGE(is(e, errc::deadline_exceeded), e.detail);
    f.envd->resume();
    f.check_handle_and_host(*box, "sleep 6102");
}

TEST_CASE("an e2b exec while the whole server stalls ends at its deadline in a quarantine") {
    MOAT_REQUIRE_NAMESPACES();
    faults f;
    auto box = f.create();
    moat::exec_request ok;
    ok.shell = "echo warm";
    REQUIRE(f.run(box->async_exec(ok)).has_value());
    f.envd->stall();
    const auto e = exec_fails(f, *box, "sleep 6103", moat::deadline::after(2s));
    CHECK_MESSAGE(is_one_of(e, {errc::deadline_exceeded, errc::backend_failure}), e.detail);
    // Its kill could not get through either: the handle cannot vouch for the sandbox.
    CHECK(box->state() != moat::handle_state::ready);
    f.envd->resume();
    const auto destroyed = f.run(box->async_destroy());
    CHECK_MESSAGE(destroyed.has_value(), (destroyed ? "" : destroyed.error().detail));
    f.check_handle_and_host(*box, "sleep 6103");
}

TEST_CASE("an e2b exec whose stream is cut inside a frame ends in a typed error, nothing left") {
    MOAT_REQUIRE_NAMESPACES();
    faults f;
    auto box = f.create();
    // 8 bytes into the chunked body: inside the first envelope (its size line, then 5 bytes of
    // header and the JSON of the start event), then a clean close.
    f.envd->arm(tcp_fault_proxy::truncate_after(8, "Process/Start", true));
    const auto e = exec_fails(f, *box, "sleep 6104");
    CHECK(f.envd->fired() == 1);
    CHECK_MESSAGE(is_one_of(e, {errc::backend_failure, errc::protocol_error}), e.detail);
    f.check_handle_and_host(*box, "sleep 6104");
}

TEST_CASE("an e2b exec sent an oversized frame ends in a protocol error, nothing left") {
    MOAT_REQUIRE_NAMESPACES();
    faults f;
    auto box = f.create();
    // A well-framed chunk whose envelope claims 2 GiB: the decoder's cap refuses it.
    const std::string lie = tcp_fault_proxy::envelope_header(0, 0x7fffffff) + "{";
    f.envd->arm(
        tcp_fault_proxy::inject_after(0, tcp_fault_proxy::chunk(lie), "Process/Start", true));
    const auto e = exec_fails(f, *box, "sleep 6105");
    CHECK(f.envd->fired() == 1);
    CHECK_MESSAGE(is_one_of(e, {errc::protocol_error, errc::backend_failure}), e.detail);
    f.check_handle_and_host(*box, "sleep 6105");
}

TEST_CASE("an e2b exec sent garbage bytes ends in a protocol error, nothing left") {
    MOAT_REQUIRE_NAMESPACES();
    faults f;
    auto box = f.create();
    f.envd->arm(
        tcp_fault_proxy::inject_after(0, "\x01\xff garbage \x00\r\n", "Process/Start", true));
    const auto e = exec_fails(f, *box, "sleep 6106");
    CHECK(f.envd->fired() == 1);
    CHECK_MESSAGE(is_one_of(e, {errc::protocol_error, errc::backend_failure}), e.detail);
    f.check_handle_and_host(*box, "sleep 6106");
}

TEST_CASE(
    "the e2b control plane's 500 fails a create at once, 429 with Retry-After is waited out") {
    MOAT_REQUIRE_NAMESPACES();
    faults f;
    moat::sandbox_spec spec;
    spec.ttl = 5min;
    const std::string create_line = "POST /v2/sandboxes HTTP";
    // A create is never retried blindly: one 500 fails it.
    f.api->arm(tcp_fault_proxy::answer(tcp_fault_proxy::status_response(500), create_line));
    const auto agents_before = f.serve.sandbox_agents().size();
    const auto failed = f.run(f.rt->async_create(spec));
    REQUIRE(!failed.has_value());
    CHECK_MESSAGE(is(failed.error(), errc::backend_failure), failed.error().detail);
    f.check_no_secret(failed.error());
    CHECK(f.api->fired() == 1);
    CHECK(f.serve.sandbox_agents().size() == agents_before);
    // 429 with Retry-After: 1 is honoured (under max_retry_after), then the create goes through.
    f.api->arm(tcp_fault_proxy::answer(tcp_fault_proxy::status_response(429, "Retry-After: 1\r\n"),
                                       create_line));
    const auto made = f.run(f.rt->async_create(spec));
    REQUIRE_MESSAGE(made.has_value(), made.error().detail);
    CHECK(f.api->fired() == 2);
    // A Retry-After past max_retry_after is not waited for: rate_limited, retryable.
    f.api->arm(tcp_fault_proxy::answer(
        tcp_fault_proxy::status_response(429, "Retry-After: 3600\r\n"), create_line));
    const auto limited = f.run(f.rt->async_create(spec));
    REQUIRE(!limited.has_value());
    CHECK_MESSAGE(is(limited.error(), errc::rate_limited), limited.error().detail);
    CHECK(limited.error().code == moat::condition::retryable);
    const auto destroyed = f.run((*made)->async_destroy());
    CHECK(destroyed.has_value());
}

TEST_CASE("the e2b backend retries 502 on idempotent calls only, and envd's 502 is a typed error") {
    MOAT_REQUIRE_NAMESPACES();
    faults f;
    auto box = f.create();
    const std::string get_line = "GET /sandboxes/" + box->id() + " HTTP";
    // GET is idempotent: one 502 is retried and the inspect succeeds.
    f.api->arm(tcp_fault_proxy::answer(tcp_fault_proxy::status_response(502), get_line));
    const auto seen = f.run(f.b->async_inspect(box->id()));
    REQUIRE_MESSAGE(seen.has_value(), seen.error().detail);
    CHECK(f.api->fired() == 1);
    // 502 on every try: a bounded number of retries, then backend_failure.
    f.api->arm(tcp_fault_proxy::answer(tcp_fault_proxy::status_response(502), get_line), 100);
    const auto failed = f.run(f.b->async_inspect(box->id()));
    REQUIRE(!failed.has_value());
    CHECK_MESSAGE(is(failed.error(), errc::backend_failure), failed.error().detail);
    const auto tries = f.api->fired() - 1;
    CHECK(tries >= 2);
    CHECK(tries < 10);
    f.api->disarm();
    // Start is never retried blindly: envd's 502 fails the exec.
    f.envd->arm(tcp_fault_proxy::answer(tcp_fault_proxy::status_response(502), "Process/Start"));
    const auto e = exec_fails(f, *box, "sleep 6108");
    CHECK(f.envd->fired() == 1);
    CHECK_MESSAGE(is_one_of(e, {errc::backend_failure, errc::sandbox_unavailable}), e.detail);
    f.check_handle_and_host(*box, "sleep 6108");
}

TEST_CASE("the e2b backend refuses TLS with a wrong host name or an unknown CA, in one line") {
    MOAT_REQUIRE_NAMESPACES();
    auto& ca = suite_ca();
    for (const bool wrong_host : {true, false}) {
        CAPTURE(wrong_host);
        moat::test::serve_process_options options;
        options.tls_cert_file = wrong_host ? ca.wrong_host_cert_file : ca.server_cert_file;
        options.tls_key_file = wrong_host ? ca.wrong_host_key_file : ca.server_key_file;
        moat::test::serve_process serve(options);
        const std::size_t before = open_descriptors();
        {
            asio::io_context io;
            moat::e2b_config config;
            config.api_key = serve.api_key();
            config.api_url = serve.api_url();
            config.sandbox_url = serve.envd_url();
            config.domain = "localhost";
            config.use_system_ca_store = false;
            config.ca_file = wrong_host ? ca.ca_file : ca.unknown_ca_file;
            auto b = moat::make_e2b_backend(io.get_executor(), config);
            moat::sandbox_spec spec;
            spec.ttl = 1min;
            const auto refused = moat::test::run_async(io, b->async_create(spec));
            REQUIRE(!refused.has_value());
            CHECK_MESSAGE(is(refused.error(), errc::backend_failure), refused.error().detail);
            CHECK_MESSAGE(
                refused.error().detail.find("certificate verify failed") != std::string::npos,
                refused.error().detail);
            CHECK(refused.error().detail.find('\n') == std::string::npos);
            CHECK(refused.error().detail.find(serve.api_key()) == std::string::npos);
            CHECK(serve.sandbox_agents().empty());
            b.reset();
            io.run_for(std::chrono::milliseconds(200));
        }
        CHECK(open_descriptors() == before);
        CHECK(serve.stop() == 0);
    }
}

namespace {

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(d);
    co_await timer.async_wait(asio::use_awaitable);
}

}  // namespace

// Every renewal answered 400 ms late: one at a time, a round of 12 would take 4.8 s, and with the
// 1 s interval each sandbox's next renewal would come 5.8 s after its last, past its 4 s E2B
// timeout, so every one would end. Eight in flight at once, a round takes about 0.8 s.
TEST_CASE(
    "the e2b heartbeat renews concurrently, at most half the connection budget at once, so a "
    "slow control plane does not let in-use sandboxes expire") {
    MOAT_REQUIRE_NAMESPACES();
    faults f(plain_serve(), [](moat::e2b_config& c) {
        c.heartbeat_timeout = 4s;
        c.heartbeat_interval = 1s;
    });
    constexpr std::size_t count = 12;
    std::vector<std::string> ids;
    for (std::size_t i = 0; i < count; ++i) {
        moat::sandbox_spec spec;
        spec.ttl = 5min;
        const auto made = f.run(f.b->async_create(spec));
        REQUIRE_MESSAGE(made.has_value(), made.error().detail);
        ids.push_back(made->id);
    }
    // Straight to the server: what it holds, unaffected by the proxy.
    auto observer =
        moat::make_e2b_backend(f.io->get_executor(), moat::test::e2b_config_for(f.serve));

    f.api->arm(tcp_fault_proxy::delay_after(0, 400ms, "/timeout HTTP"), 100'000);
    f.run(sleep_for(8s));
    const auto renewals = f.api->fired();
    const auto peak = f.api->peak_delayed();
    MESSAGE("renewals in 8 s: " << renewals << ", at most " << peak << " in flight at once");
    CHECK(renewals >= 2 * count);
    CHECK(peak > 1);
    CHECK(peak <= 8);  // half of the HTTP client's 16 connections per origin
    for (const auto& id : ids) {
        CAPTURE(id);
        const auto seen = f.run(observer->async_inspect(id));
        CHECK_MESSAGE(seen.has_value(), (seen ? "" : seen.error().detail));
        if (seen) CHECK(seen->state == moat::sandbox_state::running);
    }
    f.api->disarm();
    for (const auto& id : ids) {
        const auto destroyed = f.run(f.b->async_destroy(id));
        CHECK_MESSAGE(destroyed.has_value(), (destroyed ? "" : destroyed.error().detail));
    }
    observer.reset();
}
