// The control plane of `moat serve`: E2B's REST API (docs/serve.md has the table of what is
// supported), over the sandbox registry.
//
// Every route but GET /health needs X-API-Key equal to the server's key (compared in constant
// time): otherwise 401 {"code":401,"message":"..."}. Errors are E2B's JSON
// {"code":<status>,"message":"..."}; requests are read and replies written by
// src/e2b_protocol (sandbox_requests.hpp, sandbox_replies.hpp: capped).
//
//   POST /v2/sandboxes, POST /sandboxes       201 Sandbox (v2 default timeout 300 s, v1 15 s)
//   GET /sandboxes/{id}                       200 SandboxDetail, 404
//   GET /v2/sandboxes, GET /sandboxes         200 ListedSandbox[] (newest first, paged)
//   DELETE /sandboxes/{id}                    204 once destroyed (confirmed), 404 once gone;
//                                             500 when not confirmed: the sandbox is kept
//                                             (sandbox_registry::async_destroy)
//   POST /sandboxes/{id}/timeout              204: the end is now + timeout (may shorten)
//   POST /sandboxes/{id}/refreshes            204: extends only (at least 15 s)
//   POST /sandboxes/{id}/connect, /v2/...     200 Sandbox: extends only; 404
//   GET /health                               200 once the backend can create sandboxes
//   GET /sandboxes/{id}/metrics, GET /sandboxes/metrics   sandbox_metrics.hpp
//   POST /sandboxes/{id}/pause, /resume       sandbox_pause.hpp (connect resumes too)
//   PUT /sandboxes/{id}/network               sandbox_network.hpp
//   snapshots, fork, templates, volumes, logs: 501 naming it (404 first for an unknown sandbox)
//
// A create past --max-sandboxes answers 429 with no Retry-After (the SDK retries only when one is
// given). Request fields never widen the operator's policy (see narrow_network).
#pragma once

#include "e2b_protocol/sandbox_requests.hpp"
#include "http/server.hpp"
#include "serve/http_listener.hpp"
#include "serve/network_narrowing.hpp"
#include "serve/serve_context.hpp"

#include <moat/result.hpp>

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace moat::serve {

// The envd version reported to clients: the SDK gates features on it (0.6.4 and later: file
// metadata, watch options, octet-stream uploads, closeStdin).
inline constexpr std::string_view reported_envd_version = "0.6.4";
// E2B's 404 message for a sandbox id this server does not have.
std::string sandbox_not_found_message(std::string_view id);

class control_plane : public http_listener {
  public:
    control_plane(serve_context& context, http::server_options options);

    struct state;
};

}  // namespace moat::serve
