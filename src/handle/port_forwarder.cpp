#include "handle/port_forwarder.hpp"

#include <moat/task_group.hpp>

#include "core/asio_compat.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <map>

namespace moat {
namespace {

// One relayed connection.
struct connection {
    explicit connection(asio::ip::tcp::socket s) : accepted(std::move(s)) {}
    std::uint64_t id = 0;
    std::string peer;
    asio::ip::tcp::socket accepted;         // the client, until the sandbox's end is connected
    std::unique_ptr<http::stream> client;   // then the client, relayed
    std::unique_ptr<http::stream> sandbox;  // and the sandbox's end
    void close() noexcept {
        std::error_code ignored;
        accepted.close(ignored);
        if (client) client->close();
        if (sandbox) sandbox->close();
    }
    // The sandbox's port could not be reached: the client is reset, so it can never take the
    // closed connection for an empty answer.
    void refuse() noexcept {
        std::error_code ignored;
        accepted.set_option(asio::socket_base::linger(true, 0), ignored);
        close();
    }
};

std::string endpoint_text(const asio::ip::tcp::endpoint& e) {
    const auto address = e.address();
    if (address.is_v6()) return "[" + address.to_string() + "]:" + std::to_string(e.port());
    return address.to_string() + ":" + std::to_string(e.port());
}

}  // namespace

struct port_forwarder::state {
    state(asio::any_io_executor ex, asio::ip::tcp::acceptor a, connector c, port_forward_options o,
          event_sink e)
        : executor(ex),
          acceptor(std::move(a)),
          connect(std::move(c)),
          options(o),
          on_event(std::move(e)),
          tasks(ex, "port-forward") {
        std::error_code ignored;
        bound = acceptor.local_endpoint(ignored);
    }

    void emit(const port_forward_event& e) const {
        if (on_event) on_event(e);
    }

    asio::any_io_executor executor;
    asio::ip::tcp::acceptor acceptor;
    asio::ip::tcp::endpoint bound;
    connector connect;
    port_forward_options options;
    event_sink on_event;
    bool closed = false;
    std::uint64_t next_id = 1;
    // Open connections by id, so close() can end them; each removes itself when it ends.
    std::map<std::uint64_t, std::shared_ptr<connection>> connections;
    task_group tasks;  // the accept loop and one task per connection
};

namespace {

asio::awaitable<void> serve_connection(std::shared_ptr<port_forwarder::state> s,
                                       std::shared_ptr<connection> c) {
    auto connected = co_await s->connect();
    port_forward_event ended;
    ended.what = port_forward_event::kind::closed;
    ended.peer = c->peer;
    if (!connected && s->closed) {
        // Closed while connecting: nothing to report.
    } else if (!connected) {
        port_forward_event refused;
        refused.what = port_forward_event::kind::refused;
        refused.peer = c->peer;
        refused.detail = connected.error().to_string();
        s->emit(refused);
        c->refuse();
    } else if (!s->closed && c->accepted.is_open()) {
        c->client = http::make_tcp_stream(std::move(c->accepted));
        c->sandbox = http::make_tcp_stream(std::move(*connected));
        port_forward_event connected_event;
        connected_event.peer = c->peer;
        s->emit(connected_event);
        const auto totals = co_await http::async_relay(*c->client, *c->sandbox, s->options.relay);
        ended.bytes_out = totals.a_to_b;
        ended.bytes_in = totals.b_to_a;
        ended.idle = totals.idle;
        s->emit(ended);
    }
    c->close();
    s->connections.erase(c->id);
}

asio::awaitable<void> accept_loop(std::shared_ptr<port_forwarder::state> s) {
    while (!s->closed) {
        auto [error, socket] = co_await s->acceptor.async_accept(as_tuple(asio::use_awaitable));
        if (s->closed) co_return;
        if (error) {
            if (error == asio::error::operation_aborted) co_return;
            // Out of descriptors or a connection reset before it was accepted: go on, after a
            // pause when the process is out of descriptors (accept would fail at once again).
            if (error == asio::error::no_descriptors || error == asio::error::no_buffer_space) {
                asio::steady_timer pause(s->executor, std::chrono::milliseconds(100));
                auto [paused] = co_await pause.async_wait(as_tuple(asio::use_awaitable));
                if (paused) co_return;
            }
            continue;
        }
        std::error_code ignored;
        auto c = std::make_shared<connection>(std::move(socket));
        c->peer = endpoint_text(c->accepted.remote_endpoint(ignored));
        if (s->connections.size() >= s->options.max_connections) {
            c->refuse();
            port_forward_event over;
            over.what = port_forward_event::kind::over_cap;
            over.peer = c->peer;
            over.detail =
                "already " + std::to_string(s->connections.size()) + " connections, the limit";
            s->emit(over);
            continue;
        }
        c->accepted.set_option(asio::ip::tcp::no_delay(true), ignored);
        c->id = s->next_id++;
        s->connections[c->id] = c;
        s->tasks.spawn(serve_connection(s, c));
    }
}

}  // namespace

result<std::unique_ptr<port_forwarder>> port_forwarder::start(asio::any_io_executor executor,
                                                              asio::ip::tcp::endpoint listen,
                                                              connector connect,
                                                              port_forward_options options,
                                                              event_sink on_event) {
    asio::ip::tcp::acceptor acceptor(executor);
    std::error_code error;
    acceptor.open(listen.protocol(), error);
    if (!error) acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true), error);
    if (!error) acceptor.bind(listen, error);
    if (!error) acceptor.listen(asio::socket_base::max_listen_connections, error);
    if (error) {
        return make_error(errc::backend_failure,
                          "cannot listen on " + endpoint_text(listen) + ": " + error.message());
    }
    auto s = std::make_shared<state>(executor, std::move(acceptor), std::move(connect), options,
                                     std::move(on_event));
    s->tasks.spawn(accept_loop(s));
    return std::unique_ptr<port_forwarder>(new port_forwarder(std::move(s)));
}

port_forwarder::~port_forwarder() {
    close();
}

const asio::ip::tcp::endpoint& port_forwarder::local_endpoint() const noexcept {
    return state_->bound;
}

std::size_t port_forwarder::open_connections() const noexcept {
    return state_->connections.size();
}

bool port_forwarder::is_closed() const noexcept {
    return state_->closed;
}

void port_forwarder::close() noexcept {
    auto& s = *state_;
    if (s.closed) return;
    s.closed = true;
    std::error_code ignored;
    s.acceptor.close(ignored);
    for (auto& [id, c] : s.connections) c->close();
    s.tasks.cancel_all();
}

asio::awaitable<void> port_forwarder::async_close() {
    close();
    auto s = state_;  // the forwarder may go while this waits
    co_await s->tasks.async_wait_all();
}

}  // namespace moat
