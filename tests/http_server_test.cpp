// moat's HTTP/1.1 server (src/http/server.*) driven by real peers over loopback: curl, Node's http
// module and fetch, and raw sockets for the input no well-behaved client sends. Each case checks
// the status (or the closed connection), that the server keeps serving, and that the process
// holds the same descriptors afterwards. Timeouts are short (server_options) so the suite is fast.
#include "http/server.hpp"
#include "http/tls_server_stream.hpp"

#include "core/asio_compat.hpp"
#include "support/build_paths.hpp"
#include "support/host_inspect.hpp"

#include <moat/log.hpp>

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace http = moat::http;
using namespace std::chrono_literals;

namespace {

using moat::test::open_descriptors;

// Shared by the test handlers; touched only on the server's executor.
struct gate_state {
    explicit gate_state(const asio::any_io_executor& ex) : gate(ex), hold(ex) {}
    asio::steady_timer gate;  // the streamed response waits on it for the client's POST /next
    int released = 0;
    bool reader_blocked = false;  // /hold has read its first piece and stopped
    asio::steady_timer hold;
    std::uint64_t held_bytes = 0;
};

asio::awaitable<void> hello(http::server_request&, http::server_response& res) {
    http::header_list headers;
    headers.add("Content-Type", "text/plain");
    (void)co_await res.async_send(200, std::move(headers), "hello");
}

// Vouches for the connection (as moat serve does once a request carries a valid key).
asio::awaitable<void> login(http::server_request& req, http::server_response& res) {
    req.mark_authenticated();
    (void)co_await res.async_send(200, {}, "welcome");
}

asio::awaitable<void> echo(http::server_request& req, http::server_response& res) {
    auto body = co_await req.async_read_body();
    if (!body) co_return;  // the server answers 413 / 400 itself
    http::header_list headers;
    headers.add("Content-Type", "application/octet-stream");
    (void)co_await res.async_send(200, std::move(headers), std::move(*body));
}

asio::awaitable<void> count(http::server_request& req, http::server_response& res) {
    std::uint64_t total = 0;
    std::uint64_t pieces = 0;
    for (;;) {
        auto piece = co_await req.async_read_some();
        if (!piece) co_return;
        if (piece->empty()) break;
        total += piece->size();
        ++pieces;
    }
    http::header_list headers;
    headers.add("Content-Type", "application/json");
    std::string body = R"({"bytes":)" + std::to_string(total) + R"(,"chunked":)" +
                       (req.has_body() && !req.content_length() ? "true" : "false") + "}";
    (void)pieces;
    (void)co_await res.async_send(200, std::move(headers), std::move(body));
}

// Five frames; each after the client asked for it with POST /next.
asio::awaitable<void> stream_frames(gate_state& g, http::server_response& res) {
    http::header_list headers;
    headers.add("Content-Type", "text/plain");
    auto begun = co_await res.async_begin(200, std::move(headers));
    if (!begun) co_return;
    for (int i = 1; i <= 5; ++i) {
        const std::string frame = "frame-" + std::to_string(i) + "\n";
        auto written = co_await res.async_write(frame);
        if (!written) co_return;
        while (g.released < i) {
            g.gate.expires_after(10s);
            auto token = moat::as_tuple(asio::use_awaitable);
            auto [ec] = co_await g.gate.async_wait(token);
            if (!ec) co_return;  // nobody asked for the next frame: end short (the test fails)
        }
    }
    (void)co_await res.async_end();
}

asio::awaitable<void> next_frame(gate_state& g, http::server_response& res) {
    ++g.released;
    g.gate.cancel();
    (void)co_await res.async_send(204, {}, "");
}

// Reads one piece, then stops reading until released (backpressure), then drains.
asio::awaitable<void> hold_body(gate_state& g, http::server_request& req,
                                http::server_response& res) {
    auto first = co_await req.async_read_some();
    if (!first) co_return;
    g.held_bytes += first->size();
    g.reader_blocked = true;
    g.hold.expires_after(20s);
    auto token = moat::as_tuple(asio::use_awaitable);
    auto [ec] = co_await g.hold.async_wait(token);
    (void)ec;
    for (;;) {
        auto piece = co_await req.async_read_some();
        if (!piece || piece->empty()) break;
        g.held_bytes += piece->size();
    }
    std::string body = std::to_string(g.held_bytes);
    (void)co_await res.async_send(200, {}, std::move(body));
}

// A large response for the client that never reads.
asio::awaitable<void> big(http::server_request&, http::server_response& res) {
    auto begun = co_await res.async_begin(200, {});
    if (!begun) co_return;
    const std::string frame(64 * 1024, 'b');
    for (int i = 0; i < 4096; ++i) {  // 256 MiB: far past any socket buffer
        auto written = co_await res.async_write(frame);
        if (!written) co_return;
    }
    (void)co_await res.async_end();
}

// One chunk, then the response is cut off (a peer that died mid-answer).
asio::awaitable<void> cut_short(http::server_request&, http::server_response& res) {
    auto begun = co_await res.async_begin(200, {});
    if (!begun) co_return;
    (void)co_await res.async_write("partial\n");
    res.abort();
}

// The interceptor's handler: takes the connection over and echoes the bytes behind the head
// (those the server read already first), prefixed, until the client ends its sending.
asio::awaitable<void> tunnel_echo(http::server_request& req, http::server_response&) {
    auto taken = req.take_over();
    if (!taken) co_return;
    auto& s = *taken->connection;
    std::string out = "tunnel " + std::string(req.method()) + " " + std::string(req.path()) + ":" +
                      std::string(taken->read_ahead);
    std::array<char, 4096> buffer{};
    for (;;) {
        const std::array<asio::const_buffer, 1> pieces{asio::buffer(out)};
        auto [write_error, written] = co_await s.async_write(pieces);
        if (write_error) co_return;
        auto [read_error, n] = co_await s.async_read_some(asio::buffer(buffer));
        if (read_error) break;
        out.assign(buffer.data(), n);
    }
    co_await s.async_shutdown();
}

http::server_options fast_options() {
    http::server_options o;
    o.head_timeout = 500ms;
    o.idle_timeout = 500ms;
    o.body_read_timeout = 500ms;
    o.write_timeout = 500ms;
    return o;
}

// A server on its own thread (the peers in these tests block), with the test routes.
struct running_server {
    asio::io_context io;
    gate_state gates{io.get_executor()};
    std::optional<http::server> server;
    std::uint16_t port = 0;
    std::thread thread;
    // Keeps io.run() going until stop(), so on_server() always finds the thread running.
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;

