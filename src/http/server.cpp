#include "http/server.hpp"

#include "core/asio_compat.hpp"
#include "http/server_connection.hpp"
#include "http/server_state.hpp"

#include <moat/log.hpp>

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <string_view>

namespace moat::http {

namespace {

using clock = std::chrono::steady_clock;

constexpr std::string_view over_cap_reply =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
    "Content-Length: 50\r\nConnection: close\r\n\r\n"
    R"({"code":503,"message":"too many open connections"})";

// Past the connection cap: a best-effort 503 written without waiting, then close.
void refuse(asio::ip::tcp::socket& socket) {
    std::error_code ignored;
    socket.non_blocking(true, ignored);
    socket.write_some(asio::buffer(over_cap_reply), ignored);
    socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
}

bool is_system_cancellation(const std::system_error& e) {
    return e.code() == asio::error::operation_aborted;
}

// Counts a connection from its accept to its end (the caps cover the TLS handshake too).
struct open_connection {
    std::shared_ptr<server::state> state;
    server::state::admitted record;
    open_connection(std::shared_ptr<server::state> s, asio::ip::address peer)
        : state(std::move(s)) {
        record.peer = peer;
        ++state->open_connections;
        ++state->unauthenticated;
        ++state->unauthenticated_by_peer[peer];
        record.position = state->admissions.insert(state->admissions.end(), &record);
    }
    ~open_connection() {
        state->forget_unauthenticated(record);
        if (record.evicted) --state->evicting;
        state->admissions.erase(record.position);
        --state->open_connections;
        if (state->stopping && state->open_connections == 0) state->drained.cancel();
    }
    open_connection(const open_connection&) = delete;
    open_connection& operator=(const open_connection&) = delete;
};

// Whether `a` may be closed to make room: unauthenticated, past its setup, between requests,
// and nothing of its next request waits unread.
bool is_evictable(const server::state::admitted& a) {
    return !a.authenticated && !a.evicted && a.connection && a.connection->is_idle();
}

// Closes the oldest evictable connection (from `peer`, when given); false if there is none.
bool evict_one(server::state& s, const asio::ip::address* peer) {
    for (auto* a : s.admissions) {
        if (!is_evictable(*a) || (peer && a->peer != *peer)) continue;
        s.forget_unauthenticated(*a);
        a->evicted = true;
        ++s.evicting;
        ++s.counters.evicted;
        a->connection->close_now();
        return true;
    }
    return false;
}

// Whether a connection from `peer` may be admitted now, after closing idle unauthenticated
// connections to make room where a cap is reached. The per-peer cap only chooses whose idle
// connection goes: a burst of new connections from one proxy is refused by the share alone.
bool make_room(server::state& s, const asio::ip::address& peer) {
    const auto& o = s.options;
    if (s.open_connections - s.evicting >= o.max_connections && !evict_one(s, nullptr))
        return false;
    if (s.unauthenticated >= o.max_unauthenticated && !evict_one(s, nullptr)) return false;
    const auto from_peer = s.unauthenticated_by_peer.find(peer);
    if (from_peer != s.unauthenticated_by_peer.end() &&
        from_peer->second >= o.max_unauthenticated_per_peer)
        (void)evict_one(s, &peer);
    return true;
}

// `counted` is held for the task's life: the connection counts as open until it ends.
asio::awaitable<void> serve_connection(std::shared_ptr<server::state> state,
                                       std::shared_ptr<open_connection> counted,
                                       asio::ip::tcp::socket socket) {
    const auto deadline = clock::now() + state->options.head_timeout;
    std::unique_ptr<stream> s;
    if (state->options.make_stream) {
        auto made = co_await state->options.make_stream(std::move(socket), deadline);
        if (!made) {
            detail::log(log_level::debug, "http",
                        "connection setup failed: " + made.error().detail);
            co_return;
        }
        s = std::move(*made);
    } else {
        s = make_tcp_stream(std::move(socket));
    }
    server_connection connection(state, std::move(s), deadline, counted->record);
    if (state->stopping || counted->record.evicted) co_return;
    try {
        co_await connection.async_run();
    } catch (const std::system_error& e) {
        if (!is_system_cancellation(e)) {
            detail::log(log_level::warning, "http",
                        std::string("a connection failed: ") + e.what());
        }
    }
}

asio::awaitable<void> accept_loop(std::shared_ptr<server::state> state) {
    asio::steady_timer backoff(state->executor);
    for (;;) {
        auto token = as_tuple(asio::use_awaitable);
        auto [ec, socket] = co_await state->acceptor.async_accept(token);
        if (state->stopping || !state->acceptor.is_open()) break;
        if (ec) {
            // Out of descriptors (EMFILE) or a transient failure: wait a little, keep serving.
            detail::log(log_level::warning, "http", "accept failed: " + ec.message());
            backoff.expires_after(std::chrono::milliseconds(50));
            auto [wait_error] = co_await backoff.async_wait(token);
            (void)wait_error;
            continue;
        }
        ++state->counters.accepted;
        std::error_code peer_error;
        const auto peer = socket.remote_endpoint(peer_error).address();
        if (peer_error || !make_room(*state, peer)) {
            ++state->counters.refused_over_cap;
            refuse(socket);
            continue;
        }
        auto counted = std::make_shared<open_connection>(state, peer);
        state->tasks.spawn(serve_connection(state, std::move(counted), std::move(socket)));
    }
}

asio::awaitable<void> run_accept_loop(std::shared_ptr<server::state> state) {
    try {
        co_await accept_loop(std::move(state));
    } catch (const std::system_error& e) {
        if (!is_system_cancellation(e)) throw;
    }
}

std::vector<std::string> loopback_hosts(unsigned short port) {
    std::vector<std::string> hosts;
    for (const char* name : {"localhost", "127.0.0.1", "[::1]"}) {
        hosts.emplace_back(name);
        hosts.push_back(std::string(name) + ":" + std::to_string(port));
    }
    return hosts;
}

}  // namespace

void server::state::forget_unauthenticated(admitted& a) {
    if (a.authenticated || a.evicted) return;
    --unauthenticated;
    auto from_peer = unauthenticated_by_peer.find(a.peer);
    if (from_peer != unauthenticated_by_peer.end() && --from_peer->second == 0)
        unauthenticated_by_peer.erase(from_peer);
}

bool server::state::is_host_allowed(std::string_view host) const noexcept {
    if (hosts.empty()) return true;
    for (const auto& h : hosts) {
        if (iequals(h, host)) return true;
    }
    return options.accept_host && options.accept_host(host);
}

server::server(asio::any_io_executor executor, server_options options)
    : state_(std::make_shared<state>(std::move(executor), std::move(options))) {}

server::~server() {
    state_->stopping = true;
    std::error_code ignored;
    state_->acceptor.close(ignored);
    for (auto* c : state_->connections) c->close_now();
    state_->tasks.cancel_all();
}

result<void> server::route(std::string method, std::string_view pattern, handler h,
                           route_options options) {
    if (!h) return make_error(errc::invalid_argument, "a route needs a handler");
    if (!state_->routes.add(std::move(method), pattern)) {
        return make_error(errc::invalid_argument,
                          "invalid route pattern or method: " + std::string(pattern));
    }
    state::route_entry entry;
    entry.run = std::move(h);
    entry.max_body_bytes = options.max_body_bytes.value_or(state_->options.default_max_body_bytes);
    state_->handlers.push_back(std::move(entry));
    return {};
}

void server::intercept(std::function<bool(const request_head&)> matches, handler h) {
    state_->intercepts = std::move(matches);
    state_->interceptor.run = std::move(h);
    state_->interceptor.max_body_bytes = UINT64_MAX;
}

result<asio::ip::tcp::endpoint> server::start() {
    auto& acceptor = state_->acceptor;
    const auto& endpoint = state_->options.listen;
    std::error_code ec;
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
        std::error_code ignored;
        acceptor.close(ignored);
        return make_error(errc::backend_failure,
                          "cannot listen on " + endpoint.address().to_string() + ":" +
                              std::to_string(endpoint.port()) + ": " + ec.message());
    }
    const auto bound = acceptor.local_endpoint(ec);
    if (!state_->options.allowed_hosts.empty()) {
        state_->hosts = state_->options.allowed_hosts;
    } else if (bound.address().is_loopback()) {
        state_->hosts = loopback_hosts(bound.port());
    }
    state_->tasks.spawn(run_accept_loop(state_));
    return bound;
}

asio::awaitable<void> server::async_stop(std::chrono::milliseconds grace) {
    auto s = state_;
    s->stopping = true;
    std::error_code ignored;
    s->acceptor.close(ignored);
    for (auto* c : s->connections) c->on_stop();
    if (s->open_connections > 0) {
        s->drained.expires_after(grace);
        auto token = as_tuple(asio::use_awaitable);
        auto [ec] = co_await s->drained.async_wait(token);
        (void)ec;  // cancelled: drained before the grace ran out
    }
    for (auto* c : s->connections) c->close_now();
    s->tasks.cancel_all();
    co_await s->tasks.async_wait_all();
}

server_stats server::stats() const noexcept {
    auto s = state_->counters;
    s.open_connections = state_->open_connections;
    return s;
}

}  // namespace moat::http
