// The HTTP client against real peers on loopback: a Node http / https server (tests/http/
// client_peer.js) the tests start, with TLS certificates made at test time by
// tests/http/make_test_ca.sh (a test CA, and certificates for the right name, a wrong name, an
// unknown CA and an expired one). Every failure is a typed error, and the process holds the same
// descriptors afterwards.
#include "core/asio_compat.hpp"
#include "core/loopback.hpp"
#include "http/client.hpp"
#include "http/connect_envelope.hpp"
#include "http/server.hpp"
#include "http/tls.hpp"
#include "http/tls_server_stream.hpp"

#include <moat/log.hpp>

#include "support/async_test.hpp"
#include "support/build_paths.hpp"
#include "support/host_inspect.hpp"
#include "support/loopback_peer.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

using namespace std::chrono_literals;
namespace http = moat::http;

namespace {

const std::string source_dir = moat::test::source_dir();

using moat::test::open_descriptors;

// The test certificates, made once per test run in a temporary directory that is removed when
// the test program exits (no key outlives the run).
struct certificate_dir {
    std::string path;
    certificate_dir() {
        char pattern[] = "/tmp/moat-http-ca-XXXXXX";
        REQUIRE(::mkdtemp(pattern) != nullptr);
        path = pattern;
        const auto command = source_dir + "/tests/http/make_test_ca.sh " + path;
        REQUIRE(std::system(command.c_str()) == 0);
    }
    ~certificate_dir() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
};

const std::string& certificates() {
    static const certificate_dir dir;
    return dir.path;
}

// A Node peer (tests/http/client_peer.js): started by the constructor, which reads its port;
// stopped by closing its stdin (and killed if it lingers).
class node_peer {
  public:
    explicit node_peer(const std::string& tls_name = "") {
        int to_peer[2];
        int from_peer[2];
        REQUIRE(::pipe2(to_peer, O_CLOEXEC) == 0);
        REQUIRE(::pipe2(from_peer, O_CLOEXEC) == 0);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, to_peer[0], 0);
        posix_spawn_file_actions_adddup2(&actions, from_peer[1], 1);
        const auto script = source_dir + "/tests/http/client_peer.js";
        std::vector<std::string> args = {"node", script};
        if (!tls_name.empty()) {
            args.push_back("--tls");
            args.push_back(certificates() + "/" + tls_name + ".pem");
            args.push_back(certificates() + "/" + tls_name + ".key");
        }
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        REQUIRE(::posix_spawnp(&pid_, "node", &actions, nullptr, argv.data(), environ) == 0);
        posix_spawn_file_actions_destroy(&actions);
        ::close(to_peer[0]);
        ::close(from_peer[1]);
        stdin_ = to_peer[1];
        std::string line;
        char c = 0;
        while (::read(from_peer[0], &c, 1) == 1 && c != '\n') line += c;
        ::close(from_peer[0]);
        REQUIRE(!line.empty());
        port_ = std::stoi(line);
    }
    ~node_peer() {
        ::close(stdin_);
        int status = 0;
        for (int i = 0; i < 50; ++i) {
            if (::waitpid(pid_, &status, WNOHANG) == pid_) return;
            ::usleep(20'000);
        }
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
    }
    node_peer(const node_peer&) = delete;
    node_peer& operator=(const node_peer&) = delete;

    int port() const { return port_; }
    std::string url(const std::string& path, const std::string& host = "127.0.0.1") const {
        return "http://" + host + ":" + std::to_string(port_) + path;
    }
    std::string tls_url(const std::string& path, const std::string& host = "localhost") const {
        return "https://" + host + ":" + std::to_string(port_) + path;
    }

  private:
    pid_t pid_ = -1;
    int stdin_ = -1;
    int port_ = 0;
};

http::request get(std::string url, moat::deadline limit = moat::deadline::after(20s)) {
    http::request r;
    r.url = std::move(url);
    r.limit = limit;
    return r;
}

// A field of the peer's /stats JSON (a number), read crudely: the peer writes it compactly.
long stat(const std::string& json, const std::string& name) {
    const auto at = json.find("\"" + name + "\":");
    REQUIRE(at != std::string::npos);
    return std::stol(json.substr(at + name.size() + 3));
}

asio::awaitable<std::string> fetch_stats(http::client& client, const node_peer& peer) {
    auto r = co_await client.async_fetch(get(peer.url("/stats")), 1 << 20);
    REQUIRE(r);
    co_return r->body;
}

asio::awaitable<void> sleep_for(std::chrono::milliseconds d) {
    const auto timer_executor = co_await asio::this_coro::executor;
    asio::steady_timer timer(timer_executor, d);
    co_await timer.async_wait(asio::use_awaitable);
}

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

// --- the scenarios, as named coroutines -------------------------------------------------------

asio::awaitable<void> unary_and_chunked(const node_peer& peer) {
    const auto client_executor = co_await asio::this_coro::executor;
    http::client client(client_executor);
    auto hello = co_await client.async_fetch(get(peer.url("/hello")), 1024);
    REQUIRE(hello);
    CHECK(hello->status() == 200);
    CHECK(hello->body == "hello");
    CHECK(hello->head.headers.find("content-type") == "text/plain");

    http::request post = get(peer.url("/echo"));
    post.method = "POST";
    post.body = std::string(100'000, 'p');
    auto echoed = co_await client.async_fetch(std::move(post), 1 << 20);
    REQUIRE(echoed);
    CHECK(echoed->body == std::string(100'000, 'p'));
    CHECK(echoed->head.headers.find("x-request-content-length") == "100000");
    CHECK(echoed->head.headers.find("x-request-transfer-encoding") == "");

    // A streamed request body goes out chunked.
    http::request streamed = get(peer.url("/echo"));
    streamed.method = "POST";
    auto pieces = std::make_shared<std::vector<std::string>>(
        std::vector<std::string>{"first,", std::string(70'000, 's'), ",last", ""});
    auto next = std::make_shared<std::size_t>(0);
    streamed.body_stream = [pieces, next]() -> asio::awaitable<moat::result<std::string>> {
        co_return (*pieces)[(*next)++];
    };
    auto chunked_echo = co_await client.async_fetch(std::move(streamed), 1 << 20);
    REQUIRE(chunked_echo);
    CHECK(chunked_echo->body == "first," + std::string(70'000, 's') + ",last");
    CHECK(chunked_echo->head.headers.find("x-request-transfer-encoding") == "chunked");

    // A chunked response, read piece by piece.
    auto chunked = co_await client.async_send(get(peer.url("/chunked?n=50")));
    REQUIRE(chunked);
    std::string body;
    for (;;) {
        auto piece = co_await chunked->async_read_some();
        REQUIRE(piece);
        if (piece->empty()) break;
        body += *piece;
    }
    std::string expected;
    for (int i = 0; i < 50; ++i) expected += "piece " + std::to_string(i) + "\n";
    CHECK(body == expected);
    CHECK(chunked->has_ended());

    // A 1xx interim response is skipped; a redirect is returned, not followed.
    auto interim = co_await client.async_fetch(get(peer.url("/interim")), 1024);
    REQUIRE(interim);
    CHECK(interim->status() == 200);
    CHECK(interim->body == "ok");
    const auto before = co_await fetch_stats(client, peer);
    auto redirect = co_await client.async_fetch(get(peer.url("/redirect")), 1024);
    REQUIRE(redirect);
    CHECK(redirect->status() == 302);
    CHECK(redirect->head.headers.find("location") == "/hello");
    const auto after = co_await fetch_stats(client, peer);
    CHECK(stat(after, "requests") == stat(before, "requests") + 2);  // the redirect, /stats
}

asio::awaitable<void> keep_alive_reuse(const node_peer& peer) {
    const auto client_executor = co_await asio::this_coro::executor;
    http::client client(client_executor);
    for (int i = 0; i < 5; ++i) {
        auto r = co_await client.async_fetch(get(peer.url("/hello")), 1024);
        REQUIRE(r);
        CHECK(r->body == "hello");
    }
    CHECK(client.connections_opened() == 1);
    CHECK(client.idle_connections() == 1);
    const auto stats = co_await fetch_stats(client, peer);
    CHECK(stat(stats, "connections") == 1);

    // A server that says Connection: close is not reused; the next request opens a new one.
    auto closing = co_await client.async_fetch(get(peer.url("/close")), 1024);
    REQUIRE(closing);
    CHECK(client.idle_connections() == 0);
    auto again = co_await client.async_fetch(get(peer.url("/hello")), 1024);
    REQUIRE(again);
    CHECK(client.connections_opened() == 2);
}

asio::awaitable<void> pool_cap(const node_peer& peer) {
    http::client_options options;
    options.max_connections_per_origin = 2;
    const auto client_executor = co_await asio::this_coro::executor;
    http::client client(client_executor, options);
    auto a = co_await client.async_send(get(peer.url("/big?bytes=10000000")));
    REQUIRE(a);
    auto b = co_await client.async_send(get(peer.url("/big?bytes=10000000")));
    REQUIRE(b);
    // Both connections are busy: a third request waits, and its deadline ends the wait.
    auto c =
        co_await client.async_fetch(get(peer.url("/hello"), moat::deadline::after(300ms)), 1024);
    REQUIRE(!c);
    CHECK(c.error().code == moat::errc::deadline_exceeded);
    CHECK(contains(c.error().detail, "waiting for a connection"));
    CHECK(client.connections_opened() == 2);
    // Reading one body to its end gives its connection back, and the waiting request uses it.
    for (;;) {
        auto piece = co_await a->async_read_some();
        REQUIRE(piece);
        if (piece->empty()) break;
    }
    auto d = co_await client.async_fetch(get(peer.url("/hello")), 1024);
    REQUIRE(d);
    CHECK(d->body == "hello");
    CHECK(client.connections_opened() == 2);
}

asio::awaitable<void> backpressure(const node_peer& peer) {
    const auto client_executor = co_await asio::this_coro::executor;
    http::client client(client_executor);
    constexpr long total = 64L * 1024 * 1024;
    auto big = co_await client.async_send(get(peer.url("/big?bytes=" + std::to_string(total))));
    REQUIRE(big);
    auto first = co_await big->async_read_some();
    REQUIRE(first);
    long received = static_cast<long>(first->size());
    // Not reading: the server stops writing once the socket buffers fill. Wait until its count
    // stops moving (bounded by the watchdog), then check it is far short of the whole body.
    long written = -1;
    for (int i = 0; i < 200; ++i) {
        co_await sleep_for(100ms);
        const auto now = stat(co_await fetch_stats(client, peer), "written");
        if (now == written) break;
        written = now;
    }
    CHECK(written < total / 2);
    for (;;) {
        auto piece = co_await big->async_read_some();
        REQUIRE(piece);
        if (piece->empty()) break;
        received += static_cast<long>(piece->size());
    }
    CHECK(received == total);
}

asio::awaitable<void> bad_responses(const node_peer& peer) {
    const auto client_executor = co_await asio::this_coro::executor;
    http::client client(client_executor);
    {
        auto r = co_await client.async_fetch(get(peer.url("/truncated")), 1024);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::protocol_error);
        CHECK(contains(r.error().detail, "truncated"));
    }
    {
        auto r = co_await client.async_fetch(get(peer.url("/oversize-head")), 1024);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::protocol_error);
        CHECK(contains(r.error().detail, "head is too large"));
    }
    {
        auto r = co_await client.async_fetch(get(peer.url("/garbage")), 1024);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::protocol_error);
        CHECK(contains(r.error().detail, "malformed response"));
    }
    {
        auto r = co_await client.async_fetch(get(peer.url("/too-long-body")), 1024);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::protocol_error);
        CHECK(contains(r.error().detail, "cap"));
    }
    {
        auto r = co_await client.async_fetch(get(peer.url("/stall"), moat::deadline::after(500ms)),
                                             1024);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::deadline_exceeded);
        CHECK(contains(r.error().detail, "reading the response body"));
    }
    {
        auto r = co_await client.async_fetch(get(peer.url("/never"), moat::deadline::after(500ms)),
                                             1024);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::deadline_exceeded);
        CHECK(contains(r.error().detail, "reading the response head"));
    }
    {
        auto r = co_await client.async_fetch(get(peer.url("/reset-mid")), 10'000'000);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::backend_failure);
        CHECK(r.error().code == moat::condition::retryable);
        CHECK(contains(r.error().detail, "reset"));
    }
    {
        // Nothing listens on the port of a peer that has gone.
        int port = 0;
        {
            node_peer gone;
            port = gone.port();
        }
        auto r = co_await client.async_fetch(
            get("http://127.0.0.1:" + std::to_string(port) + "/hello"), 1024);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::backend_failure);
        CHECK(contains(r.error().detail, "connection refused"));
    }
    // The client keeps working.
    auto ok = co_await client.async_fetch(get(peer.url("/hello")), 1024);
    REQUIRE(ok);
    CHECK(ok->body == "hello");
}

asio::awaitable<void> secrets_stay_out(const node_peer& peer, std::vector<std::string>& log) {
    const auto client_executor = co_await asio::this_coro::executor;
    http::client client(client_executor);
    const std::vector<std::string> secrets = {"Bearer s3cr3t-authorization", "e2b_0123456789abcdef",
                                              "s3cr3t-access-token", "s3cr3t-query-token"};
    for (const char* path : {"/reset", "/reset-mid", "/never"}) {
        http::request r = get(peer.url(std::string(path) + "?token=s3cr3t-query-token"),
                              moat::deadline::after(500ms));
        r.headers.add("Authorization", "Bearer s3cr3t-authorization");
        r.headers.add("X-API-Key", "e2b_0123456789abcdef");
        r.headers.add("X-Access-Token", "s3cr3t-access-token");
        auto failed = co_await client.async_fetch(std::move(r), 10'000'000);
        REQUIRE(!failed);
        CAPTURE(failed.error().detail);
        for (const auto& s : secrets) CHECK(!contains(failed.error().detail, s));
    }
    REQUIRE(!log.empty());  // the failures were logged...
    for (const auto& line : log) {
        for (const auto& s : secrets) CHECK(!contains(line, s));  // ...without the secrets
    }
}

asio::awaitable<void> plain_http_policy() {
    const auto refusing_executor = co_await asio::this_coro::executor;
    http::client refusing(refusing_executor);
    auto refused = co_await refusing.async_fetch(get("http://example.invalid/x"), 1024);
    REQUIRE(!refused);
    CHECK(refused.error().code == moat::errc::invalid_argument);
    CHECK(contains(refused.error().detail, "plain http:// to example.invalid is refused"));

    http::client_options options;
    options.plain_http_hosts = {"example.invalid"};
    const auto allowing_executor = co_await asio::this_coro::executor;
    http::client allowing(allowing_executor, options);
    auto attempted = co_await allowing.async_fetch(get("http://example.invalid/x"), 1024);
    REQUIRE(!attempted);  // allowed, so it got as far as resolving the name
    CHECK(contains(attempted.error().detail, "cannot resolve example.invalid"));

    http::request framing = get("http://127.0.0.1:1/x");
    framing.headers.add("Content-Length", "5");
    auto refused_framing = co_await refusing.async_fetch(std::move(framing), 1024);
    REQUIRE(!refused_framing);
    CHECK(refused_framing.error().code == moat::errc::invalid_argument);
    http::request injection = get("http://127.0.0.1:1/x");
    injection.headers.add("X-Note", "a\r\nX-Injected: 1");
    auto refused_injection = co_await refusing.async_fetch(std::move(injection), 1024);
    REQUIRE(!refused_injection);
    CHECK(refused_injection.error().code == moat::errc::invalid_argument);
}

asio::awaitable<void> tls_verified(const node_peer& peer) {
    http::client_options options;
    options.ca_file = certificates() + "/ca.pem";
    const auto client_executor = co_await asio::this_coro::executor;
    http::client client(client_executor, options);
    for (int i = 0; i < 3; ++i) {
        auto r = co_await client.async_fetch(get(peer.tls_url("/hello")), 1024);
        REQUIRE(r);
        CHECK(r->body == "hello");
    }
    auto by_address = co_await client.async_fetch(get(peer.tls_url("/hello", "127.0.0.1")), 1024);
    REQUIRE(by_address);
    CHECK(by_address->body == "hello");
    CHECK(client.connections_opened() == 2);  // one per origin (name, address), reused

    // The same server is refused without the test CA: the system store does not know it.
    const auto untrusting_executor = co_await asio::this_coro::executor;
    http::client untrusting(untrusting_executor);
    auto refused = co_await untrusting.async_fetch(get(peer.tls_url("/hello")), 1024);
    REQUIRE(!refused);
    CHECK(contains(refused.error().detail, "certificate verify failed: unknown CA"));
}

asio::awaitable<moat::error> tls_refusal(const node_peer& peer) {
    http::client_options options;
    options.ca_file = certificates() + "/ca.pem";
    const auto client_executor = co_await asio::this_coro::executor;
    http::client client(client_executor, options);
    auto r = co_await client.async_fetch(get(peer.tls_url("/hello")), 1024);
    REQUIRE(!r);
    co_return r.error();
}

// One TLS exchange served in-process with a server context: the handshake, a request head, a
// fixed response.
asio::awaitable<void> serve_one_tls(asio::ip::tcp::acceptor& acceptor,
                                    asio::ssl::context& context) {
    auto socket = co_await acceptor.async_accept(asio::use_awaitable);
    http::tls_stream stream(std::move(socket), context);
    co_await stream.async_handshake(asio::ssl::stream_base::server, asio::use_awaitable);
    std::string head;
    co_await asio::async_read_until(stream, asio::dynamic_buffer(head), "\r\n\r\n",
                                    asio::use_awaitable);
    const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    co_await asio::async_write(stream, asio::buffer(reply), asio::use_awaitable);
}

struct rethrow_into {
    std::exception_ptr* into;
    void operator()(std::exception_ptr e) const { *into = e; }
};

asio::awaitable<void> fetch_from_tls_server(int port) {
    http::client_options options;
    options.ca_file = certificates() + "/ca.pem";
    options.use_system_ca_store = false;
    const auto client_executor = co_await asio::this_coro::executor;
    http::client client(client_executor, options);
    auto r =
        co_await client.async_fetch(get("https://localhost:" + std::to_string(port) + "/"), 1024);
    REQUIRE(r);
    CHECK(r->body == "ok");
}

// --- moat's client against moat's server ------------------------------------------------------

asio::awaitable<void> serve_hello(http::server_request&, http::server_response& response) {
    http::header_list headers;
    (void)co_await response.async_send(200, std::move(headers), "hello");
}

asio::awaitable<void> serve_upload(http::server_request& request, http::server_response& response) {
    std::size_t bytes = 0;
    for (;;) {
        auto piece = co_await request.async_read_some();
        if (!piece) co_return;
        if (piece->empty()) break;
        bytes += piece->size();
    }
    http::header_list headers;
    (void)co_await response.async_send(200, std::move(headers), std::to_string(bytes));
}

// A Connect server stream: three messages, then the end-stream message with an error.
asio::awaitable<void> serve_connect(http::server_request& request,
                                    http::server_response& response) {
    http::header_list headers;
    headers.add("Content-Type", "application/connect+json");
    if (!co_await response.async_begin(200, std::move(headers))) co_return;
    const bool oversize = request.query() == "oversize";
    for (int i = 0; i < 3; ++i) {
        std::string message = R"({"event":{"data":{"stdout":")" + std::to_string(i) + R"("}}})";
        if (oversize && i == 2) message = std::string(4096, 'x');
        const auto frame = http::connect::encode_envelope(0, message);
        if (!co_await response.async_write(frame)) co_return;
    }
    http::connect::end_stream end;
    end.error = http::connect::connect_error{http::connect::code::not_found, "no such process"};
    const auto last = http::connect::encode_envelope(http::connect::flag_end_stream,
                                                     http::connect::encode_end_stream(end));
    if (!co_await response.async_write(last)) co_return;
    (void)co_await response.async_end();
}

// Reads a Connect stream: the data messages, then the end-stream message's error (as moat's).
struct connect_outcome {
    std::vector<std::string> messages;
    std::optional<moat::error> failure;
};

asio::awaitable<connect_outcome> read_connect_stream(http::response& r) {
    connect_outcome out;
    http::connect::envelope_decoder decoder(1024);
    std::vector<http::connect::envelope> envelopes;
    for (;;) {
        auto piece = co_await r.async_read_some();
        REQUIRE(piece);
        if (piece->empty()) break;
        auto fed = decoder.feed(*piece, envelopes);
        if (!fed) {
            out.failure = fed.error();
            co_return out;
        }
    }
    REQUIRE(decoder.finish());
    for (const auto& e : envelopes) {
        if (!e.is_end_stream()) {
            out.messages.push_back(e.payload);
            continue;
        }
        auto end = http::connect::parse_end_stream(e.payload);
        REQUIRE(end);
        if (end->error) out.failure = http::connect::to_error(*end->error);
    }
    co_return out;
}

asio::awaitable<void> against_moat_server() {
    const auto executor = co_await asio::this_coro::executor;
    http::server_options server_options;
    http::server server(executor, server_options);
    REQUIRE(server.route("GET", "/hello", serve_hello));
    REQUIRE(server.route("POST", "/upload", serve_upload));
    REQUIRE(server.route("POST", "/process.Process/Start", serve_connect));
    auto endpoint = server.start();
    REQUIRE(endpoint);
    const auto base = "http://127.0.0.1:" + std::to_string(endpoint->port());

    {
        http::client client(executor);
        for (int i = 0; i < 3; ++i) {
            auto r = co_await client.async_fetch(get(base + "/hello"), 1024);
            REQUIRE(r);
            CHECK(r->body == "hello");
        }
        CHECK(server.stats().accepted == 1);  // one keep-alive connection

        http::request upload = get(base + "/upload");
        upload.method = "POST";
        auto sent = std::make_shared<std::size_t>(0);
        upload.body_stream = [sent]() -> asio::awaitable<moat::result<std::string>> {
            if (*sent == 64) co_return std::string();
            ++*sent;
            co_return std::string(16 * 1024, 'u');
        };
        auto uploaded = co_await client.async_fetch(std::move(upload), 1024);
        REQUIRE(uploaded);
        CHECK(uploaded->body == std::to_string(64 * 16 * 1024));

        http::request start = get(base + "/process.Process/Start");
        start.method = "POST";
        start.headers.add("Content-Type", "application/connect+json");
        start.body = http::connect::encode_envelope(0, R"({"process":{"cmd":"/bin/true"}})");
        auto stream = co_await client.async_send(std::move(start));
        REQUIRE(stream);
        CHECK(stream->headers().find("content-type") == "application/connect+json");
        auto outcome = co_await read_connect_stream(*stream);
        REQUIRE(outcome.messages.size() == 3);
        CHECK(outcome.messages[1] == R"({"event":{"data":{"stdout":"1"}}})");
        REQUIRE(outcome.failure);
        CHECK(outcome.failure->code == moat::errc::file_not_found);
        CHECK(outcome.failure->detail == "connect not_found: no such process");

        // A frame past the reader's cap is refused as a protocol error.
        http::request oversize = get(base + "/process.Process/Start?oversize");
        oversize.method = "POST";
        oversize.body = http::connect::encode_envelope(0, "{}");
        auto big = co_await client.async_send(std::move(oversize));
        REQUIRE(big);
        auto refused = co_await read_connect_stream(*big);
        REQUIRE(refused.failure);
        CHECK(refused.failure->code == moat::errc::protocol_error);
        CHECK(contains(refused.failure->detail, "over the cap of 1024"));
    }
    co_await server.async_stop(std::chrono::milliseconds(1000));
}

// moat's server over TLS (make_tls_stream_factory), and moat's client trusting the test CA.
asio::awaitable<void> against_moat_tls_server() {
    const auto executor = co_await asio::this_coro::executor;
    auto context =
        http::make_server_context(certificates() + "/good.pem", certificates() + "/good.key");
    REQUIRE(context);
    http::server_options server_options;
    server_options.make_stream = http::make_tls_stream_factory(*context);
    http::server server(executor, server_options);
    REQUIRE(server.route("GET", "/hello", serve_hello));
    auto endpoint = server.start();
    REQUIRE(endpoint);
    const auto url = "https://localhost:" + std::to_string(endpoint->port()) + "/hello";
    {
        http::client_options options;
        options.ca_file = certificates() + "/ca.pem";
        http::client client(executor, options);
        for (int i = 0; i < 3; ++i) {
            auto r = co_await client.async_fetch(get(url), 1024);
            REQUIRE(r);
            CHECK(r->body == "hello");
        }
        CHECK(server.stats().accepted == 1);
        http::client untrusting(executor);
        auto refused = co_await untrusting.async_fetch(get(url), 1024);
        REQUIRE(!refused);
        CHECK(contains(refused.error().detail, "certificate verify failed: unknown CA"));
        // The server keeps serving after a refused handshake.
        auto again = co_await client.async_fetch(get(url), 1024);
        REQUIRE(again);
    }
    co_await server.async_stop(std::chrono::milliseconds(1000));
}

}  // namespace