    explicit running_server(http::server_options options = fast_options()) {
        server.emplace(io.get_executor(), std::move(options));
        auto* g = &gates;
        REQUIRE(server->route("GET", "/hello", hello));
        REQUIRE(server->route("GET", "/login", login));
        REQUIRE(server->route("POST", "/echo", echo));
        http::route_options large;
        large.max_body_bytes = 64 * 1024 * 1024;
        REQUIRE(server->route("POST", "/count", count, large));
        REQUIRE(
            server->route("GET", "/stream", [g](http::server_request&, http::server_response& res) {
                return stream_frames(*g, res);
            }));
        REQUIRE(
            server->route("POST", "/next", [g](http::server_request&, http::server_response& res) {
                return next_frame(*g, res);
            }));
        REQUIRE(server->route(
            "POST", "/hold",
            [g](http::server_request& req, http::server_response& res) {
                return hold_body(*g, req, res);
            },
            large));
        REQUIRE(server->route("GET", "/big", big));
        REQUIRE(server->route("GET", "/cut", cut_short));
        server->intercept(
            [](const http::request_head& head) {
                return head.headers.find("Host") == "tunnel.test";
            },
            tunnel_echo);
        REQUIRE(server->route("GET", "/sandboxes/{id}/logs",
                              [](http::server_request& req, http::server_response& res) {
                                  return echo_param(req, res);
                              }));
        auto bound = server->start();
        REQUIRE(bound);
        port = bound->port();
        work.emplace(io.get_executor());
        thread = std::thread([this] { io.run(); });
    }

    static asio::awaitable<void> echo_param(http::server_request& req, http::server_response& res) {
        std::string id(req.param("id"));
        (void)co_await res.async_send(200, {}, std::move(id));
    }

    // Runs `f` on the server's executor and returns its value (bounded wait).
    template <class F>
    auto on_server(F f) {
        std::packaged_task<decltype(f())()> task(std::move(f));
        auto future = task.get_future();
        asio::post(io, [&task] { task(); });
        REQUIRE(future.wait_for(10s) == std::future_status::ready);
        return future.get();
    }

    http::server_stats stats() {
        return on_server([this] { return server->stats(); });
    }

    void stop(std::chrono::milliseconds grace = 500ms) {
        if (!thread.joinable()) return;
        auto done = asio::co_spawn(io, server->async_stop(grace), asio::use_future);
        REQUIRE(done.wait_for(20s) == std::future_status::ready);
        done.get();
        on_server([this] {
            gates.gate.cancel();
            gates.hold.cancel();
            return 0;
        });
        work.reset();
        thread.join();
        server.reset();
    }

