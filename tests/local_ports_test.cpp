// Ports on the real local backend: a server a sandbox runs is reached from the host through a
// socket its pid 1 connects inside (backend::async_connect_port, sandbox::async_connect_port),
// and through the handle's loopback forward (sandbox::async_port_host); moat's own ports are
// never forwarded; nothing listening is a clear refusal; a destroy ends the connections.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>

#include "core/asio_compat.hpp"
#include "support/async_wait.hpp"
#include "support/connect_retry.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <asio/connect.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <string>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

// A static file server on `port` of the sandbox, serving /workspace (hello.txt in it).
moat::exec_request http_server(std::uint16_t port, const std::string& bind = "127.0.0.1") {
    moat::exec_request request;
    request.shell =
        "cd /workspace && echo 'hello from the sandbox' > hello.txt && "
        "exec python3 -m http.server " +
        std::to_string(port) + " --bind " + bind + " >/dev/null 2>&1";
    request.wall_limit = 120s;
    return request;
}

// Sends one HTTP/1.0 GET on `socket` and reads the whole answer (the server closes after it).
asio::awaitable<std::string> get(asio::ip::tcp::socket& socket, std::string path) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: sandbox\r\n\r\n";
    co_await asio::async_write(socket, asio::buffer(request), asio::use_awaitable);
    std::string answer;
    std::array<char, 4096> buffer{};
    for (;;) {
        auto [error, n] = co_await socket.async_read_some(asio::buffer(buffer),
                                                          moat::as_tuple(asio::use_awaitable));
        answer.append(buffer.data(), n);
        if (error) break;
    }
    co_return answer;
}

using maybe_socket = std::optional<moat::result<asio::ip::tcp::socket>>;
using moat::test::optional_of;

// Connects until the server the sandbox is starting accepts (connection_refused until then).
asio::awaitable<maybe_socket> connect_when_up(moat::backend& b, std::string id,
                                              std::uint16_t port) {
    return moat::test::connect_when_up<asio::ip::tcp::socket>(
        [&b, id, port] { return b.async_connect_port(id, port); });
}

// The same through a loopback address (the handle's forward, a port-forward).
asio::awaitable<std::string> get_from(asio::ip::tcp::endpoint at, std::string path) {
    asio::ip::tcp::socket socket(co_await asio::this_coro::executor);
    co_await socket.async_connect(at, asio::use_awaitable);
    co_return co_await get(socket, std::move(path));
}

asio::ip::tcp::endpoint endpoint_of(const std::string& host_port) {
    const auto colon = host_port.rfind(':');
    return {asio::ip::make_address(host_port.substr(0, colon)),
            static_cast<std::uint16_t>(std::stoi(host_port.substr(colon + 1)))};
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a server in a sandbox is reached through its pid 1, and only on its ports" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    auto server = run(local->async_spawn(box.id, http_server(8000)));
    REQUIRE_MESSAGE(server, server.error().to_string());

    auto connected = *run(connect_when_up(*local, box.id, 8000));
    REQUIRE_MESSAGE(connected, connected.error().to_string());
    const auto answer = run(get(*connected, "/hello.txt"));
    CHECK(answer.starts_with("HTTP/1.0 200"));
    CHECK(answer.ends_with("\r\n\r\nhello from the sandbox\n"));

    // Nothing listens: a refusal that names the port, and the sandbox is fine.
    auto nothing = *run(optional_of(local->async_connect_port(box.id, 8001)));
    REQUIRE_FALSE(nothing);
    CHECK(nothing.error().code == moat::errc::connection_refused);
    CHECK(nothing.error().code == moat::condition::retryable);
    CHECK(nothing.error().detail.find("port 8001") != std::string::npos);
    // moat's own port in the sandbox (the egress proxy's) is never forwarded, and port 0 is no
    // port.
    auto proxy =
        *run(optional_of(local->async_connect_port(box.id, moat::sandbox_network::proxy_port)));
    REQUIRE_FALSE(proxy);
    CHECK(proxy.error().code == moat::errc::permission_denied);
    CHECK(proxy.error().detail.find("3128") != std::string::npos);
    auto zero = *run(optional_of(local->async_connect_port(box.id, 0)));
    REQUIRE_FALSE(zero);
    CHECK(zero.error().code == moat::errc::invalid_argument);
    auto unknown = *run(optional_of(local->async_connect_port("sb-00000000000000000000", 8000)));
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == moat::errc::sandbox_not_found);

    // The sandbox still has no way out: its network namespace is loopback only.
    CHECK(sh(box.id, "cat /proc/net/route | wc -l").out.text() == "1\n");
    CHECK(sh(box.id, "echo ok").exit_code == 0);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "a server bound to the sandbox's ::1 only is reached too" *
                                     moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const auto probe = sh(box.id,
                          "python3 -c \"import socket; "
                          "socket.socket(socket.AF_INET6).bind(('::1', 0))\" && echo v6");
    if (probe.out.text() != "v6\n") {
        MESSAGE("SKIPPED: the sandbox's loopback has no ::1 on this host: " << probe.err.text());
        destroy(box.id);
        return;
    }
    auto server = run(local->async_spawn(box.id, http_server(8080, "::1")));
    REQUIRE_MESSAGE(server, server.error().to_string());
    auto connected = *run(connect_when_up(*local, box.id, 8080));
    REQUIRE_MESSAGE(connected, connected.error().to_string());
    CHECK(connected->remote_endpoint().address().is_v6());
    CHECK(run(get(*connected, "/hello.txt")).ends_with("hello from the sandbox\n"));
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "destroying a sandbox ends the connections to its ports" *
                                     moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // An echo server that keeps every connection open until the client closes it.
    moat::exec_request echo;
    echo.shell =
        "exec python3 -c \"import socketserver\n"
        "class Echo(socketserver.StreamRequestHandler):\n"
        "    def handle(self):\n"
        "        for line in self.rfile: self.wfile.write(line)\n"
        "socketserver.ThreadingTCPServer(('127.0.0.1', 7000), Echo).serve_forever()\"";
    auto server = run(local->async_spawn(box.id, echo));
    REQUIRE_MESSAGE(server, server.error().to_string());
    auto first = *run(connect_when_up(*local, box.id, 7000));
    REQUIRE_MESSAGE(first, first.error().to_string());
    auto second = *run(optional_of(local->async_connect_port(box.id, 7000)));
    REQUIRE_MESSAGE(second, second.error().to_string());
    auto echo_line = [&](asio::ip::tcp::socket& s,
                         std::string line) -> asio::awaitable<std::string> {
        co_await asio::async_write(s, asio::buffer(line), asio::use_awaitable);
        std::string got(line.size(), '\0');
        co_await asio::async_read(s, asio::buffer(got), asio::use_awaitable);
        co_return got;
    };
    CHECK(run(echo_line(*first, "one\n")) == "one\n");
    CHECK(run(echo_line(*second, "two\n")) == "two\n");

    destroy(box.id);
    // Both connections end: their server died with the sandbox (EOF or a reset, never a hang).
    for (auto* socket : {&*first, &*second}) {
        std::array<char, 16> buffer{};
        auto ended =
            run(socket->async_read_some(asio::buffer(buffer), moat::as_tuple(asio::use_awaitable)),
                20s);
        CHECK(std::get<0>(ended));
    }
    auto after = *run(optional_of(local->async_connect_port(box.id, 7000)));
    REQUIRE_FALSE(after);
}

