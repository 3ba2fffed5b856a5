#include "e2b/control_plane_client.hpp"

#include <moat/deadline.hpp>

#include "core/asio_compat.hpp"
#include "e2b_protocol/error_body.hpp"
#include "e2b_protocol/sandbox_requests.hpp"
#include "http/client.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>

namespace moat::e2b {

struct control_plane_client::state {
    std::shared_ptr<http::client> http;
    control_plane_options options;
    bool v1_only = false;  // a v2 route answered 404: this control plane predates v2
    std::uint64_t sent = 0;

    std::string redact(std::string text) const {
        if (options.api_key.size() < 4) return text;
        for (auto at = text.find(options.api_key); at != std::string::npos;
             at = text.find(options.api_key, at)) {
            text.replace(at, options.api_key.size(), "<redacted>");
        }
        return text;
    }
    error redacted(error e) const {
        e.detail = redact(std::move(e.detail));
        return e;
    }
};

namespace {

namespace protocol = e2b_protocol;
using state = control_plane_client::state;

enum class retry_policy { rate_limit_only, idempotent };

struct call_spec {
    std::string method;
    std::string path;   // no query: named in errors
    std::string query;  // "" or "a=b&c=d"
    std::string body;   // JSON, or "" for none
    retry_policy retries = retry_policy::rate_limit_only;
    std::size_t max_body_bytes = protocol::max_sandbox_body_bytes;
};

std::string what_of(const call_spec& c) {
    return "E2B API " + c.method + " " + c.path;
}

// The error for a status the caller does not handle itself.
error error_for(const state& s, const call_spec& c, const http::full_response& r) {
    const int status = r.status();
    auto mapped = http::error_for_status(status, r.head.headers, what_of(c));
    error e = mapped.error;
    if (status == 401) {
        e.detail += ": the API key was refused (E2B_API_KEY)";
    } else if (status == 404) {
        e.code = make_error_code(errc::sandbox_not_found);
    } else if (status == 409) {
        e.code = make_error_code(errc::sandbox_unavailable);
    } else if (status == 403) {
        e.code = make_error_code(errc::unauthorized);
    }
    if (status != 429) {
        if (auto message = protocol::parse_error_message(r.body)) e.detail += ": " + *message;
    }
    return s.redacted(std::move(e));
}

asio::awaitable<bool> sleep_for(std::chrono::milliseconds d) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(d);
    auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
    co_return !ec;
}

error cancelled_error(const call_spec& c) {
    return make_error(errc::cancelled, what_of(c) + ": cancelled while waiting to retry");
}

// Sends the call, retrying as the policy allows, and returns the last response whatever its
// status (429 and retried statuses included, once retries are spent).
asio::awaitable<result<http::full_response>> send(std::shared_ptr<state> s, call_spec c) {
    if (s->options.api_key.empty()) {
        co_return make_error(errc::unauthorized,
                             what_of(c) + ": no API key: set E2B_API_KEY (e2b_config::api_key)");
    }
    const auto limit = deadline::after(s->options.request_timeout);
    std::chrono::milliseconds backoff(100);
    for (int attempt = 1;; ++attempt) {
        http::request req;
        req.method = c.method;
        req.url = s->options.api_url + c.path;
        if (!c.query.empty()) req.url += "?" + c.query;
        req.headers.add("X-API-Key", s->options.api_key);
        req.headers.add("Accept", "application/json");
        req.headers.add("User-Agent", "moat-e2b");
        if (!c.body.empty()) {
            req.headers.add("Content-Type", "application/json");
            req.body = c.body;
        }
        req.limit = limit;
        ++s->sent;
        auto reply = co_await s->http->async_fetch(std::move(req), c.max_body_bytes);
        const bool more = attempt < s->options.max_attempts;
        if (!reply) {
            const bool transport = reply.error().code == errc::backend_failure;
            const bool room = limit.remaining() > backoff;
            if (c.retries == retry_policy::idempotent && transport && more && room) {
                if (!co_await sleep_for(backoff)) co_return cancelled_error(c);
                backoff *= 2;
                continue;
            }
            co_return s->redacted(std::move(reply).error());
        }
        const int status = reply->status();
        if (status == 429 && more) {
            const auto after = http::parse_retry_after(reply->head.headers);
            if (after) {
                const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(*after);
                const bool allowed = wait <= s->options.max_retry_after;
                if (allowed && limit.remaining() > wait) {
                    if (!co_await sleep_for(wait)) co_return cancelled_error(c);
                    continue;
                }
            }
        }
        const bool busy = status == 502 || status == 503;
        if (busy && c.retries == retry_policy::idempotent && more && limit.remaining() > backoff) {
            if (!co_await sleep_for(backoff)) co_return cancelled_error(c);
            backoff *= 2;
            continue;
        }
        co_return std::move(*reply);
    }
}

bool is_success(int status) {
    return status >= 200 && status < 300;
}

bool is_ok(int status) {
    return status == 200;
}

// Sends `c`; a reply whose status `accepted` takes is parsed with `parse` (its error redacted),
// any other is the control plane's error for it.
template <class T>
asio::awaitable<result<T>> send_parsed(std::shared_ptr<state> s, call_spec c,
                                       bool (*accepted)(int status),
                                       result<T> (*parse)(std::string_view body)) {
    auto reply = co_await send(s, c);
    if (!reply) co_return std::move(reply).error();
    if (!accepted(reply->status())) co_return error_for(*s, c, *reply);
    auto parsed = parse(reply->body);
    if (!parsed) co_return s->redacted(std::move(parsed).error());
    co_return std::move(*parsed);
}

asio::awaitable<result<sandbox_reply>> post_sandbox(std::shared_ptr<state> s, call_spec c) {
    return send_parsed(std::move(s), std::move(c), is_success, protocol::parse_sandbox_reply);
}

asio::awaitable<result<sandbox_reply>> create(std::shared_ptr<state> s, create_body body) {
    if (!s->v1_only) {
        call_spec v2;
        v2.method = "POST";
        v2.path = "/v2/sandboxes";
        v2.body = create_json(body, false);
        auto created = co_await post_sandbox(s, v2);
        // A 404 from the create route itself: no v2 here (nothing was created).
        if (created || created.error().code != errc::sandbox_not_found) co_return created;
        s->v1_only = true;
    }
    call_spec v1;
    v1.method = "POST";
    v1.path = "/sandboxes";
    v1.body = create_json(body, true);
    co_return co_await post_sandbox(s, v1);
}

asio::awaitable<result<sandbox_reply>> connect(std::shared_ptr<state> s, std::string id,
                                               std::int64_t timeout_s) {
    if (!protocol::is_valid_sandbox_id(id))
        co_return make_error(errc::sandbox_not_found, "no sandbox with that id");
    if (!s->v1_only) {
        call_spec v2;
        v2.method = "POST";
        v2.path = "/v2/sandboxes/" + id + "/connect";
        v2.body = protocol::encode_connect_request(timeout_s);
        auto connected = co_await post_sandbox(s, v2);
        if (connected || connected.error().code != errc::sandbox_not_found) co_return connected;
        // A 404 is either an unknown sandbox or no v2 route: v1 tells them apart (a 404 there
        // is the sandbox's). The v1_only switch is left to create, whose 404 is unambiguous.
    }
    call_spec v1;
    v1.method = "POST";
    v1.path = "/sandboxes/" + id + "/connect";
    v1.body = protocol::encode_connect_request(timeout_s);
    co_return co_await post_sandbox(s, v1);
}

asio::awaitable<result<sandbox_detail>> get(std::shared_ptr<state> s, std::string id) {
    if (!protocol::is_valid_sandbox_id(id))
        co_return make_error(errc::sandbox_not_found, "no sandbox with that id");
    call_spec c;
    c.method = "GET";
    c.path = "/sandboxes/" + id;
    c.retries = retry_policy::idempotent;
    co_return co_await send_parsed(s, c, is_ok, protocol::parse_sandbox_detail);
}

asio::awaitable<result<std::vector<sandbox_detail>>> list(std::shared_ptr<state> s, list_query q) {
    std::vector<sandbox_detail> out;
    std::string token;
    for (int page = 0;; ++page) {
        if (page >= q.max_pages) {
            co_return make_error(errc::too_large, "E2B API GET /v2/sandboxes: more than " +
                                                      std::to_string(q.max_pages) +
                                                      " pages match: narrow the label filter");
        }
        call_spec c;
        c.method = "GET";
        c.path = "/v2/sandboxes";
        c.retries = retry_policy::idempotent;
        c.max_body_bytes = protocol::max_list_body_bytes;
        protocol::list_request request;
        request.metadata.assign(q.metadata.begin(), q.metadata.end());
        request.state = q.state;
        request.limit = static_cast<std::size_t>(q.page_limit);
        request.next_token = token;
        c.query = protocol::encode_list_request(request);
        auto reply = co_await send(s, c);
        if (!reply) co_return std::move(reply).error();
        if (reply->status() != 200) co_return error_for(*s, c, *reply);
        auto parsed = protocol::parse_sandbox_list(reply->body);
        if (!parsed) co_return s->redacted(std::move(parsed).error());
        for (auto& d : *parsed) out.push_back(std::move(d));
        const auto next = reply->head.headers.find("X-Next-Token");
        if (!next || next->empty()) co_return out;
        if (next->size() > 4096) {
            co_return make_error(errc::protocol_error,
                                 "E2B API GET /v2/sandboxes: X-Next-Token over 4096 bytes");
        }
        token = std::string(*next);
    }
}

// A call on one sandbox whose answer is success alone (setTimeout, updateNetwork): idempotent,
// as setting the same end or the same configuration twice is the same.
asio::awaitable<result<void>> put_on_sandbox(std::shared_ptr<state> s, std::string id,
                                             const char* method, const char* suffix,
                                             std::string body) {
    if (!protocol::is_valid_sandbox_id(id))
        co_return make_error(errc::sandbox_not_found, "no sandbox with that id");
    call_spec c;
    c.method = method;
    c.path = "/sandboxes/" + id + suffix;
    c.body = std::move(body);
    c.retries = retry_policy::idempotent;
    auto reply = co_await send(s, c);
    if (!reply) co_return std::move(reply).error();
    if (!is_success(reply->status())) co_return error_for(*s, c, *reply);
    co_return result<void>();
}

asio::awaitable<result<void>> set_timeout(std::shared_ptr<state> s, std::string id,
                                          std::int64_t timeout_s) {
    return put_on_sandbox(std::move(s), std::move(id), "POST", "/timeout",
                          protocol::encode_timeout_request(timeout_s));
}

asio::awaitable<result<void>> update_network(std::shared_ptr<state> s, std::string id,
                                             protocol::network_update_request body) {
    return put_on_sandbox(std::move(s), std::move(id), "PUT", "/network",
                          protocol::encode_network_update_request(body));
}

// `method` on /sandboxes/{id}`suffix`: true once done, false when the control plane answers
// `already` (the sandbox already is as asked).
asio::awaitable<result<bool>> act_on_sandbox(std::shared_ptr<state> s, std::string id,
                                             const char* method, const char* suffix, int already) {
    if (!protocol::is_valid_sandbox_id(id))
        co_return make_error(errc::sandbox_not_found, "no sandbox with that id");
    call_spec c;
    c.method = method;
    c.path = "/sandboxes/" + id + suffix;
    c.retries = retry_policy::idempotent;
    auto reply = co_await send(s, c);
    if (!reply) co_return std::move(reply).error();
    if (reply->status() == already) co_return false;
    if (!is_success(reply->status())) co_return error_for(*s, c, *reply);
    co_return true;
}

asio::awaitable<result<bool>> kill(std::shared_ptr<state> s, std::string id) {
    return act_on_sandbox(std::move(s), std::move(id), "DELETE", "", 404);
}

asio::awaitable<result<bool>> pause(std::shared_ptr<state> s, std::string id) {
    return act_on_sandbox(std::move(s), std::move(id), "POST", "/pause", 409);
}

asio::awaitable<result<void>> check(std::shared_ptr<state> s) {
    call_spec c;
    c.method = "GET";
    c.path = "/v2/sandboxes";
    c.query = "limit=1";
    c.retries = retry_policy::idempotent;
    c.max_body_bytes = protocol::max_list_body_bytes;
    auto listed = co_await send_parsed(s, c, is_ok, protocol::parse_sandbox_list);
    if (!listed) co_return std::move(listed).error();
    co_return result<void>();
}

}  // namespace

