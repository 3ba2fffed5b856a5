// The e2b backend's control plane and lifecycle against a real `moat serve` the test starts
// (support/serve_process.hpp). Faults the real server cannot produce on demand (a 500 that echoes
// the API key, 429 with a Retry-After, 503, a connection reset, a control plane without the v2
// routes) come from a canned HTTP responder on a loopback socket.
#include <moat/e2b_backend.hpp>
#include <moat/log.hpp>
#include <moat/with_timeout.hpp>

#include "core/asio_compat.hpp"
#include "e2b/control_plane_client.hpp"
#include "e2b_protocol/error_body.hpp"
#include "e2b_protocol/sandbox_replies.hpp"
#include "http/client.hpp"
#include "support/async_test.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/loopback_peer.hpp"
#include "support/moat_cli.hpp"
#include "support/serve_process.hpp"

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

namespace {

using namespace std::chrono_literals;
using moat::backend;
using moat::errc;
using moat::result;
using moat::sandbox_info;
using moat::sandbox_spec;

moat::e2b_config config_for(const moat::test::serve_process& serve) {
    moat::e2b_config c;
    c.api_url = serve.api_url();
    c.sandbox_url = serve.envd_url();
    c.api_key = serve.api_key();
    c.request_timeout = 20s;
    return c;
}

// Every log line moat writes while it lives.
struct log_capture {
    log_capture() {
        moat::set_log_sink([this](const moat::log_record& r) {
            const std::lock_guard lock(mutex);
            lines.push_back(std::string(r.component) + ": " + std::string(r.message));
        });
    }
    ~log_capture() { moat::set_log_sink({}); }
    std::string all() {
        const std::lock_guard lock(mutex);
        std::string out;
        for (const auto& l : lines) out += l + "\n";
        return out;
    }
    std::mutex mutex;
    std::vector<std::string> lines;
};

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(d);
    auto [ec] = co_await timer.async_wait(moat::as_tuple(asio::use_awaitable));
    (void)ec;
}

// A loopback HTTP/1.1 responder on a thread: reads one request per connection (head and a
// Content-Length body), records it and answers with what `respond` returns ("" resets the
// connection), then closes.
class canned_server {
  public:
    using responder = std::function<std::string(const std::string& request)>;
    explicit canned_server(responder respond) : respond_(std::move(respond)) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd_ >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
        REQUIRE(::listen(fd_, 16) == 0);
        socklen_t n = sizeof a;
        REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &n) == 0);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { run(); });
    }
    ~canned_server() {
        stop_ = true;
        thread_.join();
        ::close(fd_);
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
    std::vector<std::string> requests() {
        const std::lock_guard lock(mutex_);
        return requests_;
    }

  private:
    void run() {
        while (!stop_) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) continue;
            serve_one(c);
            ::close(c);
        }
    }
    void serve_one(int c) {
        std::string in;
        char buffer[4096];
        std::size_t head_end = std::string::npos;
        std::size_t want = 0;
        for (;;) {
            pollfd p{c, POLLIN, 0};
            if (::poll(&p, 1, 5000) <= 0) return;
            const ssize_t n = ::read(c, buffer, sizeof buffer);
            if (n <= 0) return;
            in.append(buffer, static_cast<std::size_t>(n));
            if (head_end == std::string::npos) {
                head_end = in.find("\r\n\r\n");
                if (head_end == std::string::npos) continue;
                const auto cl = in.find("Content-Length: ");
                if (cl != std::string::npos && cl < head_end) want = std::stoul(in.substr(cl + 16));
            }
            if (in.size() >= head_end + 4 + want) break;
        }
        {
            const std::lock_guard lock(mutex_);
            requests_.push_back(in);
        }
        const std::string out = respond_(in);
        if (out.empty()) {
            linger l{1, 0};  // close with RST
            ::setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
            return;
        }
        (void)::write(c, out.data(), out.size());
    }

    responder respond_;
    int fd_ = -1;
    unsigned short port_ = 0;
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::vector<std::string> requests_;
    std::thread thread_;
};

std::string http_reply(int status, const std::string& extra_headers, const std::string& body) {
    return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\n" +
           extra_headers + "Content-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
}

// --- lifecycle ---

struct lifecycle_outcome {
    result<sandbox_info> created, inspected, extended;
    result<std::vector<sandbox_info>> matching, other;
    result<void> destroyed, destroyed_again;
    result<sandbox_info> inspected_after;
};

asio::awaitable<lifecycle_outcome> lifecycle(backend* b) {
    lifecycle_outcome o;
    sandbox_spec spec;
    spec.labels["app"] = "a b&c=d";
    spec.labels["team"] = "one";
    spec.ttl = 10min;
    o.created = co_await b->async_create(spec);
    if (!o.created) co_return o;
    const std::string id = o.created->id;
    o.inspected = co_await b->async_inspect(id);
    moat::label_filter filter;
    filter["app"] = "a b&c=d";
    o.matching = co_await b->async_list(filter);
    moat::label_filter none;
    none["app"] = "a b";
    o.other = co_await b->async_list(none);
    o.extended = co_await b->async_extend_ttl(id, 30min);
    o.destroyed = co_await b->async_destroy(id);
    o.destroyed_again = co_await b->async_destroy(id);
    o.inspected_after = co_await b->async_inspect(id);
    co_return o;
}

TEST_CASE(
    "e2b backend against moat serve: create, inspect, list by label, extend_ttl, destroy "
    "confirmed") {
    moat::test::serve_process serve;
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    CHECK(b->name() == "e2b");
    const auto started = std::chrono::system_clock::now();
    auto o = moat::test::run_async(io, lifecycle(b.get()));
    REQUIRE_MESSAGE(o.created, o.created.error().to_string());
    CHECK(o.created->state == moat::sandbox_state::running);
    CHECK(o.created->layout.home == "/home/user");
    CHECK(o.created->layout.workdir == "/home/user");
    CHECK(o.created->layout.user == "user");
    CHECK(o.created->owned);
    CHECK_FALSE(o.created->survive_owner);
    REQUIRE_MESSAGE(o.inspected, o.inspected.error().to_string());
    CHECK(o.inspected->id == o.created->id);
    // The moat.* metadata is the backend's: labels come back as the caller set them.
    CHECK(o.inspected->labels == o.created->labels);
    CHECK(o.inspected->owner_instance == o.created->owner_instance);
    CHECK(o.inspected->owned);
    // A held sandbox reports its own TTL, not the heartbeat's short E2B timeout.
    CHECK(o.inspected->expires_at >= started + 9min);
    REQUIRE_MESSAGE(o.matching, o.matching.error().to_string());
    REQUIRE(o.matching->size() == 1);
    CHECK(o.matching->front().id == o.created->id);
    REQUIRE(o.other);
    CHECK(o.other->empty());
    REQUIRE_MESSAGE(o.extended, o.extended.error().to_string());
    CHECK(o.extended->expires_at >= started + 29min);
    CHECK_MESSAGE(o.destroyed, o.destroyed.error().to_string());
    REQUIRE_FALSE(o.destroyed_again);
    CHECK(o.destroyed_again.error().code == errc::sandbox_not_found);
    REQUIRE_FALSE(o.inspected_after);
    CHECK(o.inspected_after.error().code == errc::sandbox_not_found);
}

