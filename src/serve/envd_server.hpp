// envd, the data plane of `moat serve`: one http::server for every sandbox of the registry,
// demultiplexed per request (envd_service.hpp describes what a service sees).
//
// Which sandbox: the E2b-Sandbox-Id header (the SDK sends it on every envd call; with
// E2B_SANDBOX_URL all envd traffic goes to one address), else a Host of the form
// `49983-<id>.<domain>` (E2B's per-sandbox host names) under the configured domain
// (serve_options::domain, --domain; none by default). Neither: the route decides
// (only signed /files URLs may name none). An id that is not a live sandbox of this server: 502
// {"code":502,"message":"The sandbox was not found","sandboxId":"<id>"}, as E2B's proxy answers.
//
// Access: X-Access-Token compared in constant time with the sandbox's token; wrong or missing:
// 401 {"code":401,"message":"unauthorized access, ..."}. GET /health (204) needs it too, unlike
// envd's own exemption: the SDK sends the token on every envd call, and a health probe that
// checks it tells a client whether its token is still good (after a restart of the server).
//
// Host header (DNS-rebinding defence): on a loopback listener the loopback names and, with a
// domain, `49983-<id>.<domain>` (case-insensitive, with or without a port and a trailing dot; the
// id is then checked as above); any other Host is 421, whatever E2b-Sandbox-Id says. On a
// non-loopback listener (TLS) any Host is served, and only the domain's names name a sandbox.
#pragma once

#include "http/server.hpp"
#include "serve/envd_service.hpp"
#include "serve/http_listener.hpp"
#include "serve/sandbox_names.hpp"
#include "serve/serve_context.hpp"

#include <moat/result.hpp>

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace moat::serve {

// 502 {"code":502,"message":"The sandbox was not found","sandboxId":"<id>"}, as E2B's proxy
// answers for a sandbox that is not there.
asio::awaitable<void> send_sandbox_not_found(http::server_response& response, std::string_view id);
// The answer to traffic that wake_for_traffic (sandbox_pause.hpp) did not let through: the one
// above for a sandbox paused without autoResume or ended meanwhile; 502 {"code":502,"message":
// "The sandbox could not be resumed: <why>","sandboxId":"<id>"} for a resume that failed (logged).
asio::awaitable<void> send_not_woken(http::server_response& response, std::string_view id,
                                     const error& why);

class envd_server : public http_listener {
  public:
    // Registers every service's routes (add_process_service, add_filesystem_service,
    // add_file_routes) behind the demultiplexer. `options` is the listener's (TLS included).
    envd_server(serve_context& context, http::server_options options);

    struct state;
};

}  // namespace moat::serve
