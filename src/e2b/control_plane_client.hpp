// A client of the E2B control plane (REST + JSON, X-API-Key): create, connect, get, list, set
// timeout and kill, with E2B's v2 endpoints first and v1 as the fallback (a 404 from a v2 route
// switches this client to v1 for good). Used by the e2b backend; its peer in the tests is
// `moat serve`.
//
// Every call is bounded by control_plane_options::request_timeout, shared by its retries, and
// every response by a cap (e2b_protocol/sandbox_replies.hpp). Retries:
// - 429 with a delta-seconds Retry-After no longer than max_retry_after and inside the call's
//   budget: waited out and retried, at most max_attempts in all, on every call (a 429 means the
//   request was not acted on). Without Retry-After, or past either bound: rate_limited.
// - 502 and 503, and a connection that failed (backend_failure from the HTTP layer): retried with
//   a short backoff on the idempotent calls only (get, list, set timeout, kill). Create and
//   connect are never retried on these: a create the server may have carried out is not repeated.
//
// Errors: unauthorized (401, or no API key: named E2B_API_KEY), sandbox_not_found (404 on a
// sandbox's path), sandbox_unavailable (409: the sandbox is being killed or paused),
// rate_limited (429; retryable), invalid_argument (other 4xx, with the server's message),
// backend_failure (5xx, transport), protocol_error (a malformed or oversized response). Details
// name the method and path ("E2B API POST /v2/sandboxes: HTTP 401 ..."), never a header, and any
// occurrence of the API key in them (a server echoing it) is replaced by "<redacted>".
//
// Per-Operation Cancellation: terminal; the request in flight is abandoned (its connection
// closed) and the call completes with cancelled. A cancelled create may have created a sandbox:
// its short first timeout (the heartbeat's) ends it.
//
// Confined to its executor.
#pragma once

#include <moat/result.hpp>

#include "e2b_protocol/sandbox_replies.hpp"
#include "e2b_protocol/sandbox_requests.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moat::http {
class client;
}

namespace moat::e2b {

// The replies this client returns, as the protocol defines them.
using e2b_protocol::sandbox_detail;
using e2b_protocol::sandbox_reply;

struct control_plane_options {
    std::string api_url;  // "https://api.e2b.app", no trailing '/'
    std::string api_key;
    std::chrono::milliseconds request_timeout = std::chrono::seconds(30);
    std::chrono::milliseconds max_retry_after = std::chrono::seconds(10);
    int max_attempts = 4;
};

struct create_body {
    std::string template_id;
    std::int64_t timeout_s = 300;
    std::map<std::string, std::string> metadata;
    std::map<std::string, std::string> env_vars;
    // E2B's egress switch (absent: E2B's default, which is on) and its `network` object
    // (written only when either list is non-empty): domain names in allowOut, CIDRs in denyOut.
    std::optional<bool> allow_internet_access;
    std::vector<std::string> allow_out;
    std::vector<std::string> deny_out;
};
// The JSON body of POST /v2/sandboxes (v1 = false) or POST /sandboxes (v1 = true, with
// "secure": true), written by e2b_protocol::encode_create_request.
std::string create_json(const create_body& b, bool v1);

struct list_query {
    std::map<std::string, std::string> metadata;  // exact matches, AND
    std::string state = "running,paused";
    int page_limit = 100;  // sandboxes per page (E2B: at most 100)
    int max_pages = 50;    // past it: too_large
};

class control_plane_client {
  public:
    control_plane_client(std::shared_ptr<http::client> http, control_plane_options options);
    ~control_plane_client();
    control_plane_client(const control_plane_client&) = delete;
    control_plane_client& operator=(const control_plane_client&) = delete;

    // POST /v2/sandboxes (v1: POST /sandboxes with "secure": true). Never retried but on 429.
    asio::awaitable<result<sandbox_reply>> async_create(create_body body);
    // POST /v2/sandboxes/{id}/connect {"timeout": s} (v1 likewise): extends the end only.
    asio::awaitable<result<sandbox_reply>> async_connect(std::string id, std::int64_t timeout_s);
    // GET /sandboxes/{id}.
    asio::awaitable<result<sandbox_detail>> async_get(std::string id);
    // GET /v2/sandboxes, every page (X-Next-Token), at most query.max_pages.
    asio::awaitable<result<std::vector<sandbox_detail>>> async_list(list_query query);
    // POST /sandboxes/{id}/timeout {"timeout": s}: the end becomes now + s (may shorten it).
    asio::awaitable<result<void>> async_set_timeout(std::string id, std::int64_t timeout_s);
    // PUT /sandboxes/{id}/network: the sandbox's whole egress configuration replaced.
    asio::awaitable<result<void>> async_update_network(std::string id,
                                                       e2b_protocol::network_update_request body);
    // POST /sandboxes/{id}/pause: true once paused, false when it already was (409).
    asio::awaitable<result<bool>> async_pause(std::string id);
    // DELETE /sandboxes/{id}: true once killed, false when it was already gone (404).
    asio::awaitable<result<bool>> async_kill(std::string id);
    // One page of at most one sandbox: checks that the endpoint answers and takes the key.
    asio::awaitable<result<void>> async_check();

    // Requests sent so far, retries included (tests).
    std::uint64_t requests_sent() const noexcept;

    struct state;

  private:
    std::shared_ptr<state> state_;
};

}  // namespace moat::e2b