TEST_CASE(
    "moat serve under a 1024-descriptor limit: 2000 idle unauthenticated connections do not keep "
    "out an authenticated create, and no error names a host path") {
    moat::test::raise_open_files(8192);  // the test's own 2000 sockets
    moat::test::serve_process_options options;
    options.open_files_limit = 1024;
    moat::test::serve_process serve(options);
    auto flood = moat::test::open_idle_health_clients(serve.api_port(), 1000);
    auto envd_flood = moat::test::open_idle_health_clients(serve.envd_port(), 1000);
    // Idle past the grace a new connection has before it may be closed to make room (1 s).
    std::this_thread::sleep_for(1500ms);
    // The flood holds no more than its share: half of serve's descriptors stay for sandboxes.
    const auto held = std::distance(
        std::filesystem::directory_iterator("/proc/" + std::to_string(serve.pid()) + "/fd"),
        std::filesystem::directory_iterator());
    CAPTURE(held);
    CHECK(held < 512);
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    moat::test::run_async(io, [&]() -> asio::awaitable<void> {
        sandbox_spec spec;
        auto created = co_await b->async_create(std::move(spec));
        if (!created) {
            CHECK(created.error().detail.find(serve.state_dir()) == std::string::npos);
            FAIL("create failed: " << created.error().to_string());
        }
        moat::exec_request hello;
        hello.shell = "echo hello";
        auto ran = co_await b->async_exec(created->id, std::move(hello));
        REQUIRE_MESSAGE(ran, ran.error().to_string());
        CHECK(ran->out.head == "hello\n");
        auto destroyed = co_await b->async_destroy(created->id);
        CHECK_MESSAGE(destroyed, destroyed.error().to_string());
    }());
    for (const int fd : flood) ::close(fd);
    for (const int fd : envd_flood) ::close(fd);
    CHECK(serve.is_running());
}

// --- pagination ---

struct paging_outcome {
    std::vector<result<sandbox_info>> created;
    result<std::vector<moat::e2b::sandbox_detail>> listed;
    std::uint64_t requests = 0;
    result<std::vector<sandbox_info>> through_backend;
};

asio::awaitable<paging_outcome> paging(backend* b, moat::e2b_config config) {
    paging_outcome o;
    for (int i = 0; i < 3; ++i) {
        sandbox_spec spec;
        spec.labels["set"] = "paged";
        spec.ttl = 5min;
        auto one = co_await b->async_create(spec);
        o.created.push_back(std::move(one));
    }
    auto http = std::make_shared<moat::http::client>(co_await asio::this_coro::executor);
    moat::e2b::control_plane_options options;
    options.api_url = config.api_url;
    options.api_key = config.api_key;
    moat::e2b::control_plane_client client(http, options);
    moat::e2b::list_query q;
    q.metadata["set"] = "paged";
    q.page_limit = 1;
    o.listed = co_await client.async_list(q);
    o.requests = client.requests_sent();
    moat::label_filter filter;
    filter["set"] = "paged";
    o.through_backend = co_await b->async_list(filter);
    for (auto& c : o.created) {
        if (c) (void)co_await b->async_destroy(c->id);
    }
    co_return o;
}

namespace {

struct ports_outcome {
    result<sandbox_info> created = moat::make_error(errc::cancelled, "not run");
    result<moat::process> server = moat::make_error(errc::cancelled, "not run");
    bool refused_connect = false;  // async_connect_port: not_supported
    bool refused_unix = false;     // async_connect_unix: not_supported
    bool refused_usage = false;    // async_usage: not_supported
};

asio::awaitable<ports_outcome> start_port_server(backend* b) {
    ports_outcome o;
    sandbox_spec spec;
    spec.ttl = 10min;
    o.created = co_await b->async_create(spec);
    if (!o.created) co_return o;
    moat::exec_request server;
    server.shell =
        "mkdir -p site && echo 'through the e2b backend' > site/hello.txt && cd site && "
        "exec python3 -m http.server 8000";
    o.server = co_await b->async_spawn(o.created->id, server);
    auto connected = co_await b->async_connect_port(o.created->id, 8000);
    o.refused_connect = !connected && connected.error().code == errc::not_supported;
    auto unix_connected = co_await b->async_connect_unix(o.created->id, "/tmp/supervisor.sock");
    o.refused_unix = !unix_connected && unix_connected.error().code == errc::not_supported;
    auto usage = co_await b->async_usage(o.created->id);
    o.refused_usage = !usage && usage.error().code == errc::not_supported;
    co_return o;
}

std::string shell_output(const std::string& command) {
    std::string out;
    FILE* p = ::popen(command.c_str(), "r");
    REQUIRE(p != nullptr);
    char buffer[4096];
    while (auto n = std::fread(buffer, 1, sizeof buffer, p)) out.append(buffer, n);
    ::pclose(p);
    return out;
}

}  // namespace

TEST_CASE(
    "e2b backend: a port is a host name under the domain the create answer gave, served by moat "
    "serve") {
    moat::test::serve_process_options options;
    options.extra_args = {"--domain", "moat.test"};
    moat::test::serve_process serve(options);
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto o = moat::test::run_async(io, start_port_server(b.get()));
    REQUIRE_MESSAGE(o.created, o.created.error().to_string());
    REQUIRE_MESSAGE(o.server, o.server.error().to_string());
    // E2B reaches ports only by name: no socket from the library.
    CHECK(o.refused_connect);
    CHECK(o.refused_unix);
    CHECK(o.refused_usage);
    const auto host = b->port_host(o.created->id, 8000);
    REQUIRE(host);
    CHECK(*host == "8000-" + o.created->id + ".moat.test");  // the answer's domain, not e2b.app
    // A client resolving the name to serve's envd listener gets the sandbox's server.
    const auto port = serve.envd_url().substr(serve.envd_url().rfind(':') + 1);
    const std::string curl =
        "curl -s --max-time 5 "
        "--resolve " +
        *host + ":" + port + ":127.0.0.1 http://" + *host + ":" + port + "/hello.txt";
    std::string body;
    for (int attempt = 0; attempt < 100 && body != "through the e2b backend\n"; ++attempt) {
        body = shell_output(curl + " 2>/dev/null");
        if (body != "through the e2b backend\n") std::this_thread::sleep_for(100ms);
    }
    CHECK(body == "through the e2b backend\n");
    auto destroyed = moat::test::run_async(io, b->async_destroy(o.created->id));
    CHECK_MESSAGE(destroyed, destroyed.error().to_string());
}

