#include "serve/port_proxy.hpp"

#include <moat/log.hpp>

#include "core/json_writer.hpp"
#include "e2b_protocol/code_interpreter_messages.hpp"
#include "http/stream_relay.hpp"
#include "serve/code_interpreter.hpp"
#include "serve/envd_server.hpp"
#include "serve/sandbox_names.hpp"
#include "serve/sandbox_pause.hpp"
#include "serve/server_secret.hpp"

#include <asio/experimental/awaitable_operators.hpp>

#include <array>
#include <map>
#include <memory>
#include <string>

namespace moat::serve {
namespace {

// How long the sandbox's pid 1 may take to connect (it answers at once unless the server's
// accept backlog is full).
constexpr auto port_connect_timeout = std::chrono::seconds(10);

struct proxy_state {
    explicit proxy_state(serve_context& c) : context(c), interpreter(c) {}
    serve_context& context;
    // Port 49999: E2B's Code Interpreter, answered by serve itself.
    code_interpreter interpreter;
    std::map<std::string, std::size_t, std::less<>> open;  // proxied connections per sandbox
};

// One proxied connection's place in its sandbox's count, given back however the proxy ends.
class open_slot {
  public:
    open_slot(std::shared_ptr<proxy_state> s, std::string id)
        : s_(std::move(s)), id_(std::move(id)) {
        ++s_->open[id_];
    }
    ~open_slot() {
        auto it = s_->open.find(id_);
        if (it != s_->open.end() && --it->second == 0) s_->open.erase(it);
    }
    open_slot(const open_slot&) = delete;
    open_slot& operator=(const open_slot&) = delete;