TEST_CASE("a server context from a PEM pair serves the client, and a mismatched key is refused") {
    const auto& dir = certificates();
    auto mismatched = http::make_server_context(dir + "/good.pem", dir + "/expired.key");
    REQUIRE(!mismatched);
    CHECK(mismatched.error().code == moat::errc::invalid_argument);
    CHECK(contains(mismatched.error().detail, "does not match"));
    auto missing = http::make_server_context(dir + "/nope.pem", dir + "/good.key");
    REQUIRE(!missing);
    CHECK(contains(missing.error().detail, "nope.pem: cannot be read"));
    auto bad_ca = http::make_client_context({true, dir + "/nope.pem"});
    REQUIRE(!bad_ca);
    CHECK(bad_ca.error().code == moat::errc::invalid_argument);

    auto context = http::make_server_context(dir + "/good.pem", dir + "/good.key");
    REQUIRE(context);
    asio::io_context io;
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
    std::exception_ptr server_failure;
    asio::co_spawn(io, serve_one_tls(acceptor, **context), rethrow_into{&server_failure});
    moat::test::run_async(io, fetch_from_tls_server(acceptor.local_endpoint().port()));
    io.run_for(std::chrono::seconds(5));  // the server's last write completes
    if (server_failure) std::rethrow_exception(server_failure);
}

