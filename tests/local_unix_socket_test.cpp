// Unix-domain sockets in a local sandbox: a server listening on a path in the sandbox is reached
// from the host through a stream its pid 1 connects inside and hands out
// (backend::async_connect_unix, sandbox::async_connect_unix); a bad path is refused before the
// sandbox is asked, nothing listening is a clear refusal, and neither quarantines the handle.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>

#include "core/asio_compat.hpp"
#include "support/async_wait.hpp"
#include "support/connect_retry.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <asio/read.hpp>
#include <asio/write.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

using unix_socket = asio::local::stream_protocol::socket;

// An echo server on the unix socket `path`: every connection gets its bytes back, and when one
// reaches EOF the server creates `path`.eof<n> (n counts connections from 1).
moat::exec_request echo_server(const std::string& path) {
    moat::exec_request request;
    request.shell =
        "exec python3 -c \"\n"
        "import socket, threading\n"
        "path = '" +
        path +
        "'\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.bind(path)\n"
        "s.listen(8)\n"
        "def serve(c, n):\n"
        "    while True:\n"
        "        data = c.recv(4096)\n"
        "        if not data: break\n"
        "        c.sendall(data)\n"
        "    open(path + '.eof' + str(n), 'w').close()\n"
        "    c.close()\n"
        "n = 0\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    n += 1\n"
        "    threading.Thread(target=serve, args=(c, n), daemon=True).start()\n"
        "\"";
    request.wall_limit = 120s;
    return request;
}

using maybe_socket = std::optional<moat::result<unix_socket>>;
using moat::test::optional_of;

// Connects until the server the sandbox is starting listens (connection_refused until then).
asio::awaitable<maybe_socket> connect_when_up(moat::backend& b, std::string id, std::string path) {
    return moat::test::connect_when_up<unix_socket>(
        [&b, id, path] { return b.async_connect_unix(id, path); });
}

asio::awaitable<std::string> echo(unix_socket& s, std::string line) {
    co_await asio::async_write(s, asio::buffer(line), asio::use_awaitable);
    std::string got(line.size(), '\0');
    co_await asio::async_read(s, asio::buffer(got), asio::use_awaitable);
    co_return got;
}

// The invalid paths: each is refused before any message goes to the sandbox.
std::vector<std::string> invalid_paths() {
    return {"relative/echo.sock", "", std::string("/tmp/a\0b", 8), "/" + std::string(107, 'x')};
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture, "a unix socket server in a sandbox is reached through its pid 1" *
                                     moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    auto server = run(local->async_spawn(box.id, echo_server("/workspace/echo.sock")));
    REQUIRE_MESSAGE(server, server.error().to_string());

    auto connected = *run(connect_when_up(*local, box.id, "/workspace/echo.sock"));
    REQUIRE_MESSAGE(connected, connected.error().to_string());
    CHECK(run(echo(*connected, "one\n")) == "one\n");
    CHECK(run(echo(*connected, std::string(100'000, 'z'))) == std::string(100'000, 'z'));
    // Closing our end is an EOF for the server.
    connected->close();
    bool seen = false;
    for (int i = 0; i < 200 && !seen; ++i) {
        seen = sh(box.id, "test -e /workspace/echo.sock.eof1").exit_code == 0;
        if (!seen) run(moat::test::pause(100ms));
    }
    CHECK(seen);

    // Nothing at the path: a refusal that names the path. A regular file is no socket either.
    auto missing = *run(optional_of(local->async_connect_unix(box.id, "/tmp/nothing.sock")));
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == moat::errc::connection_refused);
    CHECK(missing.error().detail.find("/tmp/nothing.sock") != std::string::npos);
    REQUIRE(sh(box.id, "echo text > /workspace/plain").exit_code == 0);
    auto plain = *run(optional_of(local->async_connect_unix(box.id, "/workspace/plain")));
    REQUIRE_FALSE(plain);
    CHECK(plain.error().code == moat::errc::connection_refused);

    // Bad paths are refused before the sandbox is asked: even for a sandbox that does not exist.
    for (const auto& path : invalid_paths()) {
        auto refused =
            *run(optional_of(local->async_connect_unix("sb-00000000000000000000", path)));
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == moat::errc::invalid_argument);
        CHECK(refused.error().detail.size() < 400);
    }
    auto unknown = *run(
        optional_of(local->async_connect_unix("sb-00000000000000000000", "/workspace/echo.sock")));
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == moat::errc::sandbox_not_found);

    // The longest path that fits sun_path (107 bytes) is valid; nothing listens there.
    const std::string longest = "/tmp/" + std::string(102, 'y');
    auto at_limit = *run(optional_of(local->async_connect_unix(box.id, longest)));
    REQUIRE_FALSE(at_limit);
    CHECK(at_limit.error().code == moat::errc::connection_refused);

    // The server still serves, and the sandbox is fine.
    auto again = *run(optional_of(local->async_connect_unix(box.id, "/workspace/echo.sock")));
    REQUIRE_MESSAGE(again, again.error().to_string());
    CHECK(run(echo(*again, "two\n")) == "two\n");
    CHECK(sh(box.id, "echo ok").exit_code == 0);
    destroy(box.id);
}