  private:
    std::shared_ptr<proxy_state> s_;
    std::string id_;
};

asio::awaitable<void> send_json_error(http::server_response& response, int status,
                                      std::string_view message, std::string_view id = {},
                                      std::uint16_t port = 0) {
    json_writer w;
    w.begin_object();
    if (!id.empty()) w.key("sandboxId").value(id);
    w.key("message").value(message);
    if (port != 0) w.key("port").value(static_cast<std::int64_t>(port));
    w.key("code").value(static_cast<std::int64_t>(status));
    w.end_object();
    http::header_list headers;
    headers.add("Content-Type", "application/json; charset=utf-8");
    (void)co_await response.async_send(status, std::move(headers), w.take());
}

// The head the sandbox's server gets: the client's, without moat's credentials, one request
// per connection (an upgrade keeps its own Connection), with the sandbox's Host mask applied.
std::string upstream_head(const http::request_head& client, std::string_view mask,
                          std::uint16_t port) {
    http::request_head head = client;
    head.headers.remove("X-Access-Token");
    head.headers.remove("E2B-Traffic-Access-Token");
    if (!mask.empty()) {
        std::string host(mask);
        const std::string port_text = std::to_string(port);
        for (auto at = host.find("${PORT}"); at != std::string::npos;
             at = host.find("${PORT}", at + port_text.size())) {
            host.replace(at, 7, port_text);
        }
        head.headers.remove("Host");
        head.headers.add("Host", std::move(host));
    }
    const bool upgrade =
        head.headers.contains("Upgrade") && head.headers.has_token("Connection", "upgrade");
    if (!upgrade) {
        head.headers.remove("Keep-Alive");
        head.headers.set("Connection", "close");
    }
    std::string bytes;
    (void)http::append_request_head(bytes, head);  // a parsed head always writes
    return bytes;
}

// Returns once the sandbox ends (its destroy started, or it was found past its end); the relay
// beside it is cancelled then, closing both sides.
asio::awaitable<void> wait_for_end(std::shared_ptr<registry_entry> entry) {
    while (!entry->ended.is_set()) {
        const auto outcome = co_await entry->ended.async_wait(deadline::never());
        if (outcome == async_event::wait_outcome::cancelled) co_return;
    }
}

asio::awaitable<void> relay_until_end(http::stream& client, http::stream& sandbox,
                                      http::relay_options options, std::string_view read_ahead,
                                      std::shared_ptr<registry_entry> entry) {
    using namespace asio::experimental::awaitable_operators;
    auto relayed = http::async_relay(client, sandbox, options, read_ahead);
    auto ended = wait_for_end(std::move(entry));
    auto either = std::move(relayed) || std::move(ended);
    (void)co_await std::move(either);
    client.close();
    sandbox.close();
}

asio::awaitable<void> proxy(std::shared_ptr<proxy_state> s, http::server_request& request,
                            http::server_response& response) {
    auto& context = s->context;
    const auto named = requested_port(request.head(), context.options.domain);
    if (!named || named->port == 0) {
        co_await send_json_error(response, 400, "E2b-Sandbox-Port is not a port (1-65535)");
        co_return;
    }
    if (named->id.empty()) {
        co_await send_json_error(response, 400, "the request names no sandbox (E2b-Sandbox-Id)");
        co_return;
    }
    const std::string id(named->id);
    const std::uint16_t port = named->port;
    auto entry = context.registry.find(id);
    if (!entry || entry->ended.is_set() || refuses_traffic(*entry)) {
        co_await send_sandbox_not_found(response, id);
        co_return;
    }
    if (entry->private_ports) {
        const auto token = request.headers().find("E2B-Traffic-Access-Token");
        if (!token || !constant_time_equals(*token, entry->traffic_token)) {
            co_await send_json_error(response, 403,
                                     "this sandbox's ports are private: send its "
                                     "trafficAccessToken in E2B-Traffic-Access-Token",
                                     id, port);
            co_return;
        }
    }
    // Paused with autoResume: resumed first (sandbox_pause.hpp).
    auto woke = co_await wake_for_traffic(context, entry);
    if (!woke) {
        co_await send_not_woken(response, id, woke.error());
        co_return;
    }
    if (port == e2b_protocol::code_interpreter_port) {
        co_await s->interpreter.async_serve(std::move(entry), request, response);
        co_return;
    }
    if (port == sandbox_network::proxy_port) {
        co_await send_json_error(response, 403,
                                 "port 3128 is moat's egress proxy inside the sandbox; it is "
                                 "never forwarded",
                                 id, port);
        co_return;
    }
    const std::size_t cap = context.options.max_port_connections;
    if (const auto it = s->open.find(id); it != s->open.end() && it->second >= cap) {
        co_await send_json_error(response, 429,
                                 "this sandbox has " + std::to_string(it->second) +
                                     " proxied connections open, its limit",
                                 id, port);
        co_return;
    }
    // A live sandbox of this server (and its token, where private): its port traffic counts
    // against the server's connections and its sandbox's share, not the unauthenticated one
    // (which the SDKs' own envd connections need).
    request.mark_authenticated();
    open_slot slot(s, id);
    auto connected =
        co_await entry->handle->async_connect_port(port, deadline::after(port_connect_timeout));
    if (!connected) {
        const auto& failure = connected.error();
        if (failure.code == errc::connection_refused) {
            co_await send_json_error(response, 502, "The sandbox is running but port is not open",
                                     id, port);
        } else if (failure.code == errc::sandbox_unavailable ||
                   failure.code == errc::sandbox_not_found) {
            co_await send_sandbox_not_found(response, id);
        } else {
            detail::log(log_level::warning, "serve",
                        "port " + std::to_string(port) + ": " + failure.to_string(), id);
            co_await send_json_error(
                response, 502,
                "cannot reach port " + std::to_string(port) + " (" + failure.code.message() + ")",
                id, port);
        }
        co_return;
    }
    const std::string head = upstream_head(request.head(), entry->mask_request_host, port);
    auto taken = request.take_over();
    if (!taken) co_return;  // only before the body was read or an answer started: not here
    auto upstream = http::make_tcp_stream(std::move(*connected));
    const std::array<asio::const_buffer, 1> pieces{asio::buffer(head)};
    auto [error, written] = co_await upstream->async_write(pieces);
    if (error) {
        upstream->close();
        co_return;
    }
    http::relay_options options;
    options.idle_timeout = context.options.port_idle_timeout;
    co_await relay_until_end(*taken->connection, *upstream, options, taken->read_ahead, entry);
}

}  // namespace

void add_port_proxy(http::server& server, serve_context& context) {
    auto s = std::make_shared<proxy_state>(context);
    std::string domain = context.options.domain;
    server.intercept(
        [domain](const http::request_head& head) {
            return requested_port(head, domain).has_value();
        },
        [s](http::server_request& request, http::server_response& response) {
            return proxy(s, request, response);
        });
}

}  // namespace moat::serve
