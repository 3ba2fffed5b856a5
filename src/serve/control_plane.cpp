#include "serve/control_plane.hpp"

#include <moat/log.hpp>

#include "e2b_protocol/sandbox_replies.hpp"
#include "serve/sandbox_listing.hpp"
#include "serve/sandbox_metrics.hpp"
#include "serve/sandbox_network.hpp"
#include "serve/sandbox_pause.hpp"
#include "serve/sandbox_templates.hpp"
#include "serve/server_secret.hpp"

#include <algorithm>
#include <charconv>
#include <tuple>
#include <utility>

namespace moat::serve {

std::string sandbox_not_found_message(std::string_view id) {
    return "Sandbox \"" + std::string(id) + "\" doesn't exist or you don't have access to it";
}

struct control_plane::state {
    state(serve_context& c, http::server_options o)
        : context(c), server(c.executor, std::move(o)) {}
    serve_context& context;
    http::server server;
    std::size_t creating = 0;  // creates in flight (counted against --max-sandboxes)
};

namespace {

namespace protocol = e2b_protocol;
using protocol::create_request;
using system_clock = std::chrono::system_clock;
using state = control_plane::state;

enum class api_version { v1, v2 };

struct control_call {
    state& s;
    http::server_request& request;
    http::server_response& response;
};

using control_handler = asio::awaitable<void> (*)(control_call&);

// The routes other files answer over the server's context (sandbox_metrics.hpp).
template <asio::awaitable<void> (*answer)(serve_context&, http::server_request&,
                                          http::server_response&)>
asio::awaitable<void> in_context(control_call& call) {
    co_await answer(call.s.context, call.request, call.response);
}

asio::awaitable<void> send_json(http::server_response& response, int status, std::string body) {
    http::header_list headers;
    headers.add("Content-Type", "application/json");
    (void)co_await response.async_send(status, std::move(headers), std::move(body));
}

asio::awaitable<void> send_no_content(http::server_response& response) {
    http::header_list headers;
    std::string empty;
    (void)co_await response.async_send(204, std::move(headers), std::move(empty));
}

asio::awaitable<void> send_error(http::server_response& response, int status, std::string message) {
    (void)co_await response.async_send_error(status, message);
}

// The status E2B would answer for a moat error.
int status_for(const error& e) {
    if (e.code == errc::invalid_argument || e.code == errc::invalid_path) return 400;
    if (e.code == errc::limit_exceeded || e.code == errc::rate_limited) return 429;
    if (e.code == errc::sandbox_not_found) return 404;
    if (e.code == errc::shutting_down || e.code == errc::sandbox_unavailable ||
        e.code == errc::store_unavailable)
        return 503;
    return 500;
}

// What a client is told of a failure: `what` and the error, except for a server-side failure
// (500), whose detail may name this host's paths or state: the client gets its code, the log the
// whole of it.
// An error's code alone ("backend_failure"), for a reply that must not carry its detail.
std::string code_name(const error& e) {
    if (e.code.category() == error_category()) return to_string(static_cast<errc>(e.code.value()));
    return e.code.message();
}

std::string client_message(std::string_view what, const error& e) {
    if (status_for(e) != 500) return std::string(what) + ": " + e.to_string();
    detail::log(log_level::warning, "serve", std::string(what) + ": " + e.to_string());
    return std::string(what) + ": " + code_name(e) + " (the server's log has the detail)";
}

std::string sandbox_reply_of(const registry_entry& e, const std::string& domain) {
    protocol::sandbox_reply r;
    r.sandbox_id = e.id;
    r.template_id = e.template_id;
    r.alias = e.template_id;
    r.client_id = protocol::e2b_client_id;
    r.envd_version = reported_envd_version;
    r.envd_access_token = e.access_token;
    r.traffic_access_token = e.traffic_token;
    r.domain = domain;
    return protocol::encode_sandbox_reply(r);
}

// A ListedSandbox, and with `detail` a SandboxDetail (the token, the network).
protocol::sandbox_detail detail_of(const registry_entry& e, bool detail,
                                   const std::string& domain) {
    const auto limits = e.handle->info().limits.with_defaults();
    const auto mib = [](std::uint64_t bytes) {
        return static_cast<std::int64_t>(bytes / (1024 * 1024));
    };
    protocol::sandbox_detail d;
    d.template_id = e.template_id;
    d.alias = e.template_id;
    d.sandbox_id = e.id;
    d.client_id = protocol::e2b_client_id;
    d.started_at = e.started_at;
    d.end_at = e.end_at;
    d.cpu_count =
        std::max<std::int64_t>(1, static_cast<std::int64_t>((*limits.cpu_millicores + 999) / 1000));
    d.memory_mb = std::max<std::int64_t>(128, mib(*limits.memory_bytes));
    d.disk_size_mb = mib(*limits.workspace_bytes);
    d.state = e.paused ? "paused" : "running";
    d.envd_version = reported_envd_version;
    d.metadata = e.metadata;
    if (!detail) return d;
    d.on_timeout = e.auto_pause ? "pause" : "kill";
    d.auto_resume = e.auto_resume;
    d.envd_access_token = e.access_token;
    d.domain = domain;
    d.allow_public_traffic = !e.private_ports;
    if (!e.mask_request_host.empty()) d.mask_request_host = e.mask_request_host;
    // The sandbox's effective egress, as E2B spells it: an allow-list is the switch on, every
    // address denied, the names allowed past that deny.
    const auto& network = e.handle->info().network;
    d.allow_internet_access = network.mode != network_mode::none;
    if (network.mode == network_mode::allow_list) {
        d.allow_out = network.allow_hosts;
        d.deny_out = {"0.0.0.0/0"};
    }
    return d;
}

}  // namespace

namespace {

// A request the parser refused: 400 with the parser's detail.
asio::awaitable<void> send_bad_request(http::server_response& response, const error& e) {
    std::string message = e.detail;
    co_await send_error(response, 400, std::move(message));
}

// The whole request body, parsed by `parse`; when either fails the 400 is sent and nothing is
// returned.
template <class Parsed>
asio::awaitable<std::optional<Parsed>> parsed_body_or_400(
    control_call& call, result<Parsed> (*parse)(std::string_view)) {
    auto body = co_await call.request.async_read_body();
    if (!body) {
        std::string message = "cannot read the request: " + body.error().detail;
        co_await send_error(call.response, 400, std::move(message));
        co_return std::nullopt;
    }
    auto parsed = parse(*body);
    if (!parsed) {
        co_await send_bad_request(call.response, parsed.error());
        co_return std::nullopt;
    }
    co_return std::move(*parsed);
}

// A moat error as the status E2B would answer, its text as the message.
asio::awaitable<void> send_failure(http::server_response& response, const error& e) {
    std::string message = e.to_string();
    co_await send_error(response, status_for(e), std::move(message));
}

// Moves the sandbox's end to `ttl` from now (shorter or longer) and records it. Through the
// backend, not the handle: the handle's queue would hold it behind a streaming command.
asio::awaitable<result<void>> set_end(backend& sandboxes, registry_entry& e,
                                      std::chrono::milliseconds ttl) {
    if (ttl < std::chrono::milliseconds(1)) ttl = std::chrono::milliseconds(1);
    std::string id = e.id;
    // An autoPause sandbox's moat TTL runs its grace longer (sandbox_pause.hpp); a paused one's
    // end stays its paused lifetime's (the TTL is what it resumes with).
    const std::chrono::milliseconds grace = e.auto_pause ? auto_pause_grace : ttl.zero();
    auto extended = co_await sandboxes.async_extend_ttl(std::move(id), ttl + grace);
    if (!extended) co_return std::move(extended).error();
    e.end_at = extended->expires_at - (e.paused ? ttl.zero() : grace);
    co_return result<void>();
}

// Extends only: a shorter wish never shortens the end.
asio::awaitable<result<void>> extend_to(backend& sandboxes, registry_entry& e,
                                        std::chrono::seconds ttl) {
    const auto wanted = system_clock::now() + ttl;
    if (wanted <= e.end_at) co_return result<void>();
    const auto as_ms = std::chrono::duration_cast<std::chrono::milliseconds>(ttl);
    co_return co_await set_end(sandboxes, e, as_ms);
}

// ---- create ------------------------------------------------------------------------------------

// Keeps the in-flight create count while a create runs, whatever way it ends.
struct creating_guard {
    explicit creating_guard(std::size_t& n) : count(n) { ++count; }
    ~creating_guard() { --count; }
    creating_guard(const creating_guard&) = delete;
    creating_guard& operator=(const creating_guard&) = delete;
    std::size_t& count;
};

asio::awaitable<void> create(control_call& call, api_version version) {
    auto& context = call.s.context;
    auto parsed = co_await parsed_body_or_400(call, protocol::parse_create_request);
    if (!parsed) co_return;
    if (parsed->template_id.empty()) parsed->template_id = "base";
    const auto template_name = template_for(context, parsed->template_id);
    if (!template_name) {
        std::string message = "template '" + parsed->template_id.substr(0, 80) +
                              "' not found: moat serve has 'base' (which code-interpreter-v1 "
                              "names too) and the templates of its data directory (moat template "
                              "ls)";
        co_await send_error(call.response, 400, std::move(message));
        co_return;
    }
    const std::size_t cap = context.options.max_sandboxes;
    if (cap > 0 && context.registry.live_count() + call.s.creating >= cap) {
        std::string message = "this moat serve runs at most " + std::to_string(cap) +
                              " sandboxes at once (--max-sandboxes): kill one first";
        co_await send_error(call.response, 429, std::move(message));
        co_return;
    }
    std::int64_t timeout_s = version == api_version::v2 ? 300 : 15;
    if (parsed->timeout_s) timeout_s = *parsed->timeout_s;
    if (timeout_s <= 0) {
        std::string message = "Timeout must be greater than 0";
        co_await send_error(call.response, 400, std::move(message));
        co_return;
    }
    sandbox_spec spec;
    spec.template_name = *template_name;
    spec.labels = context.registry.scope_labels();
    spec.env = parsed->env_vars;
    // E2B's sandboxes run commands as `user` in /home/user (its SDK assumes both).
    spec.layout.user = "user";
    spec.layout.home = "/home/user";
    spec.layout.workdir = "/home/user";
    const bool auto_pause = parsed->auto_pause;
    spec.ttl = std::chrono::seconds(timeout_s);
    if (auto_pause) spec.ttl += auto_pause_grace;
    spec.survive_owner = true;
    // sudo works, as on E2B (its sandboxes' user may sudo without a password).
    spec.allow_sudo = true;
    // The operator's policy, narrowed by the request (never widened).
    auto network = narrow_network(context.options.network, *parsed);
    if (!network) {
        std::string message = network.error().detail;
        co_await send_error(call.response, 400, std::move(message));
        co_return;
    }
    spec.network = std::move(*network);
    const auto started = system_clock::now();
    creating_guard guard(call.s.creating);
    auto created = co_await context.sandboxes.async_create(std::move(spec));
    if (!created) {
        const int status = status_for(created.error());
        std::string message = client_message("cannot create the sandbox", created.error());
        co_await send_error(call.response, status, std::move(message));
        co_return;
    }
    auto entry = std::make_shared<registry_entry>(context.executor);
    entry->id = (*created)->id();
    entry->handle = *created;
    entry->template_id = parsed->template_id;
    entry->metadata = std::move(parsed->metadata);
    entry->env_vars = std::move(parsed->env_vars);
    entry->started_at = started;
    entry->end_at = (*created)->info().expires_at;
    set_lifecycle(*entry, auto_pause, parsed->auto_resume.value_or(false),
                  std::chrono::seconds(timeout_s));
    // Ports are public unless the request or the operator's default says otherwise (E2B's default
    // is public).
    std::optional<bool> public_traffic;
    if (parsed->network) {
        public_traffic = parsed->network->allow_public_traffic;
        entry->mask_request_host = parsed->network->mask_request_host.value_or("");
    }
    entry->private_ports = !public_traffic.value_or(!context.options.private_ports);
    auto added = context.registry.add(entry);
    if (!added) {
        (void)co_await entry->handle->async_destroy();
        std::string message = client_message("cannot record the sandbox", added.error());
        co_await send_error(call.response, 500, std::move(message));
        co_return;
    }
    std::string reply = sandbox_reply_of(*entry, call.s.context.options.domain);
    co_await send_json(call.response, 201, std::move(reply));
}

asio::awaitable<void> create_v1(control_call& call) {
    co_await create(call, api_version::v1);
}
asio::awaitable<void> create_v2(control_call& call) {
    co_await create(call, api_version::v2);
}

// ---- one sandbox -------------------------------------------------------------------------------

// The live entry the path names, or null after answering 404.
asio::awaitable<std::shared_ptr<registry_entry>> find_or_404(control_call& call) {
    const std::string id(call.request.param("id"));
    auto entry = call.s.context.registry.find(id);
    if (!entry) {
        std::string message = sandbox_not_found_message(id);
        co_await send_error(call.response, 404, std::move(message));
    }
    co_return entry;
}

asio::awaitable<void> get_sandbox(control_call& call) {
    auto entry = co_await find_or_404(call);
    if (!entry) co_return;
    std::string body =
        protocol::encode_sandbox_detail(detail_of(*entry, true, call.s.context.options.domain));
    co_await send_json(call.response, 200, std::move(body));
}

// The sandbox stays this server's until its destroy is confirmed (sandbox_registry::async_destroy):
// a failed one answers 500 and keeps it listed and counted, so that a retried DELETE tries again.
asio::awaitable<void> kill_sandbox(control_call& call) {
    auto entry = co_await find_or_404(call);
    if (!entry) co_return;
    auto& sandboxes = call.s.context.sandboxes.get_backend();
    auto destroyed = co_await call.s.context.registry.async_destroy(entry, sandboxes);
    if (!destroyed) {
        // The backend's detail is logged (by the registry), not sent: it may name host paths.
        const std::string why = code_name(destroyed.error());
        std::string message = "the sandbox " + entry->id + " was not confirmed destroyed (" + why +
                              "): it is kept, listed and counted, and DELETE tries again";
        co_await send_error(call.response, 500, std::move(message));
        co_return;
    }
    co_await send_no_content(call.response);
}

// Moves the sandbox's end (set: to `ttl` from now, either way; otherwise only ever later) and, on
// failure, answers with it: false then.
asio::awaitable<bool> move_end_or_fail(control_call& call, registry_entry& e,
                                       std::chrono::milliseconds ttl, bool set) {
    auto& sandboxes = call.s.context.sandboxes.get_backend();
    result<void> moved;
    if (set) {
        moved = co_await set_end(sandboxes, e, ttl);
    } else {
        const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(ttl);
        moved = co_await extend_to(sandboxes, e, seconds);
    }
    if (moved) co_return true;
    co_await send_failure(call.response, moved.error());
    co_return false;
}

// The sandbox the path names (else 404), the body parsed (else 400) and the sandbox's end moved
// (set: to `ttl_of` the body from now; otherwise only ever later) (else the failure, answered):
// the entry once moved, null once answered. setTimeout, refreshes and connect.
template <class Parsed>
asio::awaitable<std::shared_ptr<registry_entry>> move_end_by_body(
    control_call& call, result<Parsed> (*parse)(std::string_view),
    std::chrono::seconds (*ttl_of)(const Parsed&), bool set) {
    auto entry = co_await find_or_404(call);
    if (!entry) co_return nullptr;
    auto parsed = co_await parsed_body_or_400(call, parse);
    if (!parsed) co_return nullptr;
    const std::chrono::milliseconds ttl = ttl_of(*parsed);
    const bool moved = co_await move_end_or_fail(call, *entry, ttl, set);
    if (!moved) co_return nullptr;
    co_return entry;
}

std::chrono::seconds timeout_ttl(const std::int64_t& seconds) {
    return std::chrono::seconds(seconds);
}

// Refreshes: 15 s when the duration is absent, and never less.
std::chrono::seconds refresh_ttl(const std::optional<std::int64_t>& duration) {
    return std::chrono::seconds(std::max<std::int64_t>(15, duration.value_or(15)));
}

// Connect: 300 s when the timeout is absent.
std::chrono::seconds connect_ttl(const std::optional<std::int64_t>& timeout) {
    return std::chrono::seconds(timeout.value_or(300));
}

asio::awaitable<void> set_timeout(control_call& call) {
    auto entry =
        co_await move_end_by_body(call, protocol::parse_timeout_request, timeout_ttl, true);
    if (entry) co_await send_no_content(call.response);
}

asio::awaitable<void> refresh(control_call& call) {
    auto entry =
        co_await move_end_by_body(call, protocol::parse_refresh_request, refresh_ttl, false);
    if (entry) co_await send_no_content(call.response);
}

// A paused sandbox is resumed (201) with its end `ttl_of` the body from now; E2B's resume
// (deprecated) answers 409 for one that runs.
template <class Parsed>
asio::awaitable<void> resume_paused(control_call& call, std::shared_ptr<registry_entry> entry,
                                    result<Parsed> (*parse)(std::string_view),
                                    std::chrono::seconds (*ttl_of)(const Parsed&)) {
    auto parsed = co_await parsed_body_or_400(call, parse);
    if (!parsed) co_return;
    const std::chrono::milliseconds ttl = ttl_of(*parsed);
    auto resumed = co_await resume_entry(call.s.context, entry, ttl);
    if (!resumed) {
        co_await send_failure(call.response, resumed.error());
        co_return;
    }
    std::string reply = sandbox_reply_of(*entry, call.s.context.options.domain);
    co_await send_json(call.response, 201, std::move(reply));
}

// Resume: 15 s when the timeout is absent.
std::chrono::seconds resume_ttl(const std::optional<std::int64_t>& timeout) {
    return std::chrono::seconds(timeout.value_or(15));
}

asio::awaitable<void> connect(control_call& call) {
    auto found = co_await find_or_404(call);
    if (!found) co_return;
    if (found->paused) {
        co_await resume_paused(call, found, protocol::parse_connect_request, connect_ttl);
        co_return;
    }
    auto entry =
        co_await move_end_by_body(call, protocol::parse_connect_request, connect_ttl, false);
    if (!entry) co_return;
    std::string reply = sandbox_reply_of(*entry, call.s.context.options.domain);
    co_await send_json(call.response, 200, std::move(reply));
}

asio::awaitable<void> resume(control_call& call) {
    auto entry = co_await find_or_404(call);
    if (!entry) co_return;
    if (!entry->paused) {
        std::string message = "Sandbox " + entry->id + " is already running";
        co_await send_error(call.response, 409, std::move(message));
        co_return;
    }
    co_await resume_paused(call, entry, protocol::parse_connect_request, resume_ttl);
}

asio::awaitable<void> pause(control_call& call) {
    auto entry = co_await find_or_404(call);
    if (!entry) co_return;
    if (entry->paused) {
        std::string message = "Sandbox " + entry->id + " is already paused";
        co_await send_error(call.response, 409, std::move(message));
        co_return;
    }
    auto paused = co_await pause_entry(call.s.context, entry);
    if (!paused) {
        co_await send_failure(call.response, paused.error());
        co_return;
    }
    co_await send_no_content(call.response);
}

// ---- list (sandbox_listing.hpp picks the page) ------------------------------------------------

asio::awaitable<void> list(control_call& call, bool paged) {
    auto q = parse_list_query(call.request.query(), paged);
    if (!q) {
        co_await send_bad_request(call.response, q.error());
        co_return;
    }
    const auto page = select_page(call.s.context.registry.live(), *q, paged);
    std::vector<protocol::sandbox_detail> listed;
    for (const auto& e : page.entries)
        listed.push_back(detail_of(*e, false, call.s.context.options.domain));
    http::header_list headers;
    headers.add("Content-Type", "application/json");
    if (paged && q->running) headers.add("X-Total-Running", std::to_string(page.total));
    if (page.next_token) headers.add("X-Next-Token", *page.next_token);
    std::string body = protocol::encode_sandbox_list(listed);
    (void)co_await call.response.async_send(200, std::move(headers), std::move(body));
}

asio::awaitable<void> list_v1(control_call& call) {
    co_await list(call, false);
}
asio::awaitable<void> list_v2(control_call& call) {
    co_await list(call, true);
}

// ---- the rest ----------------------------------------------------------------------------------

asio::awaitable<void> health(control_call& call) {
    http::header_list headers;
    headers.add("Content-Type", "application/json");
    std::string body = "\"Health check successful\"";
    (void)co_await call.response.async_send(200, std::move(headers), std::move(body));
}

asio::awaitable<void> unsupported(control_call& call) {
    const std::string what =
        std::string(call.request.method()) + " " + std::string(call.request.path());
    std::string message = what +
                          " is not supported by moat serve (no snapshots, template builds or "
                          "volumes)";
    co_await send_error(call.response, 501, std::move(message));
}

// The same 501 for one sandbox: an id this server does not hold is 404 first, as E2B answers.
asio::awaitable<void> unsupported_for_sandbox(control_call& call) {
    auto entry = co_await find_or_404(call);
    if (!entry) co_return;
    co_await unsupported(call);
}

bool key_matches(const http::server_request& request, const std::string& key) {
    const auto sent = request.headers().find("X-API-Key");
    return sent && !key.empty() && constant_time_equals(*sent, key);
}

asio::awaitable<void> handle_control(state* s, control_handler run, bool needs_key,
                                     http::server_request& request,
                                     http::server_response& response) {
    if (needs_key && !key_matches(request, s->context.options.api_key)) {
        std::string message = "Invalid API key: send the server's key in X-API-Key";
        co_await send_error(response, 401, std::move(message));
        co_return;
    }
    if (needs_key) request.mark_authenticated();
    control_call call{*s, request, response};
    co_await run(call);
}

struct route_spec {
    const char* method;
    const char* path;
    control_handler run;
};

constexpr route_spec routes[] = {
    {"POST", "/v2/sandboxes", create_v2},
    {"POST", "/sandboxes", create_v1},
    {"GET", "/v2/sandboxes", list_v2},
    {"GET", "/sandboxes", list_v1},
    // Before /sandboxes/{id}, which "metrics" would match otherwise.
    {"GET", "/sandboxes/metrics", in_context<answer_sandboxes_metrics>},
    {"GET", "/sandboxes/{id}", get_sandbox},
    {"DELETE", "/sandboxes/{id}", kill_sandbox},
    {"POST", "/sandboxes/{id}/timeout", set_timeout},
    {"POST", "/sandboxes/{id}/refreshes", refresh},
    {"POST", "/sandboxes/{id}/connect", connect},
    {"POST", "/v2/sandboxes/{id}/connect", connect},
    {"POST", "/sandboxes/{id}/pause", pause},
    {"POST", "/sandboxes/{id}/resume", resume},
    // What moat serve does not implement: a JSON 501 naming the endpoint.
    {"POST", "/sandboxes/{id}/snapshots", unsupported_for_sandbox},
    {"GET", "/snapshots", unsupported},
    {"DELETE", "/snapshots/{id}", unsupported},
    {"POST", "/sandboxes/{id}/fork", unsupported_for_sandbox},
    {"GET", "/sandboxes/{id}/metrics", in_context<answer_sandbox_metrics>},
    {"GET", "/sandboxes/{id}/logs", unsupported},
    {"GET", "/v2/sandboxes/{id}/logs", unsupported},
    {"PUT", "/sandboxes/{id}/network", in_context<answer_update_network>},
    {"GET", "/templates", unsupported},
    {"POST", "/templates", unsupported},
    {"GET", "/templates/{id}", unsupported},
    {"POST", "/templates/{id}", unsupported},
    {"DELETE", "/templates/{id}", unsupported},
    {"PATCH", "/templates/{id}", unsupported},
    {"POST", "/v2/templates", unsupported},
    {"POST", "/v3/templates", unsupported},
    {"GET", "/templates/{id}/builds/{build}/status", unsupported},
    {"POST", "/templates/{id}/builds/{build}", unsupported},
    {"POST", "/v2/templates/{id}/builds/{build}", unsupported},
    {"GET", "/templates/{id}/files/{hash}", unsupported},
    {"GET", "/templates/aliases/{alias}", unsupported},
    {"GET", "/volumes", unsupported},
    {"POST", "/volumes", unsupported},
    {"GET", "/volumes/{id}", unsupported},
    {"DELETE", "/volumes/{id}", unsupported},
};

}  // namespace

control_plane::control_plane(serve_context& context, http::server_options options) {
    auto owned = std::make_shared<state>(context, std::move(options));
    auto* s = owned.get();  // the server (and its handlers) live inside the state
    http::route_options body_cap;
    body_cap.max_body_bytes = protocol::max_request_body_bytes;
    const auto add = [&](const char* method, const char* path, control_handler run,
                         bool needs_key) {
        http::handler h = [s, run, needs_key](http::server_request& request,
                                              http::server_response& response) {
            return handle_control(s, run, needs_key, request, response);
        };
        auto added = s->server.route(method, path, std::move(h), body_cap);
        if (!added) detail::log(log_level::error, "serve", added.error().to_string());
    };
    add("GET", "/health", health, false);
    for (const auto& r : routes) add(r.method, r.path, r.run, true);
    hold(std::move(owned));
}

}  // namespace moat::serve
