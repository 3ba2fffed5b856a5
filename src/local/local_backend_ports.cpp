// Ports of the local backend's sandboxes (local_backend_impl.hpp is the contract between its
// files): a connection to a server inside a sandbox, on a port or a unix-domain socket. The
// sandbox's pid 1 connects on its own loopback (or to the socket's path) and hands the socket
// out (the egress endpoint in reverse), so the sandbox keeps its loopback-only network namespace
// and never gets a route.
#include "local/local_backend_impl.hpp"

#include "core/asio_compat.hpp"
#include "core/exception_boundary.hpp"
#include "local/agent_channel.hpp"
#include "wire/protocol.hpp"

#include <moat/with_timeout.hpp>

#include <asio/use_awaitable.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string_view>

namespace moat {
namespace {

// The agent answers at once; a connect still under way (the server's accept backlog is full)
// gets the rest of this to complete.
constexpr auto connect_timeout = std::chrono::seconds(10);

// Waits until a socket whose connect was under way is writable, then reads how it ended.
asio::awaitable<result<int>> wait_connected(std::shared_ptr<asio::ip::tcp::socket> socket) {
    auto [waited] = co_await socket->async_wait(asio::ip::tcp::socket::wait_write,
                                                as_tuple(asio::use_awaitable));
    if (waited == asio::error::operation_aborted) {
        co_return make_error(errc::cancelled, "cancelled while connecting");
    }
    if (waited) {
        co_return make_error(errc::connection_refused, "waiting to connect: " + waited.message());
    }
    int connect_errno = 0;
    socklen_t length = sizeof connect_errno;
    if (::getsockopt(socket->native_handle(), SOL_SOCKET, SO_ERROR, &connect_errno, &length) != 0) {
        connect_errno = errno;
    }
    co_return connect_errno;
}

// The agent's errno for a connection it could not make (`what`: "connecting to ... in sandbox
// ..."), other than a refusal; `denied` says why EPERM/EACCES. Whatever the kernel says about a
// connect is about the sandbox's server, never a reason to stop vouching for the sandbox: nothing
// here is backend_failure (which would quarantine the handle).
error connect_error(const std::string& what, int connect_errno, std::string_view denied) {
    switch (connect_errno) {
        case EPERM:
        case EACCES:
            return make_error(errc::permission_denied, what + ": " + std::string(denied));
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case ENOMEM:
            return make_error(errc::limit_exceeded, what + ": out of descriptors or memory (" +
                                                        std::strerror(connect_errno) + ")");
        default:
            return make_error(errc::connection_refused, what + ": " + std::strerror(connect_errno));
    }
}

// What a port's connect errors start with; why the agent refuses a port (EPERM).
std::string port_target(const std::string& id, std::uint16_t port) {
    return "connecting to port " + std::to_string(port) + " in sandbox " + id;
}

constexpr std::string_view port_denied = "the sandbox's agent refused (a port moat itself uses)";

// The descriptor the agent handed out, as a socket on `executor` (taken from `fd` on success).
template <class Protocol>
result<typename Protocol::socket> adopt(const asio::any_io_executor& executor,
                                        const Protocol& protocol, unique_fd& fd,
                                        const std::string& what) {
    typename Protocol::socket socket(executor);
    std::error_code assigned;
    socket.assign(protocol, fd.get(), assigned);
    if (assigned) return make_error(errc::limit_exceeded, what + ": " + assigned.message());
    fd.release();  // the socket owns it now
    return socket;
}

// At most ~200 bytes of a caller's path, control bytes (a NUL) shown as '?', for a detail.
std::string shown_path(std::string_view path) {
    constexpr std::size_t shown_bytes = 200;
    std::string out(path.substr(0, shown_bytes));
    for (auto& c : out) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    if (path.size() > shown_bytes) out += "...";
    return out;
}

// A refusal on one loopback address: try the other (a server bound to ::1 only, or 127.0.0.1
// only). IPv6 may be missing in the namespace altogether.
bool refused(int connect_errno) {
    return connect_errno == ECONNREFUSED || connect_errno == EADDRNOTAVAIL ||
           connect_errno == ENETUNREACH || connect_errno == EAFNOSUPPORT;
}

}  // namespace

asio::awaitable<result<asio::ip::tcp::socket>> local_backend::async_connect_port(
    std::string id, std::uint16_t port) {
    return guarded(connect_port(std::move(id), port));
}

asio::awaitable<result<asio::ip::tcp::socket>> local_backend::connect_port(std::string id,
                                                                           std::uint16_t port) {
    if (port == 0) co_return make_error(errc::invalid_argument, "port 0: a port is 1-65535");
    if (port == sandbox_network::proxy_port) {
        co_return make_error(
            errc::permission_denied,
            "port " + std::to_string(port) +
                " is moat's egress proxy inside the sandbox; it is never forwarded");
    }
    auto found = find_running(id);
    if (!found) co_return std::move(found).error();
    auto agent = (*found)->agent;  // the sandbox may end while we wait
    const auto limit = deadline::after(connect_timeout);
    for (const int family : {4, 6}) {
        auto answer = co_await agent->async_connect_port(port, family, limit);
        if (!answer) co_return std::move(answer).error();
        if (refused(answer->connect_errno)) continue;
        if (answer->connect_errno != 0) {
            co_return connect_error(port_target(id, port), answer->connect_errno, port_denied);
        }
        const auto protocol = family == 4 ? asio::ip::tcp::v4() : asio::ip::tcp::v6();
        auto adopted = adopt(executor_, protocol, answer->socket, port_target(id, port));
        if (!adopted) co_return std::move(adopted).error();
        auto socket = std::make_shared<asio::ip::tcp::socket>(std::move(*adopted));
        if (answer->in_progress) {
            auto connected = co_await with_timeout(wait_connected(socket), limit);
            if (!connected) co_return std::move(connected).error();
            if (refused(*connected)) continue;
            if (*connected != 0) {
                co_return connect_error(port_target(id, port), *connected, port_denied);
            }
        }
        // Interactive traffic (a terminal, a page's small requests) is not held back for
        // coalescing; a bulk transfer fills segments anyway.
        std::error_code ignored;
        socket->set_option(asio::ip::tcp::no_delay(true), ignored);
        co_return std::move(*socket);
    }
    co_return make_error(errc::connection_refused,
                         "nothing listens on port " + std::to_string(port) + " in sandbox " + id +
                             " (127.0.0.1 and ::1 refused the connection)");
}

asio::awaitable<result<asio::local::stream_protocol::socket>> local_backend::async_connect_unix(
    std::string id, std::string path) {
    return guarded(connect_unix(std::move(id), std::move(path)));
}

asio::awaitable<result<asio::local::stream_protocol::socket>> local_backend::connect_unix(
    std::string id, std::string path) {
    if (const char* problem = wire::unix_path_problem(path)) {
        co_return make_error(errc::invalid_argument,
                             "unix socket path \"" + shown_path(path) + "\": " + problem);
    }
    auto found = find_running(id);
    if (!found) co_return std::move(found).error();
    auto agent = (*found)->agent;  // the sandbox may end while we wait
    const std::string what = "connecting to unix socket " + path + " in sandbox " + id;
    const auto limit = deadline::after(connect_timeout);
    auto answer = co_await agent->async_connect_unix(path, limit);
    if (!answer) co_return std::move(answer).error();
    if (answer->connect_errno != 0) {
        co_return connect_error(what, answer->connect_errno, std::strerror(answer->connect_errno));
    }
    co_return adopt(executor_, asio::local::stream_protocol(), answer->socket, what);
}

}  // namespace moat