TEST_CASE("e2b backend: list follows X-Next-Token across pages") {
    moat::test::serve_process serve;
    asio::io_context io;
    auto config = config_for(serve);
    auto b = moat::make_e2b_backend(io.get_executor(), config);
    auto o = moat::test::run_async(io, paging(b.get(), config));
    for (auto& c : o.created) REQUIRE_MESSAGE(c, c.error().to_string());
    REQUIRE_MESSAGE(o.listed, o.listed.error().to_string());
    CHECK(o.listed->size() == 3);
    // One page per sandbox, and the last page carries no token.
    CHECK(o.requests == 3);
    REQUIRE(o.through_backend);
    CHECK(o.through_backend->size() == 3);
}

// --- attach ---

struct attach_outcome {
    result<sandbox_info> survivor, attached, attached_twice, extended, short_lived, refused;
    result<void> destroyed;
    result<sandbox_info> seen_by_creator;
};

asio::awaitable<attach_outcome> attach_from_second(backend* first, backend* second) {
    attach_outcome o;
    sandbox_spec spec;
    spec.survive_owner = true;
    spec.ttl = 10min;
    o.survivor = co_await first->async_create(spec);
    sandbox_spec plain;
    o.short_lived = co_await first->async_create(plain);
    if (!o.survivor || !o.short_lived) co_return o;
    o.attached = co_await second->async_attach(o.survivor->id);
    o.attached_twice = co_await second->async_attach(o.survivor->id);
    o.extended = co_await second->async_extend_ttl(o.survivor->id, 20min);
    o.refused = co_await second->async_attach(o.short_lived->id);
    o.destroyed = co_await second->async_destroy(o.survivor->id);
    o.seen_by_creator = co_await first->async_inspect(o.survivor->id);
    (void)co_await first->async_destroy(o.short_lived->id);
    (void)co_await first->async_destroy(o.survivor->id);
    co_return o;
}

TEST_CASE(
    "e2b backend: a second backend attaches to a survivor, extends and destroys it, and "
    "cannot attach to a sandbox that does not survive its owner") {
    moat::test::serve_process serve;
    asio::io_context io;
    auto first = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto second = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto o = moat::test::run_async(io, attach_from_second(first.get(), second.get()));
    REQUIRE_MESSAGE(o.survivor, o.survivor.error().to_string());
    REQUIRE_MESSAGE(o.attached, o.attached.error().to_string());
    CHECK(o.attached->id == o.survivor->id);
    CHECK_FALSE(o.attached->owned);
    CHECK(o.attached->survive_owner);
    CHECK(o.attached->owner_instance == o.survivor->owner_instance);
    CHECK(o.attached->owner_instance != "");
    REQUIRE(o.attached_twice);
    CHECK(o.attached_twice->id == o.attached->id);
    CHECK(o.attached_twice->expires_at == o.attached->expires_at);
    REQUIRE_MESSAGE(o.extended, o.extended.error().to_string());
    CHECK(o.extended->expires_at > o.attached->expires_at + 9min);
    REQUIRE_FALSE(o.refused);
    CHECK(o.refused.error().code == errc::sandbox_unavailable);
    CHECK_MESSAGE(o.destroyed, o.destroyed.error().to_string());
    // The creator still holds it: it is reported ended, not unknown, until it destroys it.
    REQUIRE(o.seen_by_creator);
    CHECK(o.seen_by_creator->state == moat::sandbox_state::exited);
}

// --- credentials ---

struct key_outcome {
    result<sandbox_info> wrong_key, no_key, server_error, reset;
    result<moat::host_report> report_wrong_key;
};

asio::awaitable<key_outcome> try_keys(backend* wrong, backend* none, backend* echoing,
                                      backend* resetting) {
    key_outcome o;
    sandbox_spec spec;
    o.wrong_key = co_await wrong->async_create(spec);
    o.report_wrong_key = co_await wrong->async_host_report();
    o.no_key = co_await none->async_create(spec);
    o.server_error = co_await echoing->async_create(spec);
    o.reset = co_await resetting->async_inspect("iabc");
    co_return o;
}

TEST_CASE(
    "e2b backend: a wrong key, a missing key, a 500 and a reset are typed errors, and the "
    "API key is in no error detail and no log line") {
    moat::test::serve_process serve;
    log_capture logs;
    const std::string wrong_key = "e2b_00112233445566778899aabbccddeeff0011abcd";
    // A server that echoes the key it was sent in its 500 message.
    canned_server echo([](const std::string& request) {
        const auto at = request.find("X-API-Key: ");
        const std::string key = request.substr(at + 11, request.find("\r\n", at) - at - 11);
        return http_reply(500, "", "{\"code\":500,\"message\":\"internal: key " + key + "\"}");
    });
    canned_server reset([](const std::string&) { return std::string(); });
    asio::io_context io;
    auto wrong_config = config_for(serve);
    wrong_config.api_key = wrong_key;
    auto none_config = config_for(serve);
    none_config.api_key.clear();
    ::unsetenv("E2B_API_KEY");
    auto echo_config = config_for(serve);
    echo_config.api_key = wrong_key;
    echo_config.api_url = echo.url();
    auto reset_config = echo_config;
    reset_config.api_url = reset.url();
    auto wrong = moat::make_e2b_backend(io.get_executor(), wrong_config);
    auto none = moat::make_e2b_backend(io.get_executor(), none_config);
    auto echoing = moat::make_e2b_backend(io.get_executor(), echo_config);
    auto resetting = moat::make_e2b_backend(io.get_executor(), reset_config);
    auto o = moat::test::run_async(
        io, try_keys(wrong.get(), none.get(), echoing.get(), resetting.get()));
    REQUIRE_FALSE(o.wrong_key);
    CHECK(o.wrong_key.error().code == errc::unauthorized);
    CHECK(o.wrong_key.error().code == moat::condition::caller_error);
    REQUIRE_FALSE(o.report_wrong_key);
    CHECK(o.report_wrong_key.error().code == errc::unauthorized);
    REQUIRE_FALSE(o.no_key);
    CHECK(o.no_key.error().code == errc::unauthorized);
    CHECK(o.no_key.error().detail.find("E2B_API_KEY") != std::string::npos);
    REQUIRE_FALSE(o.server_error);
    CHECK(o.server_error.error().code == errc::backend_failure);
    CHECK(o.server_error.error().detail.find("<redacted>") != std::string::npos);
    REQUIRE_FALSE(o.reset);
    CHECK(o.reset.error().code == errc::backend_failure);
    // The request really carried the key, and nothing the caller sees or logs repeats it.
    REQUIRE(!echo.requests().empty());
    CHECK(echo.requests().front().find(wrong_key) != std::string::npos);
    const std::string seen =
        o.wrong_key.error().to_string() + "\n" + o.report_wrong_key.error().to_string() + "\n" +
        o.no_key.error().to_string() + "\n" + o.server_error.error().to_string() + "\n" +
        o.reset.error().to_string() + "\n" + logs.all();
    INFO(seen);
    CHECK(seen.find(wrong_key) == std::string::npos);
    CHECK(seen.find(serve.api_key()) == std::string::npos);
}