    ~running_server() {
        if (thread.joinable()) {
            io.stop();
            thread.join();
        }
    }
};

// A blocking loopback socket whose every wait is bounded.
struct client_socket {
    int fd = -1;
    // `from`: the loopback address to connect from (127.0.0.0/8 is all this host's), so that one
    // test can be several peers.
    explicit client_socket(std::uint16_t port, std::chrono::milliseconds bound = 5000ms,
                           const char* from = nullptr) {
        fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        timeval tv{};
        tv.tv_sec = bound.count() / 1000;
        tv.tv_usec = (bound.count() % 1000) * 1000;
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (from) {
            sockaddr_in local{};
            local.sin_family = AF_INET;
            REQUIRE(::inet_pton(AF_INET, from, &local.sin_addr) == 1);
            REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0);
        }
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(port);
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    }
    ~client_socket() {
        if (fd >= 0) ::close(fd);
    }
    client_socket(const client_socket&) = delete;
    client_socket& operator=(const client_socket&) = delete;
    client_socket(client_socket&& o) noexcept : fd(std::exchange(o.fd, -1)) {}

    // False when the peer stopped taking bytes (the send timed out) or reset.
    bool send_all(std::string_view data) {
        while (!data.empty()) {
            const auto n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
            if (n <= 0) return false;
            data.remove_prefix(static_cast<std::size_t>(n));
        }
        return true;
    }
    // Whether the peer has closed (or reset) the connection; false while it is open and silent.
    bool peer_closed() {
        char byte = 0;
        const auto n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    // One request, and the whole of its response (a Content-Length body), on this connection.
    std::string exchange(std::string_view request) {
        if (!send_all(request)) return {};
        std::string out;
        char buf[16384];
        for (;;) {
            const auto head_end = out.find("\r\n\r\n");
            if (head_end != std::string::npos) {
                const auto at = out.find("Content-Length: ");
                if (at != std::string::npos && at < head_end) {
                    const auto length = std::stoul(out.substr(at + 16));
                    if (out.size() >= head_end + 4 + length) return out;
                }
            }
            const auto n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) return out;
            out.append(buf, static_cast<std::size_t>(n));
        }
    }
    // Everything until the peer closes (closed = true), or until the receive times out.
    std::string read_all(bool* closed = nullptr, std::size_t cap = 1 << 20) {
        std::string out;
        char buf[16384];
        for (;;) {
            const auto n = ::recv(fd, buf, sizeof buf, 0);
            if (n == 0 || (n < 0 && errno == ECONNRESET)) {
                if (closed) *closed = true;
                return out;
            }
            if (n < 0) {
                if (closed) *closed = false;
                return out;
            }
            out.append(buf, static_cast<std::size_t>(n));
            if (out.size() > cap) return out;
        }
    }
};

std::string round_trip(std::uint16_t port, std::string_view request, bool* closed = nullptr) {
    client_socket s(port);
    s.send_all(request);
    return s.read_all(closed);
}

