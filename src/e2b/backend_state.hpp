// The e2b backend's own state, shared by its files (e2b_backend.cpp, heartbeat.cpp): the sandboxes
// it holds and the clients it calls them through. Not a public header.
#pragma once

#include <moat/backend.hpp>
#include <moat/e2b_backend.hpp>

#include "e2b/control_plane_client.hpp"
#include "e2b/envd_client.hpp"
#include "http/client.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace moat::e2b {

using std::chrono::milliseconds;
using system_clock = std::chrono::system_clock;

struct held_sandbox {
    sandbox_info info;
    // The sandbox's own end (spec.ttl, or what extend_ttl set): the heartbeat never renews past it.
    system_clock::time_point ttl_end;
    bool heartbeat = false;  // its E2B timeout is kept at heartbeat_timeout
    std::optional<std::string> gone_reason;
    // Paused through this backend (async_pause): what was left of its TTL then, for the resume.
    bool paused = false;
    milliseconds ttl_left{0};
    // The sandbox's envd: exec, spawn, signal and files go there.
    std::shared_ptr<e2b::envd_client> envd;
    // The domain its ports are named under: the create or connect answer's, else the config's.
    std::string domain;
};

struct backend_state {
    asio::any_io_executor executor;
    e2b_config config;
    std::string config_error;  // why no call can be made (a bad api_url), or ""
    std::shared_ptr<http::client> http;
    std::unique_ptr<e2b::control_plane_client> control;
    std::map<std::string, std::shared_ptr<held_sandbox>, std::less<>> held;
    // Renewals a heartbeat round keeps in flight at once: half the HTTP client's per-origin call
    // budget. A renewal that ends starts the next at once, ahead of a call already waiting for
    // a connection, so the heartbeat must leave room for the backend's other calls.
    std::size_t renewals_in_flight = 1;
    bool heartbeat_running = false;
    bool stopping = false;
};

// The provider's view of a sandbox as moat's sandbox_info (a held one keeps its own TTL end).
sandbox_info info_from(const backend_state& s, const sandbox_detail& d);

// The envd client of sandbox `id` under `domain` (the config's when empty).
std::shared_ptr<envd_client> envd_client_for(const backend_state& s, const std::string& id,
                                             const std::string& domain, std::string access_token);

// sandbox_unavailable naming why a held sandbox ended.
error gone_error(const std::string& id, const held_sandbox& h);

// The sandbox's envd is gone for good: its client, and the HTTP client's state for its origin.
void forget_envd(backend_state& s, held_sandbox& h);

// A held sandbox has ended (`reason`): it answers gone_error from now on.
void mark_gone(backend_state& s, held_sandbox& h, std::string reason);

// Every heartbeat_interval, the renewal of each held sandbox's E2B timeout (heartbeat.cpp);
// returns when no sandbox needs it, the backend stops, or it is cancelled.
asio::awaitable<void> heartbeat_loop(std::shared_ptr<backend_state> s);

}  // namespace moat::e2b
