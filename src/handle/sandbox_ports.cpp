// sandbox::async_port_host and the handle's loopback forwards (sandbox.hpp is the contract).
#include "handle/sandbox_impl.hpp"

#include "core/exception_boundary.hpp"

#include <moat/log.hpp>

namespace moat {
namespace {

// How long one forwarded connection may take to reach the sandbox's port.
constexpr auto forward_connect_timeout = std::chrono::seconds(10);

asio::awaitable<result<asio::ip::tcp::socket>> connect_for_forward(
    std::weak_ptr<sandbox::impl> weak, std::uint16_t port) {
    auto state = weak.lock();
    if (!state || state->backend_gone) {
        co_return make_error(errc::sandbox_unavailable, "the sandbox's handle is gone");
    }
    co_return co_await connect_port_call(std::move(state), port,
                                         deadline::after(forward_connect_timeout), lane::side);
}

void log_forward_event(const std::string& id, std::uint16_t port, const port_forward_event& e) {
    if (e.what == port_forward_event::kind::refused ||
        e.what == port_forward_event::kind::over_cap) {
        detail::log(
            log_level::info, "ports",
            "forward to port " + std::to_string(port) + " from " + e.peer + " closed: " + e.detail,
            id);
    }
}

asio::awaitable<result<std::string>> port_host(std::shared_ptr<sandbox::impl> state,
                                               std::uint16_t port) {
    if (auto refused = state->refusal()) co_return std::move(*refused);
    if (port == 0) co_return make_error(errc::invalid_argument, "port 0: a port is 1-65535");
    auto named = state->sandboxes.port_host(state->info.id, port);
    if (named || named.error().code != errc::not_supported) co_return named;
    if (auto open = state->forwards.find(port); open != state->forwards.end()) {
        const auto& bound = open->second->local_endpoint();
        co_return bound.address().to_string() + ":" + std::to_string(bound.port());
    }
    // A backend without port names connects ports itself: forward a loopback port to it.
    std::weak_ptr<sandbox::impl> weak = state;
    const std::string id = state->info.id;
    port_forwarder::connector connect = [weak, port] { return connect_for_forward(weak, port); };
    port_forwarder::event_sink sink = [id, port](const port_forward_event& e) {
        log_forward_event(id, port, e);
    };
    auto forwarder =
        port_forwarder::start(state->executor, {asio::ip::make_address_v4("127.0.0.1"), 0},
                              std::move(connect), {}, std::move(sink));
    if (!forwarder) co_return std::move(forwarder).error();
    const auto& bound = (*forwarder)->local_endpoint();
    std::string host = bound.address().to_string() + ":" + std::to_string(bound.port());
    state->forwards[port] = std::move(*forwarder);
    co_return host;
}

}  // namespace

void sandbox::impl::close_forwards() noexcept {
    auto open = std::move(forwards);
    forwards.clear();
    for (auto& [port, forwarder] : open) forwarder->close();
}

asio::awaitable<result<std::string>> sandbox::async_port_host(std::uint16_t port) {
    return guarded(port_host(impl_, port));
}

}  // namespace moat