std::string run(const std::string& command) {
    std::string out;
    FILE* p = ::popen(("timeout 30 " + command + " 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    while (auto n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int status = ::pclose(p);
    CAPTURE(command);
    CAPTURE(out);
    CHECK(status == 0);
    return out;
}

std::string node(const char* mode, std::uint16_t port) {
    return run("node " + moat::test::source_dir() + "/tests/http/node_client.mjs " + mode + " " +
               std::to_string(port));
}

bool serves_hello(std::uint16_t port) {
    const auto reply =
        round_trip(port, "GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    return reply.starts_with("HTTP/1.1 200 OK\r\n") && reply.ends_with("\r\n\r\nhello");
}

std::string status_line(std::string_view reply) {
    return std::string(reply.substr(0, reply.find("\r\n")));
}

}  // namespace

TEST_CASE("curl gets, uploads chunked and reads a streamed response from the server") {
    const auto fds = open_descriptors();
    {
        running_server s;
        const auto url = "http://127.0.0.1:" + std::to_string(s.port);
        CHECK(run("curl -sS " + url + "/hello") == "hello");
        CHECK(run("curl -sS " + url + "/sandboxes/abc-123/logs") == "abc-123");

        const auto file = std::filesystem::temp_directory_path() / "moat-http-upload.bin";
        {
            std::ofstream out(file, std::ios::binary);
            out << std::string(3 * 1024 * 1024 + 17, 'u');
        }
        // Chunked (the e2b SDK's way), and with Content-Length (curl sends Expect: 100-continue
        // for a body this large: the server answers 100 when the handler starts reading).
        CHECK(run("curl -sS -H 'Transfer-Encoding: chunked' --data-binary @" + file.string() + " " +
                  url + "/count") == R"({"bytes":3145745,"chunked":true})");
        CHECK(run("curl -sS --data-binary @" + file.string() + " " + url + "/count") ==
              R"({"bytes":3145745,"chunked":false})");
        std::filesystem::remove(file);

        // An aborted stream ends without its last chunk: curl reports the transfer cut short
        // (18), after the part that was sent; the server goes on serving.
        CHECK(run("curl -sS " + url + "/cut 2>/dev/null; echo \" curl=$?\"") ==
              "partial\n curl=18\n");
        CHECK(run("curl -sS " + url + "/hello") == "hello");

        // The body cap of /echo is the default 1 MiB: 413 with the JSON error body.
        const auto declared =
            run("curl -sS -w ' %{http_code}' -H 'Content-Length: 2000000' "
                "--data 'x' " +
                url + "/echo || true");
        CHECK(declared.find(R"({"code":413,"message":"request body past 1048576 bytes"} 413)") !=
              std::string::npos);
        s.stop();
    }
    CHECK(open_descriptors() == fds);
}

TEST_CASE(
    "Node's http module and fetch upload chunked bodies and read streamed frames one by one") {
    const auto fds = open_descriptors();
    {
        running_server s;
        auto out = node("chunkedUpload", s.port);
        CHECK(out.find(R"("status":200)") != std::string::npos);
        CHECK(out.find(R"({\"piece\":0}{\"piece\":1})") != std::string::npos);
        CHECK(out.find(R"({\"piece\":49})") != std::string::npos);

        out = node("keepAlive", s.port);
        CHECK(out.find(R"({"status":[200,200],"body":["hello","hello"],"reused":true})") !=
              std::string::npos);

        out = node("fetchStreamUpload", s.port);
        CHECK(out.find(R"({"status":200,"body":{"bytes":64000,"chunked":true}})") !=
              std::string::npos);

        out = node("fetchStreamRead", s.port);
        CHECK(out.find(R"({"status":200,"encoding":"chunked","frames":["frame-1","frame-2",)"
                       R"("frame-3","frame-4","frame-5"]})") != std::string::npos);

        out = node("fetchErrors", s.port);
        CHECK(out.find(R"("missing":[404,{"code":404,"message":"no route for this path"}])") !=
              std::string::npos);
        CHECK(out.find(R"("wrong":[405,"GET",{"code":405,"message":"method not allowed"}])") !=
              std::string::npos);
        s.stop();
    }
    CHECK(open_descriptors() == fds);
}

TEST_CASE(
    "malformed requests get their 4xx and a closed connection, and the server keeps serving") {
    const auto fds = open_descriptors();
    {
        running_server s;
        struct bad_case {
            std::string request;
            std::string status;
        };
        const std::vector<bad_case> cases = {
            {"GARBAGE\r\n\r\n", "HTTP/1.1 400 Bad Request"},
            {"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "HTTP/1.1 400 Bad Request"},  // TLS
            {"GET /hello HTTP/1.1\r\nHost: localhost\r\nX-Big: " + std::string(70000, 'a') +
                 "\r\n\r\n",
             "HTTP/1.1 431 Request Header Fields Too Large"},
            {"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 99999999999999999\r\n\r\n",
             "HTTP/1.1 413 Content Too Large"},
            {"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
             "999999999999999999999999\r\n\r\n",
             "HTTP/1.1 400 Bad Request"},
            {"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
             "HTTP/1.1 400 Bad Request"},
            {"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
             "3\r\nabcdef\r\n",
             "HTTP/1.1 400 Bad Request"},
            {"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n"
             "Transfer-Encoding: chunked\r\n\r\n",
             "HTTP/1.1 400 Bad Request"},
            {"GET /hello HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request"},  // no Host
            // A fold whose first line is empty, a second Host, a bare LF after the request line.
            {"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length:\r\n 2\r\n\r\nab",
             "HTTP/1.1 400 Bad Request"},
            {"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"
             "2\r\nab\r\n0\r\n\r\n",
             "HTTP/1.1 400 Bad Request"},
            {"GET /hello HTTP/1.1\r\nHost: localhost\r\nX-API-Key:\r\n KEY\r\n\r\n",
             "HTTP/1.1 400 Bad Request"},
            {"GET /hello HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n",
             "HTTP/1.1 400 Bad Request"},
            {"GET /hello HTTP/1.1\nHost: localhost\r\n\r\n", "HTTP/1.1 400 Bad Request"},
            {"GET /hello HTTP/1.1\r\nHost: evil.example:80\r\n\r\n",
             "HTTP/1.1 421 Misdirected Request"},
            {"CONNECT localhost:22 HTTP/1.1\r\nHost: localhost\r\n\r\n",
             "HTTP/1.1 501 Not Implemented"},
            {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/1.1 505 HTTP Version Not Supported"},
        };
        for (const auto& c : cases) {
            CAPTURE(c.request.substr(0, 80));
            bool closed = false;
            const auto reply = round_trip(s.port, c.request, &closed);
            CHECK(status_line(reply) == c.status);
            CHECK(reply.find("\r\n\r\n{\"code\":" + c.status.substr(9, 3) + ",\"message\":\"") !=
                  std::string::npos);
            CHECK(closed);
            CHECK(serves_hello(s.port));
        }
        // Garbage after a good request on the same keep-alive connection still gets its 400.
        {
            bool closed = false;
            const auto replies = round_trip(s.port,
                                            "HEAD /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"
                                            "GARBAGE\r\n\r\n",
                                            &closed);
            CAPTURE(replies);
            CHECK(replies.starts_with("HTTP/1.1 200 OK\r\n"));
            CHECK(replies.find("\r\n\r\nHTTP/1.1 400 Bad Request\r\n") != std::string::npos);
            CHECK(replies.ends_with(
                R"(,"message":"malformed request: Invalid method encountered"})"));
            CHECK(closed);
        }
        // A chunked body cut off by the client: no answer is owed, the server moves on.
        {
            client_socket c(s.port);
            c.send_all(
                "POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
                "10\r\nabc");
        }
        CHECK(serves_hello(s.port));
        s.stop();
    }
    CHECK(open_descriptors() == fds);
}

TEST_CASE("a slowloris client and a stalled upload are disconnected after their timeouts") {
    const auto fds = open_descriptors();
    {
        running_server s;
        client_socket slow(s.port);
        REQUIRE(slow.send_all("GET /hello HTTP/1.1\r\nHost: local"));
        // One byte at a time, never finishing the head: closed once head_timeout (500 ms) passes.
        bool closed = false;
        for (int i = 0; i < 40 && !closed; ++i) {
            if (!slow.send_all("h")) closed = true;
            std::this_thread::sleep_for(50ms);
            char b;
            const auto n = ::recv(slow.fd, &b, 1, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN)) closed = true;
        }
        CHECK(closed);

        client_socket stalled(s.port);
        REQUIRE(stalled.send_all(
            "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nabc"));
        bool stalled_closed = false;
        (void)stalled.read_all(&stalled_closed);  // body_read_timeout: closed without an answer
        CHECK(stalled_closed);
        CHECK(serves_hello(s.port));
        s.stop();
    }
    CHECK(open_descriptors() == fds);
}

TEST_CASE("a keep-alive connection serves requests in turn and closes after the idle timeout") {
    const auto fds = open_descriptors();
    {
        running_server s;
        client_socket c(s.port);
        // Two pipelined requests, answered in order on the same connection.
        REQUIRE(
            c.send_all("GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"
                       "GET /sandboxes/two/logs HTTP/1.1\r\nHost: localhost\r\n\r\n"));
        bool closed = false;
        const auto replies = c.read_all(&closed);  // idle_timeout (500 ms) then closed
        CHECK(closed);
        CHECK(replies ==
              "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"
              "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo");
        CHECK(s.stats().open_connections == 0);
        s.stop();
    }
    CHECK(open_descriptors() == fds);
}

TEST_CASE(
    "an interceptor takes requests for its hosts whatever their path, and may take the "
    "connection over") {
    http::server_options options = fast_options();
    options.allowed_hosts = {"localhost", "tunnel.test"};
    running_server s(options);
    client_socket c(s.port);
    // The bytes behind the head reach the handler, those it read already first; later bytes
    // follow; no deadline of the server's applies (the pause outlasts head and idle timeouts).
    REQUIRE(c.send_all("DELETE /no/such/route HTTP/1.1\r\nHost: tunnel.test\r\n\r\nearly "));
    std::this_thread::sleep_for(700ms);
    REQUIRE(c.send_all("late"));
    ::shutdown(c.fd, SHUT_WR);
    bool closed = false;
    CHECK(c.read_all(&closed) == "tunnel DELETE /no/such/route:early late");
    CHECK(closed);
    // Other hosts still go to the routes.
    CHECK(serves_hello(s.port));
    s.stop();
}

namespace {

// The TLS seam with the plain stream behind it: proves the server runs every connection over
// what server_options::make_stream returns, and drops the connection when it fails.
asio::awaitable<moat::result<std::unique_ptr<http::stream>>> counting_factory(
    std::shared_ptr<std::atomic<int>> made, asio::ip::tcp::socket socket,
    std::chrono::steady_clock::time_point deadline) {
    CHECK(deadline > std::chrono::steady_clock::now());
    if (made->fetch_add(1) == 1) {  // the second connection: a failed "handshake"
        co_return moat::make_error(moat::errc::backend_failure, "handshake refused");
    }
    co_return http::make_tcp_stream(std::move(socket));
}

}  // namespace

TEST_CASE("connections run over the stream the factory makes, and a failed factory drops one") {
    auto made = std::make_shared<std::atomic<int>>(0);
    auto options = fast_options();
    options.make_stream = [made](asio::ip::tcp::socket socket,
                                 std::chrono::steady_clock::time_point deadline) {
        return counting_factory(made, std::move(socket), deadline);
    };
    running_server s(options);
    CHECK(serves_hello(s.port));
    bool closed = false;
    const auto refused =
        round_trip(s.port, "GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n", &closed);
    CHECK(refused.empty());
    CHECK(closed);
    CHECK(serves_hello(s.port));
    CHECK(made->load() == 3);
    s.stop();
}

TEST_CASE("a client that never reads a streamed response is dropped after the write deadline") {
    const auto fds = open_descriptors();
    {
        running_server s;
        client_socket reader(s.port);
        int small = 4096;
        ::setsockopt(reader.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        REQUIRE(reader.send_all("GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n"));
        // Not reading: the server's write stalls, its write_timeout (500 ms) drops the connection.
        bool dropped = false;
        for (int i = 0; i < 100 && !dropped; ++i) {
            std::this_thread::sleep_for(50ms);
            dropped = s.stats().open_connections == 0;
        }
        CHECK(dropped);
        CHECK(serves_hello(s.port));
        s.stop();
    }
    CHECK(open_descriptors() == fds);
}

TEST_CASE("a handler that stops reading the body stops the client from sending") {
    running_server s;
    client_socket uploader(s.port, 300ms);
    REQUIRE(uploader.send_all(
        "POST /hold HTTP/1.1\r\nHost: localhost\r\nContent-Length: 67108864\r\n\r\n"));
    const std::string piece(64 * 1024, 'p');
    std::uint64_t sent = 0;
    // The handler read one piece and stopped: the kernel buffers fill and the send times out.
    while (sent < 64ull * 1024 * 1024 && uploader.send_all(piece)) sent += piece.size();
    CHECK(sent < 16ull * 1024 * 1024);
    CHECK(s.on_server([&] { return s.gates.reader_blocked; }));
    CHECK(s.on_server([&] { return s.gates.held_bytes; }) <= 16 * 1024);
    s.stop(100ms);
}

TEST_CASE("a thousand idle connections past the cap do not stop the server serving others") {
    // 1000 client sockets and the server's 100 need more than a default soft limit of 1024.
    rlimit files{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &files) == 0);
    if (files.rlim_cur < 4096 && files.rlim_max >= 4096) {
        files.rlim_cur = 4096;
        REQUIRE(::setrlimit(RLIMIT_NOFILE, &files) == 0);
    }
    const auto fds = open_descriptors();
    {
        auto options = fast_options();
        options.max_connections = 100;
        options.head_timeout = 20'000ms;  // none of them times out during the test
        options.unauthenticated_grace = 0ms;
        running_server s(options);
        std::vector<client_socket> idle;
        idle.reserve(1000);
        for (int i = 0; i < 1000; ++i) idle.emplace_back(s.port);
        // Each one past a cap closed an older idle one (or, when none was past its setup yet,
        // was itself answered 503 and closed): never more open than the caps allow.
        bool settled = false;
        for (int i = 0; i < 500 && !settled; ++i) {
            std::this_thread::sleep_for(10ms);
            const auto st = s.stats();
            settled = st.accepted == 1000 && st.evicted + st.refused_over_cap >= 900;
        }
        CHECK(settled);
        const auto st = s.stats();
        CHECK(st.open_connections <= options.max_unauthenticated_per_peer);
        CHECK(st.evicted > 0);
        // The oldest are the ones closed, and a new client is served at once.
        CHECK(idle.front().peer_closed());
        CHECK(serves_hello(s.port));
        idle.clear();
        s.stop();
    }
    CHECK(open_descriptors() == fds);
}

TEST_CASE(
    "idle unauthenticated connections make room for new clients, and an authenticated one is "
    "never closed for them") {
    auto options = fast_options();
    options.idle_timeout = 20'000ms;
    options.unauthenticated_idle_timeout = 20'000ms;
    options.head_timeout = 20'000ms;
    options.max_connections = 8;
    options.max_unauthenticated = 4;
    options.max_unauthenticated_per_peer = 4;
    options.unauthenticated_grace = 0ms;
    running_server s(options);
    const std::string login = "GET /login HTTP/1.1\r\nHost: localhost\r\n\r\n";
    const std::string hello = "GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n";
    client_socket vouched(s.port);
    CHECK(status_line(vouched.exchange(login)) == "HTTP/1.1 200 OK");
    // Keep-alive clients that were served once and now sit idle, never authenticating: the
    // red team's flood of /health requests.
    std::vector<client_socket> idle;
    for (int i = 0; i < 20; ++i) {
        idle.emplace_back(s.port);
        CHECK(status_line(idle.back().exchange(hello)) == "HTTP/1.1 200 OK");
    }
    // Only the newest few are still open; the oldest were closed to make room.
    REQUIRE(s.stats().evicted >= 16);
    for (std::size_t i = 0; i < 16; ++i) CHECK(idle[i].peer_closed());
    CHECK_FALSE(idle.back().peer_closed());
    // The authenticated connection was never a candidate.
    CHECK_FALSE(vouched.peer_closed());
    CHECK(status_line(vouched.exchange(hello)) == "HTTP/1.1 200 OK");
    // And a new client is served.
    CHECK(serves_hello(s.port));
    s.stop();
}

TEST_CASE("one peer's idle unauthenticated connections make room among themselves only") {
    auto options = fast_options();
    options.idle_timeout = 20'000ms;
    options.unauthenticated_idle_timeout = 20'000ms;
    options.head_timeout = 20'000ms;
    options.max_unauthenticated = 16;
    options.max_unauthenticated_per_peer = 2;
    options.unauthenticated_grace = 0ms;
    running_server s(options);
    const std::string hello = "GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n";
    std::vector<client_socket> other;  // a quiet peer
    for (int i = 0; i < 2; ++i) {
        other.emplace_back(s.port, 5000ms, "127.0.0.3");
        CHECK(status_line(other.back().exchange(hello)) == "HTTP/1.1 200 OK");
    }
    std::vector<client_socket> flood;  // a loud one
    for (int i = 0; i < 10; ++i) {
        flood.emplace_back(s.port, 5000ms, "127.0.0.2");
        CHECK(status_line(flood.back().exchange(hello)) == "HTTP/1.1 200 OK");
    }
    CHECK(s.stats().evicted == 8);
    for (std::size_t i = 0; i < 8; ++i) CHECK(flood[i].peer_closed());
    CHECK_FALSE(flood[8].peer_closed());
    CHECK_FALSE(flood[9].peer_closed());
    for (auto& o : other) CHECK_FALSE(o.peer_closed());
    s.stop();
}

TEST_CASE("an unauthenticated idle connection is closed sooner than an authenticated one") {
    auto options = fast_options();
    options.idle_timeout = 20'000ms;
    options.unauthenticated_idle_timeout = 200ms;
    running_server s(options);
    client_socket vouched(s.port);
    CHECK(status_line(vouched.exchange("GET /login HTTP/1.1\r\nHost: localhost\r\n\r\n")) ==
          "HTTP/1.1 200 OK");
    client_socket anonymous(s.port);
    CHECK(status_line(anonymous.exchange("GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")) ==
          "HTTP/1.1 200 OK");
    bool closed = false;
    for (int i = 0; i < 500 && !closed; ++i) {
        std::this_thread::sleep_for(10ms);
        closed = anonymous.peer_closed();
    }
    CHECK(closed);
    CHECK_FALSE(vouched.peer_closed());
    s.stop();
}

TEST_CASE("no credential header value appears in a log line or an error body") {
    std::mutex lock;
    std::vector<std::string> lines;
    moat::set_log_sink([&](const moat::log_record& r) {
        std::lock_guard guard(lock);
        lines.emplace_back(std::string(r.component) + ": " + std::string(r.message));
    });
    std::string replies;
    {
        running_server s;
        const std::string secrets =
            "Authorization: Bearer sekrit-bearer-0001\r\nX-API-Key: e2b_sekrit_key_0002\r\n"
            "X-Access-Token: sekrit-token-0003\r\n";
        replies += round_trip(s.port, "GET /hello HTTP/1.1\r\nHost: localhost\r\n" + secrets +
                                          "Bad Header: v\r\n\r\n");
        replies += round_trip(s.port, "GET /hello HTTP/1.1\r\nHost: localhost\r\n" + secrets +
                                          "X-Pad: " + std::string(70000, 'p') + "\r\n\r\n");
        replies += round_trip(s.port, "GET /hello HTTP/1.1\r\nHost: evil\r\n" + secrets + "\r\n");
        replies += round_trip(s.port, "POST /echo HTTP/1.1\r\nHost: localhost\r\n" + secrets +
                                          "Transfer-Encoding: chunked\r\n\r\nq\r\n");
        replies += round_trip(s.port, "GET /nowhere HTTP/1.1\r\nHost: localhost\r\n" + secrets +
                                          "Connection: close\r\n\r\n");
        replies += round_trip(s.port,
                              "GET /hello HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
                              "Bearer sekrit\x01-bearer\r\n\r\n");
        s.stop();
    }
    moat::set_log_sink({});
    CHECK(replies.find("HTTP/1.1 400") != std::string::npos);
    CHECK(replies.find("HTTP/1.1 431") != std::string::npos);
    CHECK(replies.find("HTTP/1.1 421") != std::string::npos);
    CHECK(replies.find("HTTP/1.1 404") != std::string::npos);
    std::lock_guard guard(lock);
    CHECK_FALSE(lines.empty());  // the errors were logged (at debug), without the values
    for (const auto& line : lines) {
        CAPTURE(line);
        CHECK(line.find("sekrit") == std::string::npos);
    }
    CHECK(replies.find("sekrit") == std::string::npos);
}

TEST_CASE("a graceful stop lets the request in flight finish and refuses new connections") {
    running_server s;
    // A streamed response waiting for its second frame is in flight.
    client_socket streaming(s.port);
    REQUIRE(streaming.send_all("GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n"));
    char first[256];
    REQUIRE(::recv(streaming.fd, first, sizeof first, 0) > 0);
    client_socket idle(s.port);  // connected, no request: closed at once by the stop
    auto stopped = asio::co_spawn(s.io, s.server->async_stop(5000ms), asio::use_future);
    std::this_thread::sleep_for(100ms);
    bool idle_closed = false;
    (void)idle.read_all(&idle_closed);
    CHECK(idle_closed);
    // Release the remaining frames: the stream completes and the stop finishes.
    for (int i = 0; i < 5; ++i) {
        s.on_server([&] {
            ++s.gates.released;
            s.gates.gate.cancel();
            return 0;
        });
    }
    REQUIRE(stopped.wait_for(10s) == std::future_status::ready);
    bool closed = false;
    const auto rest = streaming.read_all(&closed);
    CHECK(closed);
    CHECK(rest.find("frame-5\n\r\n0\r\n\r\n") != std::string::npos);
    s.work.reset();
    s.thread.join();
    s.server.reset();
}

TEST_CASE("over TLS the server serves curl, and a plaintext client is dropped without harm") {
    char pattern[] = "/tmp/moat-http-server-ca-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    const std::string certs = pattern;
    REQUIRE(std::system(
                (moat::test::source_dir() + "/tests/http/make_test_ca.sh " + certs).c_str()) == 0);
    const auto fds = open_descriptors();
    {
        auto factory = http::make_tls_stream_factory(certs + "/good.pem", certs + "/good.key");
        REQUIRE(factory);
        auto options = fast_options();
        options.make_stream = std::move(*factory);
        running_server s(options);
        const auto url = "https://localhost:" + std::to_string(s.port);
        const auto curl = "curl -sS --cacert " + certs + "/ca.pem ";
        CHECK(run(curl + url + "/hello") == "hello");
        CHECK(run(curl + "-H 'Transfer-Encoding: chunked' --data-binary @" + certs + "/good.pem " +
                  url + "/echo") == run("cat " + certs + "/good.pem"));
        // Two requests on one TLS connection (keep-alive), and a 404's JSON body.
        CHECK(run(curl + url + "/sandboxes/a/logs " + url + "/sandboxes/b/logs") == "ab");
        CHECK(run(curl + url + "/nowhere") == R"({"code":404,"message":"no route for this path"})");

        bool closed = false;
        const auto plain =
            round_trip(s.port, "GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n", &closed);
        CHECK(closed);
        CHECK_FALSE(plain.starts_with("HTTP/1.1"));
        CHECK(run(curl + url + "/hello") == "hello");
        s.stop();
    }
    CHECK(open_descriptors() == fds);
    std::filesystem::remove_all(certs);
}