// --- rate limits and retries ---

struct rate_outcome {
    result<sandbox_info> first, second;
};

asio::awaitable<rate_outcome> create_two(backend* b) {
    rate_outcome o;
    sandbox_spec spec;
    o.first = co_await b->async_create(spec);
    o.second = co_await b->async_create(spec);
    if (o.first) (void)co_await b->async_destroy(o.first->id);
    if (o.second) (void)co_await b->async_destroy(o.second->id);
    co_return o;
}

TEST_CASE("e2b backend: moat serve's --max-sandboxes 429 is rate_limited and retryable") {
    moat::test::serve_process_options options;
    options.max_sandboxes = 1;
    moat::test::serve_process serve(options);
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto o = moat::test::run_async(io, create_two(b.get()));
    REQUIRE_MESSAGE(o.first, o.first.error().to_string());
    REQUIRE_FALSE(o.second);
    CHECK(o.second.error().code == errc::rate_limited);
    CHECK(o.second.error().code == moat::condition::retryable);
}

asio::awaitable<result<sandbox_info>> create_one(backend* b) {
    sandbox_spec spec;
    co_return co_await b->async_create(spec);
}

asio::awaitable<result<sandbox_info>> inspect_one(backend* b) {
    co_return co_await b->async_inspect("iabc");
}

asio::awaitable<result<sandbox_info>> inspect_within(backend* b, std::chrono::milliseconds d) {
    auto inspected = b->async_inspect("iabc");
    const auto limit = moat::deadline::after(d);
    co_return co_await moat::with_timeout(std::move(inspected), limit);
}

std::size_t count_requests(canned_server& s) {
    return s.requests().size();
}

TEST_CASE(
    "e2b backend: a 429's Retry-After is waited out within its cap, a longer one is not, "
    "and 503 is retried on get but never on create") {
    asio::io_context io;
    moat::e2b_config config;
    config.api_key = "e2b_0123456789abcdef";
    config.max_retry_after = 2s;
    config.request_timeout = 20s;
    SUBCASE("Retry-After 1 s: retried up to the attempt cap") {
        canned_server s([](const std::string&) {
            return http_reply(429, "Retry-After: 1\r\n", R"({"code":429,"message":"slow down"})");
        });
        config.api_url = s.url();
        auto b = moat::make_e2b_backend(io.get_executor(), config);
        auto r = moat::test::run_async(io, create_one(b.get()));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == errc::rate_limited);
        CHECK(count_requests(s) == 4);
    }
    SUBCASE("Retry-After 60 s, past max_retry_after: not retried") {
        canned_server s([](const std::string&) {
            return http_reply(429, "Retry-After: 60\r\n", R"({"code":429,"message":"slow down"})");
        });
        config.api_url = s.url();
        auto b = moat::make_e2b_backend(io.get_executor(), config);
        auto r = moat::test::run_async(io, create_one(b.get()));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == errc::rate_limited);
        CHECK(r.error().detail.find("retry after 60 s") != std::string::npos);
        CHECK(count_requests(s) == 1);
    }
    SUBCASE("the caller's deadline ends the wait for a Retry-After") {
        canned_server s([](const std::string&) {
            return http_reply(429, "Retry-After: 2\r\n", R"({"code":429,"message":"slow down"})");
        });
        config.api_url = s.url();
        config.max_retry_after = 5s;
        auto b = moat::make_e2b_backend(io.get_executor(), config);
        auto r = moat::test::run_async(io, inspect_within(b.get(), 300ms));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == errc::deadline_exceeded);
        CHECK(count_requests(s) == 1);
    }
    SUBCASE("503: a GET is retried, a create is not") {
        canned_server s([](const std::string&) {
            return http_reply(503, "", R"({"code":503,"message":"busy"})");
        });
        config.api_url = s.url();
        auto b = moat::make_e2b_backend(io.get_executor(), config);
        auto created = moat::test::run_async(io, create_one(b.get()));
        REQUIRE_FALSE(created);
        CHECK(created.error().code == errc::backend_failure);
        CHECK(count_requests(s) == 1);
        auto inspected = moat::test::run_async(io, inspect_one(b.get()));
        REQUIRE_FALSE(inspected);
        CHECK(inspected.error().code == errc::backend_failure);
        CHECK(count_requests(s) == 5);
    }
}

TEST_CASE("e2b backend: a control plane without the v2 routes gets the v1 create with secure") {
    canned_server s([](const std::string& request) {
        if (request.starts_with("POST /v2/sandboxes ")) {
            return http_reply(404, "", "404 page not found");
        }
        return http_reply(201, "",
                          R"({"templateID":"base","sandboxID":"iv1sandbox","clientID":"6532622b",)"
                          R"("envdVersion":"0.6.4","envdAccessToken":"tok","domain":null})");
    });
    asio::io_context io;
    moat::e2b_config config;
    config.api_key = "e2b_0123456789abcdef";
    config.api_url = s.url();
    auto b = moat::make_e2b_backend(io.get_executor(), config);
    auto r = moat::test::run_async(io, create_one(b.get()));
    REQUIRE_MESSAGE(r, r.error().to_string());
    CHECK(r->id == "iv1sandbox");
    const auto requests = s.requests();
    REQUIRE(requests.size() == 2);
    CHECK(requests[0].starts_with("POST /v2/sandboxes "));
    CHECK(requests[1].starts_with("POST /sandboxes "));
    CHECK(requests[1].find("\"secure\":true") != std::string::npos);
}

