// moat port-forward ID [LOCAL_ADDR:]LOCAL_PORT:PORT...: local listeners whose every connection is
// relayed to a port inside an existing sandbox (attached by id), like kubectl port-forward. One
// port_forwarder per mapping (handle/port_forwarder.hpp) with the handle's async_connect_port as
// its connector. Runs until SIGINT/SIGTERM/SIGHUP (exit 0) or until the sandbox ends (exit 1,
// every connection closed); a refused connection is one line on stderr, never its bytes.
#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "core/asio_compat.hpp"
#include "handle/port_forwarder.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moat::cli {
namespace {

using namespace std::chrono_literals;

constexpr std::string_view synopsis = "moat port-forward ID [LOCAL_ADDR:]LOCAL_PORT:PORT...";
// How often the sandbox is inspected, to end the forward when it ends.
constexpr auto poll_interval = 1s;
// How long one connection may take to reach the sandbox's port.
constexpr auto connect_limit = 10s;

struct port_mapping {
    asio::ip::address local_address = asio::ip::make_address_v4("127.0.0.1");
    std::uint16_t local_port = 0;
    std::uint16_t port = 0;
};

struct port_forward_options {
    std::string id;
    std::vector<port_mapping> mappings;
};

std::uint16_t parse_port(std::string_view text, std::string_view mapping, std::uint64_t min,
                         std::string_view what) {
    const auto n = parse_unsigned(text);
    if (!n || *n < min || *n > 65535) {
        throw usage_error(std::string(what) + " '" + std::string(text) + "' in '" +
                          std::string(mapping) + "' is out of range (" + std::to_string(min) +
                          "-65535)");
    }
    return static_cast<std::uint16_t>(*n);
}

// PORT, LOCAL_PORT:PORT, :PORT (any free local port), ADDR:LOCAL_PORT:PORT, [IPV6]:LOCAL_PORT:PORT.
port_mapping parse_mapping(std::string_view text) {
    port_mapping m;
    std::string_view rest = text;
    std::string address;
    bool has_address = false;
    if (rest.starts_with("[")) {
        const auto close = rest.find(']');
        if (close == std::string_view::npos || rest.substr(close + 1).find(':') != 0) {
            throw usage_error("bad address in '" + std::string(text) +
                              "': expected [IPV6]:LOCAL_PORT:PORT");
        }
        address = std::string(rest.substr(1, close - 1));
        has_address = true;
        rest.remove_prefix(close + 2);
        if (rest.find(':') == std::string_view::npos) {
            throw usage_error("missing LOCAL_PORT in '" + std::string(text) +
                              "': expected [IPV6]:LOCAL_PORT:PORT");
        }
    } else if (std::count(rest.begin(), rest.end(), ':') == 2) {
        const auto colon = rest.find(':');
        address = std::string(rest.substr(0, colon));
        has_address = true;
        rest.remove_prefix(colon + 1);
    } else if (std::count(rest.begin(), rest.end(), ':') > 2) {
        throw usage_error("bad mapping '" + std::string(text) +
                          "': an IPv6 address goes in brackets, [::1]:LOCAL_PORT:PORT");
    }
    if (has_address) {
        std::error_code bad;
        m.local_address = address == "localhost" ? asio::ip::make_address_v4("127.0.0.1")
                                                 : asio::ip::make_address(address, bad);
        if (bad || address.empty()) {
            throw usage_error("bad address '" + address + "' in '" + std::string(text) +
                              "': expected an IP address or localhost");
        }
    }
    const auto colon = rest.find(':');
    if (colon == std::string_view::npos) {
        m.port = parse_port(rest, text, 1, "PORT");
        m.local_port = m.port;
    } else {
        const auto local = rest.substr(0, colon);
        m.local_port = local.empty() ? 0 : parse_port(local, text, 0, "LOCAL_PORT");
        m.port = parse_port(rest.substr(colon + 1), text, 1, "PORT");
    }
    if (m.port == sandbox_network::proxy_port) {
        throw usage_error("PORT " + std::to_string(m.port) + " in '" + std::string(text) +
                          "' is moat's egress proxy inside the sandbox; it is never forwarded");
    }
    return m;
}

port_forward_options parse_port_forward_options(int argc, char** argv) {
    port_forward_options o;
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.starts_with("-")) throw usage_error("unknown option '" + std::string(arg) + "'");
        if (o.id.empty()) {
            o.id = arg;
        } else {
            o.mappings.push_back(parse_mapping(arg));
        }
    }
    if (o.id.empty()) throw usage_error("missing sandbox id (" + std::string(synopsis) + ")");
    if (o.mappings.empty()) {
        throw usage_error("missing a port mapping after " + o.id + " (" + std::string(synopsis) +
                          ")");
    }
    return o;
}

