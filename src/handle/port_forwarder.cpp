#include "handle/port_forwarder.hpp"

#include "core/asio_compat.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>

namespace moat {

struct port_forwarder::connection {
    std::uint64_t id = 0;
    std::string peer;
    std::unique_ptr<http::stream> client;
    std::unique_ptr<http::stream> sandbox;  // once connected
    void close() noexcept {
        if (client) client->close();
        if (sandbox) sandbox->close();
    }
};

namespace {

std::string endpoint_text(const asio::ip::tcp::endpoint& e) {
    const auto address = e.address();
    if (address.is_v6()) return "[" + address.to_string() + "]:" + std::to_string(e.port());
    return address.to_string() + ":" + std::to_string(e.port());
}

}  // namespace

port_forwarder::port_forwarder(asio::any_io_executor executor, asio::ip::tcp::acceptor acceptor,
                               connector connect, port_forward_options options, event_sink on_event)
    : executor_(std::move(executor)),
      acceptor_(std::move(acceptor)),
      connect_(std::move(connect)),
      options_(options),
      on_event_(std::move(on_event)) {
    std::error_code ignored;
    bound_ = acceptor_.local_endpoint(ignored);
}

port_forwarder::~port_forwarder() {
    close();
}

result<std::shared_ptr<port_forwarder>> port_forwarder::start(asio::any_io_executor executor,
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
    std::shared_ptr<port_forwarder> self(new port_forwarder(
        executor, std::move(acceptor), std::move(connect), options, std::move(on_event)));
    asio::co_spawn(executor, accept_loop(self), asio::detached);
    return self;
}

void port_forwarder::close() noexcept {
    if (closed_) return;
    closed_ = true;
    std::error_code ignored;
    acceptor_.close(ignored);
    auto open = std::move(connections_);
    for (auto& [id, c] : open) c->close();
}

void port_forwarder::emit(const port_forward_event& e) const {
    if (on_event_) on_event_(e);
}

asio::awaitable<void> accept_loop(std::shared_ptr<port_forwarder> self) {
    while (!self->closed_) {
        auto [error, socket] = co_await self->acceptor_.async_accept(as_tuple(asio::use_awaitable));
        if (self->closed_) co_return;
        if (error) {
            // Out of descriptors or a connection reset before it was accepted: go on, after a
            // pause when the process is out of descriptors (accept would fail at once again).
            if (error == asio::error::no_descriptors || error == asio::error::no_buffer_space) {
                asio::steady_timer pause(self->executor_, std::chrono::milliseconds(100));
                co_await pause.async_wait(as_tuple(asio::use_awaitable));
            }
            continue;
        }
        std::error_code ignored;
        auto c = std::make_shared<port_forwarder::connection>();
        c->peer = endpoint_text(socket.remote_endpoint(ignored));
        if (self->open_ >= self->options_.max_connections) {
            socket.close(ignored);
            self->emit({port_forward_event::kind::over_cap, c->peer,
                        "already " + std::to_string(self->open_) + " connections, the limit"});
            continue;
        }
        socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        c->id = self->next_id_++;
        c->client = http::make_tcp_stream(std::move(socket));
        self->connections_[c->id] = c;
        ++self->open_;
        asio::co_spawn(self->executor_, serve_connection(self, c), asio::detached);
    }
}

asio::awaitable<void> serve_connection(std::shared_ptr<port_forwarder> self,
                                       std::shared_ptr<port_forwarder::connection> c) {
    auto connected = co_await self->connect_();
    port_forward_event ended;
    ended.what = port_forward_event::kind::closed;
    ended.peer = c->peer;
    if (!connected) {
        self->emit({port_forward_event::kind::refused, c->peer, connected.error().to_string()});
    } else if (!self->closed_ && c->client->is_open()) {
        c->sandbox = http::make_tcp_stream(std::move(*connected));
        port_forward_event connected_event;
        connected_event.peer = c->peer;
        self->emit(connected_event);
        const auto totals =
            co_await http::async_relay(*c->client, *c->sandbox, self->options_.relay);
        ended.bytes_out = totals.a_to_b;
        ended.bytes_in = totals.b_to_a;
        ended.idle = totals.idle;
        self->emit(ended);
    }
    c->close();
    self->connections_.erase(c->id);
    --self->open_;
}

}  // namespace moat