std::string create_json(const create_body& b, bool v1) {
    protocol::create_request r;
    r.template_id = b.template_id;
    r.timeout_s = b.timeout_s;
    r.metadata = b.metadata;
    r.env_vars = b.env_vars;
    r.allow_internet_access = b.allow_internet_access;
    if (!b.allow_out.empty() || !b.deny_out.empty()) {
        protocol::network_request network;
        network.allow_out = b.allow_out;
        network.deny_out = b.deny_out;
        r.network = std::move(network);
    }
    // v2 is always secured; v1 mints an access token only when asked.
    if (v1) r.secure = true;
    return protocol::encode_create_request(r);
}

control_plane_client::control_plane_client(std::shared_ptr<http::client> http,
                                           control_plane_options options)
    : state_(std::make_shared<state>()) {
    state_->http = std::move(http);
    while (!options.api_url.empty() && options.api_url.back() == '/') options.api_url.pop_back();
    state_->options = std::move(options);
}

control_plane_client::~control_plane_client() = default;

asio::awaitable<result<sandbox_reply>> control_plane_client::async_create(create_body body) {
    return create(state_, std::move(body));
}
asio::awaitable<result<sandbox_reply>> control_plane_client::async_connect(std::string id,
                                                                           std::int64_t timeout_s) {
    return connect(state_, std::move(id), timeout_s);
}
asio::awaitable<result<sandbox_detail>> control_plane_client::async_get(std::string id) {
    return get(state_, std::move(id));
}
asio::awaitable<result<std::vector<sandbox_detail>>> control_plane_client::async_list(
    list_query query) {
    return list(state_, std::move(query));
}
asio::awaitable<result<void>> control_plane_client::async_set_timeout(std::string id,
                                                                      std::int64_t timeout_s) {
    return set_timeout(state_, std::move(id), timeout_s);
}
asio::awaitable<result<void>> control_plane_client::async_update_network(
    std::string id, protocol::network_update_request body) {
    return update_network(state_, std::move(id), std::move(body));
}
asio::awaitable<result<bool>> control_plane_client::async_pause(std::string id) {
    return pause(state_, std::move(id));
}
asio::awaitable<result<bool>> control_plane_client::async_kill(std::string id) {
    return kill(state_, std::move(id));
}
asio::awaitable<result<void>> control_plane_client::async_check() {
    return check(state_);
}
std::uint64_t control_plane_client::requests_sent() const noexcept {
    return state_->sent;
}

}  // namespace moat::e2b