std::string endpoint_text(const asio::ip::tcp::endpoint& e) {
    if (e.address().is_v6()) {
        return "[" + e.address().to_string() + "]:" + std::to_string(e.port());
    }
    return e.address().to_string() + ":" + std::to_string(e.port());
}

asio::awaitable<result<asio::ip::tcp::socket>> connect_through(std::weak_ptr<sandbox> weak,
                                                               std::uint16_t port) {
    auto box = weak.lock();
    if (!box) co_return make_error(errc::sandbox_unavailable, "the forward has ended");
    co_return co_await box->async_connect_port(port, deadline::after(connect_limit), lane::side);
}

void report_event(std::uint16_t port, const port_forward_event& e) {
    using kind = port_forward_event::kind;
    if (e.what != kind::refused && e.what != kind::over_cap) return;
    const char* why = e.what == kind::refused ? "refused" : "closed (too many connections)";
    std::fprintf(stderr, "moat port-forward: connection from %s to port %u %s: %s\n",
                 e.peer.c_str(), static_cast<unsigned>(port), why, e.detail.c_str());
}

// Why the forward should end, or "" while the sandbox runs.
asio::awaitable<std::string> sandbox_end(backend& b, const sandbox& box) {
    if (const auto& cause = box.quarantine_cause()) {
        co_return "the sandbox can no longer be reached: " + cause->to_string();
    }
    auto inspected = co_await b.async_inspect(box.id());
    if (!inspected) {
        const auto code = inspected.error().code;
        if (code == errc::sandbox_not_found || code == errc::sandbox_unavailable) {
            co_return "the sandbox has ended: " + inspected.error().to_string();
        }
        co_return "";  // a passing failure: ask again at the next poll
    }
    if (inspected->state == sandbox_state::exited) co_return "the sandbox has ended (exited)";
    co_return "";
}

std::size_t open_connections(const std::vector<std::unique_ptr<port_forwarder>>& forwarders) {
    std::size_t open = 0;
    for (const auto& f : forwarders) open += f->open_connections();
    return open;
}

asio::awaitable<int> forward_ports(backend& b, port_forward_options o) {
    runtime sandboxes(b);
    auto attached = co_await sandboxes.async_attach(o.id);
    if (!attached) {
        if (attached.error().code == errc::cancelled) co_return 0;  // a signal while attaching
        co_return report_error("port-forward", attached.error());
    }
    std::shared_ptr<sandbox> box = std::move(*attached);
    const auto executor = co_await asio::this_coro::executor;
    std::vector<std::unique_ptr<port_forwarder>> forwarders;
    int code = 0;
    for (const auto& m : o.mappings) {
        std::weak_ptr<sandbox> weak = box;
        const std::uint16_t port = m.port;
        port_forwarder::connector connect = [weak, port] { return connect_through(weak, port); };
        port_forwarder::event_sink sink = [port](const port_forward_event& e) {
            report_event(port, e);
        };
        auto started = port_forwarder::start(executor, {m.local_address, m.local_port},
                                             std::move(connect), {}, std::move(sink));
        if (!started) {
            code = report_error("port-forward", started.error());
            break;
        }
        const std::string line = "forwarding " + endpoint_text((*started)->local_endpoint()) +
                                 " -> " + o.id + ":" + std::to_string(port) + "\n";
        write_all(STDOUT_FILENO, line);  // unbuffered: a script reads it at once
        forwarders.push_back(std::move(*started));
    }
    while (code == 0) {
        asio::steady_timer tick(executor, poll_interval);
        auto [waited] = co_await tick.async_wait(as_tuple(asio::use_awaitable));
        if (waited) break;  // a signal: the forward ends, successfully
        const std::string ended = co_await sandbox_end(b, *box);
        const auto state = co_await asio::this_coro::cancellation_state;
        if (state.cancelled() != asio::cancellation_type::none) break;
        if (!ended.empty()) {
            std::fprintf(stderr, "moat port-forward: %s; closing %zu connection(s)\n",
                         ended.c_str(), open_connections(forwarders));
            code = 1;
        }
    }
    // End every connection, and let those still being set up see it before the handle and the
    // runtime go away.
    co_await asio::this_coro::reset_cancellation_state();
    for (const auto& f : forwarders) f->close();
    for (const auto& f : forwarders) co_await f->async_close();
    co_return code;
}

}  // namespace

int port_forward_command(int argc, char** argv) {
    port_forward_options options = parse_port_forward_options(argc, argv);
    return run_with_backend(
        [&options](backend& b) { return forward_ports(b, std::move(options)); });
}

}  // namespace moat::cli