// --- limits ---

struct limits_outcome {
    result<sandbox_info> memory, pids, best_effort, defaults, bad_layout, reserved_label;
};

asio::awaitable<limits_outcome> try_limits(backend* b) {
    limits_outcome o;
    sandbox_spec memory;
    memory.limits.memory_bytes = std::uint64_t{128} << 20;
    o.memory = co_await b->async_create(memory);
    sandbox_spec pids;
    pids.limits.pids = 64;
    o.pids = co_await b->async_create(pids);
    sandbox_spec loose = memory;
    loose.best_effort = true;
    o.best_effort = co_await b->async_create(loose);
    sandbox_spec defaults;
    o.defaults = co_await b->async_create(defaults);
    sandbox_spec layout;
    layout.layout.home = "/tmp/elsewhere";
    o.bad_layout = co_await b->async_create(layout);
    sandbox_spec label;
    label.labels["moat.owner"] = "someone";
    o.reserved_label = co_await b->async_create(label);
    if (o.best_effort) (void)co_await b->async_destroy(o.best_effort->id);
    if (o.defaults) (void)co_await b->async_destroy(o.defaults->id);
    co_return o;
}

TEST_CASE(
    "e2b backend: explicit memory and pids limits fail closed with layer_unavailable "
    "unless best effort, and defaults defer to the template") {
    moat::test::serve_process serve;
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto o = moat::test::run_async(io, try_limits(b.get()));
    REQUIRE_FALSE(o.memory);
    CHECK(o.memory.error().code == errc::layer_unavailable);
    CHECK(o.memory.error().detail.find("memory_bytes") != std::string::npos);
    REQUIRE_FALSE(o.pids);
    CHECK(o.pids.error().code == errc::layer_unavailable);
    CHECK(o.pids.error().detail.find("pids") != std::string::npos);
    CHECK_MESSAGE(o.best_effort, o.best_effort.error().to_string());
    CHECK_MESSAGE(o.defaults, o.defaults.error().to_string());
    REQUIRE_FALSE(o.bad_layout);
    CHECK(o.bad_layout.error().code == errc::invalid_argument);
    REQUIRE_FALSE(o.reserved_label);
    CHECK(o.reserved_label.error().code == errc::invalid_argument);
}

// --- heartbeat ---

struct heartbeat_outcome {
    result<sandbox_info> created, early, later;
    std::chrono::system_clock::time_point early_at, later_at;
};

asio::awaitable<heartbeat_outcome> heartbeat_keeps_short(backend* owner, backend* observer) {
    heartbeat_outcome o;
    sandbox_spec spec;
    spec.ttl = 1h;
    o.created = co_await owner->async_create(spec);
    if (!o.created) co_return o;
    o.early_at = std::chrono::system_clock::now();
    o.early = co_await observer->async_inspect(o.created->id);
    // Past the first E2B timeout (4 s): only the renewals keep it alive.
    co_await sleep_for(6s);
    o.later_at = std::chrono::system_clock::now();
    o.later = co_await observer->async_inspect(o.created->id);
    co_return o;
}

asio::awaitable<result<sandbox_info>> inspect_until_gone(backend* b, std::string id,
                                                         std::chrono::seconds bound) {
    const auto limit = std::chrono::steady_clock::now() + bound;
    for (;;) {
        auto r = co_await b->async_inspect(id);
        if (!r || std::chrono::steady_clock::now() > limit) co_return r;
        co_await sleep_for(250ms);
    }
}

TEST_CASE(
    "e2b backend: the heartbeat keeps a held sandbox's E2B timeout short, and a sandbox "
    "whose owner went away ends within it" *
    moat::test::shares_host) {
    moat::test::serve_process serve;
    asio::io_context io;
    auto config = config_for(serve);
    config.heartbeat_timeout = 4s;
    config.heartbeat_interval = 1s;
    auto owner = moat::make_e2b_backend(io.get_executor(), config);
    auto observer = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto o = moat::test::run_async(io, heartbeat_keeps_short(owner.get(), observer.get()));
    REQUIRE_MESSAGE(o.created, o.created.error().to_string());
    REQUIRE_MESSAGE(o.early, o.early.error().to_string());
    CHECK(o.early->expires_at <= o.early_at + 5s);
    REQUIRE_MESSAGE(o.later, o.later.error().to_string());
    CHECK(o.later->state == moat::sandbox_state::running);
    CHECK(o.later->expires_at > o.later_at);
    CHECK(o.later->expires_at <= o.later_at + 5s);
    // The owner goes away without destroying it: no more renewals, and it ends on its own.
    owner.reset();
    auto gone = moat::test::run_async(io, inspect_until_gone(observer.get(), o.created->id, 20s));
    REQUIRE(!gone);
    CHECK(gone.error().code == errc::sandbox_not_found);
}

// --- janitor ---

struct janitor_outcome {
    result<sandbox_info> orphan, live_other, survivor;
    result<std::vector<moat::janitor_action>> dry, actions;
    result<sandbox_info> orphan_after, live_after, survivor_after;
};

asio::awaitable<janitor_outcome> janitor_run(backend* dead_owner, backend* live_owner,
                                             backend* janitor) {
    janitor_outcome o;
    sandbox_spec spec;
    spec.ttl = 10min;
    o.orphan = co_await dead_owner->async_create(spec);
    o.live_other = co_await live_owner->async_create(spec);
    sandbox_spec survive = spec;
    survive.survive_owner = true;
    o.survivor = co_await dead_owner->async_create(survive);
    if (!o.orphan || !o.live_other || !o.survivor) co_return o;
    o.dry = co_await janitor->async_janitor(true);
    o.actions = co_await janitor->async_janitor(false);
    o.orphan_after = co_await janitor->async_inspect(o.orphan->id);
    o.live_after = co_await janitor->async_inspect(o.live_other->id);
    o.survivor_after = co_await janitor->async_inspect(o.survivor->id);
    (void)co_await live_owner->async_destroy(o.live_other->id);
    (void)co_await dead_owner->async_destroy(o.survivor->id);
    co_return o;
}