TEST_CASE("a URL is split into scheme, host, port and target, and bad ones are refused") {
    auto u = http::parse_url("https://API.example.com/v2/sandboxes?state=running#frag");
    REQUIRE(u);
    CHECK(u->is_tls);
    CHECK(u->host == "api.example.com");
    CHECK(u->port == 443);
    CHECK(u->target == "/v2/sandboxes?state=running");
    auto v6 = http::parse_url("http://[::1]:8080");
    REQUIRE(v6);
    CHECK(v6->host == "::1");
    CHECK(v6->port == 8080);
    CHECK(v6->target == "/");
    CHECK(http::parse_url("http://h?x=1")->target == "/?x=1");
    for (const char* bad : {"ftp://h/", "http://user:pw@h/", "http://h:0/", "http://h:65536/",
                            "http://h:x/", "http:///x", "http://[::1/", "h/x"}) {
        CAPTURE(bad);
        const auto r = http::parse_url(bad);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::invalid_argument);
        CHECK(!contains(r.error().detail, "pw"));
    }
}

TEST_CASE("the client sends unary and chunked bodies and reads chunked ones against Node http") {
    node_peer peer;
    const auto descriptors = open_descriptors();
    {
        asio::io_context io;
        moat::test::run_async(io, unary_and_chunked(peer));
    }
    CHECK(open_descriptors() == descriptors);
}

