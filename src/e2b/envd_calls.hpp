// What the envd client's files share: its state (the HTTP client, the endpoint, the options, the
// commands it follows, the tasks that kill a dropped command) and the calls every part makes:
// one Connect unary call, the request headers envd wants, envd's HTTP errors as moat errors,
// and "kill this pid and confirm it is gone".
#pragma once

#include "e2b/envd_client.hpp"

#include <moat/deadline.hpp>
#include <moat/task_group.hpp>

#include "http/client.hpp"

#include <asio/any_io_executor.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace moat::e2b {

// The largest unary reply read (ListDir replies have their own cap below).
inline constexpr std::size_t max_unary_reply_bytes = 1024 * 1024;

struct envd_client::state {
    std::shared_ptr<http::client> http;
    envd_endpoint endpoint;
    envd_options options;
    // Made on the first call, on the caller's executor (the client is confined to it).
    std::optional<task_group> tasks;
    // The tags of the commands this client started and still follows.
    std::set<std::string> live;

    void bind(const asio::any_io_executor& executor);
};

using state_ptr = std::shared_ptr<envd_client::state>;

// A request to envd: the URL (base_url + target), E2b-Sandbox-Id, E2b-Sandbox-Port,
// X-Access-Token when the sandbox has one. Never logged with its headers.
http::request envd_request(const envd_client::state& s, std::string method, std::string target);

// async_send, with the wait for the response head bounded by `head_limit` (the request's own
// limit still bounds the whole exchange, body reads included). deadline_exceeded when it passed.
asio::awaitable<result<http::response>> async_send_within(state_ptr s, http::request request,
                                                          deadline head_limit);

// POST /<service>/<method> with `json`, bounded by `limit`; the reply's JSON (at most
// `max_reply` bytes). Errors: the HTTP client's; sandbox_unavailable for envd's 502 (the sandbox
// is gone); the Connect error of a non-200 reply (http::connect::to_error), its detail prefixed
// with `rpc`; protocol_error for a 200 that is not application/json.
asio::awaitable<result<std::string>> async_unary(state_ptr s, std::string rpc, std::string json,
                                                 deadline limit,
                                                 std::size_t max_reply = max_unary_reply_bytes);

// The error of a non-200 /files (or other plain HTTP) reply: 401 unauthorized, 403
// permission_denied, 404 file_not_found, 400 invalid_path (is_directory when envd says so), 413
// and 507 too_large, 502 sandbox_unavailable, anything else backend_failure. The detail is
// "<what>: <envd's message> (HTTP <status>)".
error envd_http_error(int status, std::string_view body, std::string_view what);

// Process/SendSignal of `number` to `pid`, within the request timeout: invalid_argument for a
// signal outside 1 to 64, not_supported for one envd cannot send (it names only SIGKILL and
// SIGTERM), file_not_found when no such process runs (envd's not_found).
asio::awaitable<result<void>> async_send_signal(state_ptr s, std::uint32_t pid, int number);

// Sends SIGKILL to the command tagged `tag` (one already gone is fine) and polls Process/List
// until no process carries the tag, sending SIGKILL again to one that still does. True once
// confirmed, false when `limit` passed first. Not cancellable: call it after resetting the
// coroutine's cancellation state.
asio::awaitable<bool> async_kill_and_confirm(state_ptr s, std::string tag, deadline limit);

// A task for s->tasks: async_kill_and_confirm within kill_grace, never cancelled (a dropped
// stream's command must die even while its client goes away); forgets the tag.
asio::awaitable<void> async_kill_task(state_ptr s, std::string tag);

}  // namespace moat::e2b