namespace {

asio::awaitable<void> connect_into(std::shared_ptr<moat::sandbox> box, std::string path,
                                   std::shared_ptr<maybe_socket> out) {
    auto connected = co_await box->async_connect_unix(std::move(path));
    out->emplace(std::move(connected));
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a handle connects unix sockets on its side lane and is not quarantined by bad "
                  "paths" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto created = run(rt.async_create({}));
    REQUIRE_MESSAGE(created, created.error().to_string());
    auto box = *created;
    auto server = run(box->async_spawn(echo_server("/tmp/echo.sock")));
    REQUIRE_MESSAGE(server, server.error().to_string());
    auto first = *run(connect_when_up(*local, box->id(), "/tmp/echo.sock"));
    REQUIRE_MESSAGE(first, first.error().to_string());

    // A command holds the ordered lane: a connect is not held behind it.
    auto long_command = std::make_shared<std::optional<moat::result<moat::exec_result>>>();
    tasks.spawn(moat::test::exec_into(box, "sleep 3", long_command));
    run(moat::test::pause(200ms));
    // Two connects at once.
    auto one = std::make_shared<maybe_socket>();
    auto two = std::make_shared<maybe_socket>();
    tasks.spawn(connect_into(box, "/tmp/echo.sock", one));
    tasks.spawn(connect_into(box, "/tmp/echo.sock", two));
    const auto both =
        run(moat::test::until([&] { return one->has_value() && two->has_value(); }, 20s));
    REQUIRE(both);
    CHECK_FALSE(long_command->has_value());  // answered while the ordered lane was busy
    REQUIRE_MESSAGE(**one, (*one)->error().to_string());
    REQUIRE_MESSAGE(**two, (*two)->error().to_string());
    CHECK(run(echo(***one, "a\n")) == "a\n");
    CHECK(run(echo(***two, "b\n")) == "b\n");
    CHECK(run(echo(*first, "c\n")) == "c\n");

    // Refusals and bad paths leave the handle vouching for its sandbox.
    for (const auto& path : invalid_paths()) {
        auto refused = *run(optional_of(box->async_connect_unix(path)));
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == moat::errc::invalid_argument);
    }
    auto missing = *run(optional_of(box->async_connect_unix("/tmp/missing.sock")));
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == moat::errc::connection_refused);
    CHECK_FALSE(box->quarantine_cause().has_value());
    auto after = run(box->async_exec(moat::test::shell("echo fine")));
    REQUIRE_MESSAGE(after, after.error().to_string());
    CHECK(after->out.text() == "fine\n");
    REQUIRE(run(moat::test::until([&] { return long_command->has_value(); }, 20s)));
    REQUIRE(run(box->async_destroy()));
}