TEST_CASE(
    "the client reuses a keep-alive connection, one server-side connection for many requests") {
    node_peer peer;
    asio::io_context io;
    moat::test::run_async(io, keep_alive_reuse(peer));
}

TEST_CASE("the pool caps connections per origin and a waiting request is bounded by its deadline") {
    node_peer peer;
    const auto descriptors = open_descriptors();
    {
        asio::io_context io;
        moat::test::run_async(io, pool_cap(peer));
    }
    CHECK(open_descriptors() == descriptors);
}

TEST_CASE("a streamed download stops the server while the caller does not read") {
    node_peer peer;
    asio::io_context io;
    moat::test::run_async(io, backpressure(peer));
}

TEST_CASE(
    "truncated, oversize, garbage, stalled and reset responses are typed errors, no fd leaks") {
    node_peer peer;
    const auto descriptors = open_descriptors();
    {
        asio::io_context io;
        moat::test::run_async(io, bad_responses(peer));
    }
    CHECK(open_descriptors() == descriptors);
}

TEST_CASE("no credential reaches an error detail or a log line") {
    node_peer peer;
    asio::io_context io;
    std::vector<std::string> log;
    moat::set_log_sink([&log](const moat::log_record& r) {
        log.emplace_back(std::string(r.component) + ": " + std::string(r.message));
    });
    moat::test::run_async(io, secrets_stay_out(peer, log));
    moat::set_log_sink({});
}