pid_t a_dead_pid() {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    int status = 0;
    ::waitpid(child, &status, 0);
    return child;
}

TEST_CASE(
    "e2b backend: the janitor destroys sandboxes whose owner on this host is dead, and "
    "leaves live owners' sandboxes and survivors") {
    moat::test::serve_process serve;
    asio::io_context io;
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    auto dead_config = config_for(serve);
    dead_config.owner_instance = std::string(host) + "/" + std::to_string(a_dead_pid()) + "/dead00";
    auto live_config = config_for(serve);
    live_config.owner_instance = std::string(host) + "/" + std::to_string(::getpid()) + "/live00";
    auto dead_owner = moat::make_e2b_backend(io.get_executor(), dead_config);
    auto live_owner = moat::make_e2b_backend(io.get_executor(), live_config);
    auto janitor = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto o =
        moat::test::run_async(io, janitor_run(dead_owner.get(), live_owner.get(), janitor.get()));
    REQUIRE_MESSAGE(o.orphan, o.orphan.error().to_string());
    REQUIRE(o.live_other);
    REQUIRE(o.survivor);
    REQUIRE_MESSAGE(o.dry, o.dry.error().to_string());
    REQUIRE(o.dry->size() == 1);
    CHECK(o.dry->front().target == o.orphan->id);
    CHECK_FALSE(o.dry->front().done);
    REQUIRE_MESSAGE(o.actions, o.actions.error().to_string());
    REQUIRE(o.actions->size() == 1);
    CHECK(o.actions->front().action == "destroy");
    CHECK(o.actions->front().target == o.orphan->id);
    CHECK(o.actions->front().done);
    REQUIRE_FALSE(o.orphan_after);
    CHECK(o.orphan_after.error().code == errc::sandbox_not_found);
    CHECK(o.live_after);
    CHECK(o.survivor_after);
}

// --- the data plane, forwarded ---

struct forward_outcome {
    result<sandbox_info> created, attached;
    result<moat::exec_result> ran, ran_attached;
    result<std::vector<moat::file_write_result>> written;
    result<std::vector<moat::file_read_result>> read_back;
    result<moat::exec_result> not_held;
};

asio::awaitable<forward_outcome> forward(backend* first, backend* second, backend* stranger) {
    forward_outcome o;
    sandbox_spec spec;
    spec.survive_owner = true;
    o.created = co_await first->async_create(spec);
    if (!o.created) co_return o;
    const std::string id = o.created->id;
    moat::exec_request request;
    request.argv = {"/bin/sh", "-c", "echo out; echo err >&2; id -u; pwd; exit 3"};
    o.ran = co_await first->async_exec(id, request);
    std::vector<moat::file_write> files(1);
    files[0].path = "/home/user/data.bin";
    files[0].content = std::string("a\0b\xff", 4);
    o.written = co_await first->async_write_files(id, files);
    o.attached = co_await second->async_attach(id);
    std::vector<std::string> paths{"/home/user/data.bin"};
    o.read_back = co_await second->async_read_files(id, paths);
    moat::exec_request cat;
    cat.argv = {"/bin/sh", "-c", "wc -c < /home/user/data.bin"};
    o.ran_attached = co_await second->async_exec(id, cat);
    o.not_held = co_await stranger->async_exec(id, cat);
    (void)co_await first->async_destroy(id);
    co_return o;
}

TEST_CASE(
    "e2b backend: exec and files reach the sandbox's envd, from its creator and from a "
    "backend that attached") {
    moat::test::serve_process serve;
    asio::io_context io;
    auto first = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto second = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto stranger = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    auto o = moat::test::run_async(io, forward(first.get(), second.get(), stranger.get()));
    REQUIRE_MESSAGE(o.created, o.created.error().to_string());
    REQUIRE_MESSAGE(o.ran, o.ran.error().to_string());
    CHECK(o.ran->exit_code == 3);
    CHECK(o.ran->out.text() == "out\n1000\n/home/user\n");
    CHECK(o.ran->err.text() == "err\n");
    REQUIRE_MESSAGE(o.written, o.written.error().to_string());
    REQUIRE(o.written->size() == 1);
    CHECK(o.written->front().outcome);
    REQUIRE_MESSAGE(o.attached, o.attached.error().to_string());
    REQUIRE_MESSAGE(o.read_back, o.read_back.error().to_string());
    REQUIRE(o.read_back->size() == 1);
    REQUIRE(o.read_back->front().content);
    CHECK(*o.read_back->front().content == std::string("a\0b\xff", 4));
    REQUIRE_MESSAGE(o.ran_attached, o.ran_attached.error().to_string());
    CHECK(o.ran_attached->out.text() == "4\n");
    REQUIRE_FALSE(o.not_held);
    CHECK(o.not_held.error().code == errc::sandbox_not_found);
}

// --- the CLI ---

std::string e2b_environment(const moat::test::serve_process& serve) {
    return "env -u MOAT_BACKEND -u E2B_DOMAIN E2B_API_URL=" + serve.api_url() +
           " E2B_SANDBOX_URL=" + serve.envd_url() + " E2B_API_KEY=" + serve.api_key();
}

