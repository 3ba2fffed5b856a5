#include "serve/sandbox_network.hpp"

#include <moat/deadline.hpp>
#include <moat/log.hpp>
#include <moat/sandbox.hpp>

#include "egress/address_policy.hpp"
#include "egress/network_bounds.hpp"
#include "serve/control_plane.hpp"

#include <algorithm>

namespace moat::serve {
namespace {

namespace protocol = e2b_protocol;

// How long an update may take (it rewrites a record and tells this process's proxy).
constexpr auto update_bound = std::chrono::seconds(10);

int status_of(const error& e) {
    if (e.code == errc::invalid_argument) return 400;
    if (e.code == errc::permission_denied) return 403;
    if (e.code == errc::sandbox_not_found) return 404;
    if (e.code == errc::not_supported) return 409;
    if (e.code == errc::sandbox_unavailable || e.code == errc::shutting_down) return 503;
    return 500;
}

}  // namespace

result<sandbox_network> network_for_update(const sandbox_network& operator_network,
                                           const protocol::network_update_request& update) {
    protocol::create_request asked;
    asked.allow_internet_access = update.allow_internet_access;
    asked.network = update.network;
    // The names and ranges checked, and the network a create would get.
    auto narrowed = narrow_network(operator_network, asked);
    if (!narrowed) return narrowed;
    const auto& deny = update.network.deny_out;
    const bool listed = std::find(deny.begin(), deny.end(), "0.0.0.0/0") != deny.end();
    if (!listed || update.allow_internet_access == false) return narrowed;
    // The names asked for, every one of them: one the operator's network does not cover is
    // refused (a create would drop it).
    sandbox_network wanted = operator_network;
    wanted.mode = network_mode::allow_list;
    wanted.allow_hosts.clear();
    for (const auto& entry : update.network.allow_out) {
        if (egress::is_address_entry(entry)) continue;
        auto& hosts = wanted.allow_hosts;
        if (std::find(hosts.begin(), hosts.end(), entry) == hosts.end()) hosts.push_back(entry);
    }
    if (wanted.allow_hosts.empty()) return sandbox_network{};
    if (operator_network.mode == network_mode::none) {
        wanted.resolve.clear();
        wanted.allow_addresses.clear();
    }
    auto within = egress::check_network_update(wanted, sandbox_network{}, operator_network);
    if (!within) {
        auto e = std::move(within).error();
        e.detail = "network.allowOut: " + e.detail;
        return e;
    }
    return wanted;
}

asio::awaitable<void> answer_update_network(serve_context& context, http::server_request& request,
                                            http::server_response& response) {
    const std::string id(request.param("id"));
    auto entry = context.registry.find(id);
    if (!entry || !entry->handle) {
        (void)co_await response.async_send_error(404, sandbox_not_found_message(id));
        co_return;
    }
    auto body = co_await request.async_read_body();
    if (!body) {
        (void)co_await response.async_send_error(400,
                                                 "cannot read the request: " + body.error().detail);
        co_return;
    }
    auto parsed = protocol::parse_network_update_request(*body);
    if (!parsed) {
        (void)co_await response.async_send_error(400, parsed.error().detail);
        co_return;
    }
    auto wanted = network_for_update(context.options.network, *parsed);
    if (!wanted) {
        (void)co_await response.async_send_error(status_of(wanted.error()), wanted.error().detail);
        co_return;
    }
    const auto limit = deadline::after(update_bound);
    auto updated = co_await entry->handle->async_update_network(std::move(*wanted), limit);
    if (!updated) {
        const int status = status_of(updated.error());
        std::string message = "updating the network of " + id + ": " + updated.error().to_string();
        if (status == 500) {
            // The detail may name this host's paths: the log has it, the client its code.
            detail::log(log_level::warning, "serve", message, id);
            message = "updating the network of " + id + " failed (the server's log has why)";
        }
        (void)co_await response.async_send_error(status, message);
        co_return;
    }
    http::header_list headers;
    std::string empty;
    (void)co_await response.async_send(204, std::move(headers), std::move(empty));
}

}  // namespace moat::serve
