#include "serve/envd_server.hpp"

#include <moat/log.hpp>

#include "core/json_writer.hpp"
#include "core/loopback.hpp"
#include "e2b_protocol/error_body.hpp"
#include "serve/port_proxy.hpp"
#include "serve/sandbox_pause.hpp"
#include "serve/server_secret.hpp"

#include <chrono>
#include <utility>

namespace moat::serve {

struct envd_server::state {
    state(serve_context& c, http::server_options o)
        : context(c), server(c.executor, std::move(o)) {}
    serve_context& context;
    envd_routes routes;
    http::server server;
};

namespace {}  // namespace

asio::awaitable<void> send_sandbox_not_found(http::server_response& response, std::string_view id) {
    e2b_protocol::error_body error;
    error.code = 502;
    error.message = "The sandbox was not found";
    error.sandbox_id = std::string(id);
    http::header_list headers;
    headers.add("Content-Type", "application/json; charset=utf-8");
    std::string body = e2b_protocol::encode_error_body(error);
    (void)co_await response.async_send(502, std::move(headers), std::move(body));
}

asio::awaitable<void> send_not_woken(http::server_response& response, std::string_view id,
                                     const error& why) {
    if (why.code == errc::sandbox_paused || why.code == errc::sandbox_not_found ||
        why.code == errc::cancelled) {
        co_await send_sandbox_not_found(response, id);
        co_return;
    }
    detail::log(log_level::warning, "serve", "auto-resume failed: " + why.to_string(), id);
    e2b_protocol::error_body error;
    error.code = 502;
    error.message = "The sandbox could not be resumed: " + why.code.message();
    error.sandbox_id = std::string(id);
    http::header_list headers;
    headers.add("Content-Type", "application/json; charset=utf-8");
    std::string body = e2b_protocol::encode_error_body(error);
    (void)co_await response.async_send(502, std::move(headers), std::move(body));
}

namespace {

asio::awaitable<void> send_unauthorized(http::server_response& response) {
    (void)co_await response.async_send_error(
        401,
        "unauthorized access, please provide a valid access token or method signing if "
        "supported");
}

asio::awaitable<void> serve_health(envd_call& call) {
    http::header_list headers;
    std::string empty;
    (void)co_await call.response.async_send(204, std::move(headers), std::move(empty));
}

bool token_matches(const http::server_request& request, const registry_entry& entry) {
    const auto token = request.headers().find("X-Access-Token");
    return token && constant_time_equals(*token, entry.access_token);
}

asio::awaitable<void> handle_envd(envd_server::state* s, std::size_t index,
                                  http::server_request& request, http::server_response& response) {
    const auto& route = s->routes.routes()[index];
    const auto id = requested_sandbox_id(request.head(), s->context.options.domain);
    std::shared_ptr<registry_entry> entry;
    if (id) {
        entry = s->context.registry.find(*id);
        // One being destroyed (or whose destroy failed) is gone for envd already, and so is a
        // paused one without autoResume until connect or resume.
        if (!entry || entry->ended.is_set() || refuses_traffic(*entry)) {
            co_await send_sandbox_not_found(response, *id);
            co_return;
        }
    }
    bool verified = entry && token_matches(request, *entry);
    if (!verified) {
        signature_verdict verdict;
        if (route.auth == envd_auth::token_or_signature && s->routes.verifier()) {
            verdict = s->routes.verifier()(request, entry);
        }
        entry = std::move(verdict.entry);
        if (!entry) {
            if (!id && route.auth == envd_auth::token) {
                co_await send_sandbox_not_found(response, "");
            } else if (verdict.expired) {
                (void)co_await response.async_send_error(401, "signature is already expired");
            } else {
                co_await send_unauthorized(response);
            }
            co_return;
        }
    }
    if (!entry || entry->ended.is_set()) {
        co_await send_sandbox_not_found(response, "");
        co_return;
    }
    // Paused: an autoResume sandbox resumes first (sandbox_pause.hpp), any other is gone.
    auto woke = co_await wake_for_traffic(s->context, entry);
    if (!woke) {
        co_await send_not_woken(response, entry->id, woke.error());
        co_return;
    }
    request.mark_authenticated();  // a sandbox's token, or a URL signed with it
    envd_call call{entry, request, response, s->context, verified};
    co_await route.handler(call);
}

}  // namespace

void envd_routes::add(std::string method, std::string path, envd_handler handler,
                      http::route_options options, envd_auth auth) {
    route r;
    r.method = std::move(method);
    r.path = std::move(path);
    r.handler = std::move(handler);
    r.options = options;
    r.auth = auth;
    routes_.push_back(std::move(r));
}

void envd_routes::set_signature_verifier(signature_verifier verifier) {
    verifier_ = std::move(verifier);
}

envd_server::envd_server(serve_context& context, http::server_options options) {
    const bool loopback = options.listen.address().is_loopback();
    if (loopback && options.allowed_hosts.empty()) {
        options.accept_host = [domain = context.options.domain](std::string_view host) {
            return moat::detail::is_loopback_authority(host) ||
                   parse_sandbox_host(host, domain).has_value();
        };
        // Set a list so that accept_host is consulted (an empty list serves the loopback names).
        options.allowed_hosts = {"localhost"};
    }
    auto owned = std::make_shared<state>(context, std::move(options));
    add_port_proxy(owned->server, context);
    owned->routes.add("GET", "/health", serve_health);
    add_process_service(owned->routes, context);
    add_filesystem_service(owned->routes, context);
    add_file_routes(owned->routes, context);
    const auto& routes = owned->routes.routes();
    for (std::size_t i = 0; i < routes.size(); ++i) {
        // The server (and so this handler) lives inside the state: a raw pointer, not a cycle.
        auto* s = owned.get();
        http::handler h = [s, i](http::server_request& request, http::server_response& response) {
            return handle_envd(s, i, request, response);
        };
        auto added =
            owned->server.route(routes[i].method, routes[i].path, std::move(h), routes[i].options);
        if (!added) {
            detail::log(log_level::error, "serve", "envd route: " + added.error().to_string());
        }
    }
    hold(std::move(owned));
}

}  // namespace moat::serve