TEST_CASE(
    "moat run --backend e2b against moat serve: a 2 s timeout exits 124, Ctrl-C exits 130, "
    "and no sleep 1000 is left on the host") {
    moat::test::serve_process serve;
    const auto timed =
        moat::test::moat_cli(e2b_environment(serve), "run --backend e2b --timeout 2 -- sleep 1000");
    INFO(timed.output);
    CHECK(timed.exit_code == 124);
    CHECK(serve.sandbox_processes_matching("sleep 1000").empty());

    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::setenv("E2B_API_URL", serve.api_url().c_str(), 1);
        ::setenv("E2B_SANDBOX_URL", serve.envd_url().c_str(), 1);
        ::setenv("E2B_API_KEY", serve.api_key().c_str(), 1);
        ::execl(moat::test::moat_cli_path(), "moat", "run", "--backend", "e2b", "--", "sleep",
                "1000", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    const auto limit = std::chrono::steady_clock::now() + 30s;
    while (serve.sandbox_processes_matching("sleep 1000").empty() &&
           std::chrono::steady_clock::now() < limit) {
        std::this_thread::sleep_for(50ms);
    }
    const bool started = !serve.sandbox_processes_matching("sleep 1000").empty();
    ::kill(child, SIGINT);
    int status = 0;
    pid_t waited = 0;
    const auto exit_limit = std::chrono::steady_clock::now() + 30s;
    while ((waited = ::waitpid(child, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < exit_limit) {
        std::this_thread::sleep_for(20ms);
    }
    if (waited == 0) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
    }
    REQUIRE(started);
    REQUIRE(waited == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 130);
    const auto left = serve.sandbox_processes_matching("sleep 1000");
    INFO(serve.describe(left));
    CHECK(left.empty());
}

TEST_CASE("moat doctor --backend e2b checks the endpoint and the key") {
    moat::test::serve_process serve;
    const auto good = moat::test::moat_cli(e2b_environment(serve), "doctor --backend e2b");
    INFO(good.output);
    CHECK(good.exit_code == 0);
    CHECK(good.output.find("endpoint           ok") != std::string::npos);
    const auto bad = moat::test::moat_cli(
        e2b_environment(serve) + " E2B_API_KEY=e2b_0000000000000000000000000000000000000000",
        "doctor --backend e2b");
    INFO(bad.output);
    CHECK(bad.exit_code == 3);
    CHECK(bad.output.find("unauthorized") != std::string::npos);
    CHECK(bad.output.find("e2b_0000000000000000000000000000000000000000") == std::string::npos);
    const auto unknown = moat::test::moat_cli("ls --backend nope");
    CHECK(unknown.exit_code == 2);
}

// --- parsers ---

TEST_CASE("e2b responses: the metadata filter is encoded as the SDK encodes it") {
    std::map<std::string, std::string> filter;
    filter["user"] = "a b&c=d";
    CHECK(moat::e2b_protocol::encode_metadata_filter(filter) == "user%3Da%252520b%252526c%25253Dd");
}

TEST_CASE(
    "e2b responses: malformed, oversized and hostile bodies are protocol errors that quote "
    "no value") {
    using namespace moat::e2b_protocol;
    CHECK(parse_sandbox_reply(R"({"sandboxID":"iabc","envdAccessToken":"t"})"));
    CHECK_FALSE(parse_sandbox_reply("[]"));
    CHECK_FALSE(parse_sandbox_reply(R"({"sandboxID":"../etc"})"));
    CHECK_FALSE(parse_sandbox_reply(R"({"sandboxID":7})"));
    const auto secret = parse_sandbox_reply(R"({"sandboxID":"iabc","envdAccessToken":5})");
    REQUIRE_FALSE(secret);
    CHECK(secret.error().code == errc::protocol_error);
    CHECK_FALSE(parse_sandbox_detail(R"({"sandboxID":"iabc","startedAt":"x","endAt":"y"})"));
    auto d = parse_sandbox_detail(
        R"({"sandboxID":"iabc","startedAt":"2026-12-01T10:00:00Z","endAt":"2026-12-01T10:05:00.5+01:00",)"
        R"("cpuCount":"2","memoryMB":512,"state":"running","metadata":{"k":"v"}})");
    REQUIRE_MESSAGE(d, d.error().to_string());
    CHECK(d->cpu_count == 2);
    CHECK(d->metadata.at("k") == "v");
    CHECK(d->end_at - d->started_at == std::chrono::milliseconds(-3600000 + 300500));
    // Egress: the switch and the network lists of a SandboxDetail; a list entry reports none.
    const std::string head =
        R"({"sandboxID":"iabc","startedAt":"2026-12-01T10:00:00Z","endAt":"2026-12-01T10:05:00Z")";
    auto egress = parse_sandbox_detail(
        head + R"(,"allowInternetAccess":true,"network":{"allowOut":["pypi.org","10.0.0.0/8"],)" +
        R"("denyOut":["0.0.0.0/0"]}})");
    REQUIRE_MESSAGE(egress, egress.error().to_string());
    CHECK(egress->network_reported);
    CHECK(egress->allow_internet_access == true);
    CHECK(egress->allow_out == std::vector<std::string>{"pypi.org", "10.0.0.0/8"});
    CHECK(egress->deny_out == std::vector<std::string>{"0.0.0.0/0"});
    auto plain = parse_sandbox_detail(head + R"(,"allowInternetAccess":null,"network":null})");
    REQUIRE(plain);
    CHECK_FALSE(plain->allow_internet_access.has_value());
    CHECK(plain->allow_out.empty());
    auto listed = parse_sandbox_list("[" + head + R"(,"allowInternetAccess":false}])");
    REQUIRE_MESSAGE(listed, listed.error().to_string());
    REQUIRE(listed->size() == 1);
    CHECK_FALSE(listed->front().network_reported);
    for (const std::string bad :
         {R"(,"allowInternetAccess":"yes"})", R"(,"network":[]})",
          R"(,"network":{"allowOut":"pypi.org"}})", R"(,"network":{"denyOut":[7]}})"}) {
        const auto refused = parse_sandbox_detail(head + bad);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == errc::protocol_error);
        CHECK_MESSAGE((refused.error().detail.find("allowInternetAccess") != std::string::npos ||
                       refused.error().detail.find("'network") != std::string::npos),
                      refused.error().detail);
    }
    std::string many = head + R"(,"network":{"denyOut":[)";
    for (std::size_t i = 0; i <= max_network_entries; ++i)
        many += (i ? ",\"1.2.3.4\"" : "\"1.2.3.4\"");
    const auto too_many = parse_sandbox_detail(many + "]}}");
    REQUIRE_FALSE(too_many);
    CHECK(too_many.error().detail.find("more than 256 entries") != std::string::npos);
    CHECK_FALSE(parse_sandbox_list(std::string(max_list_body_bytes + 1, ' ')));
    CHECK(parse_sandbox_list("[]"));
    CHECK(parse_error_message(R"({"code":404,"message":"gone\nnow"})") == "gonenow");
    CHECK_FALSE(parse_error_message("404 page not found"));
}

}  // namespace

// --- connections: 64 streams do not hold up a cancel's kill; 500 sandboxes leave no descriptor ---