TEST_CASE_FIXTURE(local_fixture,
                  "the handle's port host is a loopback forward that ends with the handle" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto created = run(rt.async_create({}));
    REQUIRE_MESSAGE(created, created.error().to_string());
    auto box = *created;
    auto server = run(box->async_spawn(http_server(8000)));
    REQUIRE_MESSAGE(server, server.error().to_string());

    // Through the handle: the side lane, so a long command in the ordered lane does not hold
    // a connection back.
    auto long_command = std::make_shared<std::optional<moat::result<moat::exec_result>>>();
    tasks.spawn([](std::shared_ptr<moat::sandbox> b,
                   std::shared_ptr<std::optional<moat::result<moat::exec_result>>> out)
                    -> asio::awaitable<void> {
        out->emplace(co_await b->async_exec(moat::test::shell("sleep 3")));
    }(box, long_command));
    const auto limit = std::chrono::steady_clock::now() + 20s;
    moat::result<asio::ip::tcp::socket> direct =
        moat::make_error(moat::errc::connection_refused, "");
    while (!direct && direct.error().code == moat::errc::connection_refused &&
           std::chrono::steady_clock::now() < limit) {
        direct = *run(optional_of(box->async_connect_port(8000)));
        if (!direct) run(moat::test::pause(50ms));
    }
    REQUIRE_MESSAGE(direct, direct.error().to_string());
    CHECK_FALSE(long_command->has_value());  // answered while the ordered lane was busy
    CHECK(run(get(*direct, "/hello.txt")).ends_with("hello from the sandbox\n"));

    auto host = run(box->async_port_host(8000));
    REQUIRE_MESSAGE(host, host.error().to_string());
    CHECK(host->starts_with("127.0.0.1:"));
    auto again = run(box->async_port_host(8000));
    REQUIRE(again);
    CHECK(*again == *host);  // one forward per port
    // Two connections at once through the forward.
    const auto at = endpoint_of(*host);
    asio::ip::tcp::socket a(io), b(io);
    a.connect(at);
    b.connect(at);
    auto both = [](asio::ip::tcp::socket& x, asio::ip::tcp::socket& y) -> asio::awaitable<bool> {
        const auto one = co_await get(x, "/hello.txt");
        const auto two = co_await get(y, "/hello.txt");
        co_return one.ends_with("hello from the sandbox\n") &&
            two.ends_with("hello from the sandbox\n");
    };
    CHECK(run(both(a, b)));
    // A port nothing listens on: the forward opens, and a connection to it ends at once.
    auto closed_port = run(box->async_port_host(8999));
    REQUIRE(closed_port);
    CHECK(run(get_from(endpoint_of(*closed_port), "/")).empty());

    REQUIRE(run(box->async_destroy()));
    // The forward ended with the handle: nothing listens on its port any more.
    asio::ip::tcp::socket late(io);
    std::error_code refused;
    late.connect(at, refused);
    CHECK(refused);
    auto after = run(box->async_port_host(8000));
    REQUIRE_FALSE(after);
    CHECK(after.error().code == moat::errc::sandbox_unavailable);
}