TEST_CASE(
    "plain http is only for loopback unless opted in by name, and framing headers are the "
    "client's") {
    asio::io_context io;
    moat::test::run_async(io, plain_http_policy());
}

TEST_CASE("TLS with the test CA works by name and by address, and reuses its connection") {
    node_peer peer("good");
    const auto descriptors = open_descriptors();
    {
        asio::io_context io;
        moat::test::run_async(io, tls_verified(peer));
    }
    CHECK(open_descriptors() == descriptors);
}

TEST_CASE("TLS refuses a wrong host name, an unknown CA and an expired certificate, each clearly") {
    struct row {
        const char* certificate;
        const char* reason;
    };
    for (const auto& r : {row{"wrong_name", "certificate verify failed: host name mismatch"},
                          row{"unknown_ca", "certificate verify failed: unknown CA"},
                          row{"expired", "certificate verify failed: expired"}}) {
        CAPTURE(r.certificate);
        node_peer peer(r.certificate);
        const auto descriptors = open_descriptors();
        moat::error e;
        {
            asio::io_context io;
            e = moat::test::run_async(io, tls_refusal(peer));
        }
        CHECK(e.code == moat::errc::backend_failure);
        CHECK(contains(e.detail, r.reason));
        CHECK(contains(e.detail, "TLS handshake with https://localhost:"));
        CHECK(open_descriptors() == descriptors);
    }
}