namespace {

using moat::test::open_descriptors;

asio::awaitable<void> streams_then_cancel(moat::backend* b) {
    std::vector<std::string> ids;
    for (int i = 0; i < 4; ++i) {
        moat::sandbox_spec spec;
        auto created = co_await b->async_create(std::move(spec));
        REQUIRE_MESSAGE(created, created.error().to_string());
        ids.push_back(created->id);
    }
    // 64 long-running commands, each streaming a line every 100 ms, left running.
    std::vector<moat::exec_stream> streams;
    for (int i = 0; i < 64; ++i) {
        moat::exec_request streaming;
        streaming.shell = "while true; do echo tick; sleep 0.1; done";
        streaming.wall_limit = 120s;
        const auto& id = ids[static_cast<std::size_t>(i) % ids.size()];
        auto started = co_await b->async_exec_stream(id, std::move(streaming));
        REQUIRE_MESSAGE(started, "stream " << i << ": " << started.error().to_string());
        auto first = co_await started->async_next();
        REQUIRE_MESSAGE(first, first.error().to_string());
        streams.push_back(std::move(*started));
    }
    // One more command, cancelled by its deadline: the cancel kills it and confirms its end
    // with short calls (SendSignal, Process/List), which must not wait behind the 64 streams.
    moat::exec_request sleeper;
    sleeper.shell = "sleep 60";
    auto ran = b->async_exec(ids.front(), std::move(sleeper));
    const auto t0 = std::chrono::steady_clock::now();
    const auto limit = moat::deadline::after(500ms);
    auto outcome = co_await moat::with_timeout(std::move(ran), limit);
    const auto took = std::chrono::steady_clock::now() - t0;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
    std::printf("cancel-and-confirm with 64 streams open: %lld ms (500 ms of it the deadline)\n",
                static_cast<long long>(ms));
    REQUIRE_FALSE(outcome);
    CHECK_MESSAGE((outcome.error().code == errc::cancelled ||
                   outcome.error().code == errc::deadline_exceeded),
                  outcome.error().to_string());
    CHECK(took < 5s);
    streams.clear();  // dropping them kills their commands
    for (const auto& id : ids) {
        auto destroyed = co_await b->async_destroy(id);
        CHECK_MESSAGE(destroyed, destroyed.error().to_string());
    }
}

asio::awaitable<void> use_and_destroy(moat::backend* b, int count) {
    for (int i = 0; i < count; ++i) {
        moat::sandbox_spec spec;
        auto created = co_await b->async_create(std::move(spec));
        REQUIRE_MESSAGE(created, i << ": " << created.error().to_string());
        moat::exec_request hello;
        hello.argv = {"true"};
        auto ran = co_await b->async_exec(created->id, std::move(hello));
        REQUIRE_MESSAGE(ran, i << ": " << ran.error().to_string());
        auto destroyed = co_await b->async_destroy(created->id);
        REQUIRE_MESSAGE(destroyed, i << ": " << destroyed.error().to_string());
    }
}

}  // namespace

TEST_CASE(
    "e2b backend against moat serve: with 64 commands streaming through one sandbox URL, a "
    "cancel's kill is confirmed within 5 s") {
    moat::test::raise_open_files(4096);
    moat::test::serve_process serve;
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    moat::test::run_async(io, streams_then_cancel(b.get()), std::chrono::seconds(180));
}

TEST_CASE(
    "e2b backend against moat serve: 500 sandboxes used and destroyed leave the descriptors "
    "where they were") {
    moat::test::serve_process serve;
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    moat::test::run_async(io, use_and_destroy(b.get(), 5));  // the pool's steady state
    const auto before = open_descriptors();
    const auto t0 = std::chrono::steady_clock::now();
    moat::test::run_async(io, use_and_destroy(b.get(), 500), std::chrono::seconds(600));
    const auto after = open_descriptors();
    std::printf("500 sandboxes used and destroyed in %.1f s; descriptors %zu -> %zu\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                before, after);
    CHECK(after <= before + 4);
}

// --- pause ---

struct pause_outcome {
    result<sandbox_info> created, paused, paused_again, inspected, resumed, resumed_again;
    bool paused_seen = false;
    bool running_seen = true;
    result<moat::exec_result> before, after;
};

asio::awaitable<pause_outcome> pause_and_resume(backend* b) {
    pause_outcome o;
    sandbox_spec spec;
    spec.ttl = 10min;
    o.created = co_await b->async_create(spec);
    if (!o.created) co_return o;
    const std::string id = o.created->id;
    moat::exec_request start;
    start.argv = {"sh", "-c", "echo kept > /tmp/v"};
    o.before = co_await b->async_exec(id, start);
    // A process running across the pause (the stream stays open while it runs).
    moat::exec_request sleeper;
    sleeper.argv = {"sleep", "300"};
    auto sleeping = co_await b->async_spawn(id, sleeper);
    if (!sleeping) {
        o.before = sleeping.error();
        co_return o;
    }
    o.paused = co_await b->async_pause(id);
    o.paused_seen = b->is_paused(id);
    o.paused_again = co_await b->async_pause(id);
    o.inspected = co_await b->async_inspect(id);
    o.resumed = co_await b->async_resume(id);
    o.running_seen = b->is_paused(id);
    o.resumed_again = co_await b->async_resume(id);
    moat::exec_request check;
    check.argv = {"sh", "-c",
                  "cat /tmp/v; kill -0 " + std::to_string(sleeping->pid()) + " && echo sleeping"};
    o.after = co_await b->async_exec(id, check);
    (void)co_await b->async_destroy(id);
    co_return o;
}

TEST_CASE(
    "e2b backend against moat serve: pause keeps the sandbox's files and processes, a second pause "
    "and resume change nothing, and the TTL left comes back") {
    moat::test::serve_process serve;
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    const auto started = std::chrono::system_clock::now();
    auto o = moat::test::run_async(io, pause_and_resume(b.get()));
    REQUIRE_MESSAGE(o.created, o.created.error().to_string());
    REQUIRE_MESSAGE(o.before, o.before.error().to_string());
    REQUIRE_MESSAGE(o.paused, o.paused.error().to_string());
    CHECK(o.paused->state == moat::sandbox_state::paused);
    CHECK(o.paused->ttl_left > 9min);
    CHECK(o.paused_seen);
    REQUIRE_MESSAGE(o.paused_again, o.paused_again.error().to_string());
    CHECK(o.paused_again->state == moat::sandbox_state::paused);
    REQUIRE_MESSAGE(o.inspected, o.inspected.error().to_string());
    CHECK(o.inspected->state == moat::sandbox_state::paused);
    REQUIRE_MESSAGE(o.resumed, o.resumed.error().to_string());
    CHECK(o.resumed->state == moat::sandbox_state::running);
    CHECK(o.resumed->expires_at >= started + 9min);
    CHECK_FALSE(o.running_seen);
    REQUIRE_MESSAGE(o.resumed_again, o.resumed_again.error().to_string());
    CHECK(o.resumed_again->state == moat::sandbox_state::running);
    REQUIRE_MESSAGE(o.after, o.after.error().to_string());
    CHECK(o.after->out.text() == "kept\nsleeping\n");
}