TEST_CASE("moat's client against moat's server: keep-alive, a chunked upload, a Connect stream") {
    const auto descriptors = open_descriptors();
    {
        asio::io_context io;
        moat::test::run_async(io, against_moat_server());
    }
    CHECK(open_descriptors() == descriptors);
}

TEST_CASE("moat's server over TLS serves moat's client, and a client without the CA is refused") {
    const auto descriptors = open_descriptors();
    {
        asio::io_context io;
        moat::test::run_async(io, against_moat_tls_server());
    }
    CHECK(open_descriptors() == descriptors);
}

TEST_CASE("a failing status becomes a typed error, and 429 carries the server's Retry-After") {
    http::header_list headers;
    headers.add("Retry-After", " 7 ");
    headers.add("X-API-Key", "e2b_0123456789abcdef");
    const auto limited = http::error_for_status(429, headers, "POST /v2/sandboxes");
    CHECK(limited.error.code == moat::errc::rate_limited);
    CHECK(limited.error.code == moat::condition::retryable);
    REQUIRE(limited.retry_after);
    CHECK(limited.retry_after->count() == 7);
    CHECK(limited.error.detail == "POST /v2/sandboxes: HTTP 429; retry after 7 s");
    CHECK(!contains(limited.error.detail, "e2b_"));

    http::header_list dated;
    dated.add("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT");
    const auto undated = http::error_for_status(429, dated, "GET /x");
    CHECK(!undated.retry_after);
    CHECK(undated.error.detail == "GET /x: HTTP 429");
    CHECK(!http::parse_retry_after({}));

    const http::header_list none;
    CHECK(http::error_for_status(401, none, "x").error.code == moat::errc::unauthorized);
    CHECK(http::error_for_status(403, none, "x").error.code == moat::errc::permission_denied);
    CHECK(http::error_for_status(404, none, "x").error.code == moat::errc::file_not_found);
    CHECK(http::error_for_status(400, none, "x").error.code == moat::errc::invalid_argument);
    CHECK(http::error_for_status(503, none, "x").error.code == moat::errc::backend_failure);
    CHECK(!http::error_for_status(503, headers, "x").retry_after);  // only a 429's is read
}

// --- the pool's idle sweep (connection_pool.hpp) and the one loopback rule ---

namespace {

using moat::as_tuple;

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
