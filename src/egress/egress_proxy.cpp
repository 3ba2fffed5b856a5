#include "egress/egress_proxy.hpp"

#include <moat/log.hpp>
#include <moat/task_group.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include "egress/host_addresses.hpp"
#include "egress/proxy_connection.hpp"
#include "egress/relay.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace moat::egress {

using internal::clock;
using internal::connection;
using internal::phase;
using internal::sandbox_entry;

namespace {

constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::size_t head_read_bytes = 4096;
constexpr std::size_t lingering_close_bytes = 256 * 1024;
// How often the buffered bytes of open connections are measured and published to the meter.
constexpr auto buffer_sample_interval = std::chrono::seconds(1);

std::string reply_text(int status, const std::string& line) {
    const std::string body = line + "\n";
    return "HTTP/1.1 " + std::to_string(status) + " " + status_phrase(status) +
           "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

std::string host_and_port(const std::string& host, std::uint16_t port) {
    if (port == 80 || port == 443) return host;
    return host + ":" + std::to_string(port);
}

// The addresses to check and connect to, or a refusal (status + line).
struct resolution {
    std::vector<asio::ip::address> addresses;
    int status = 0;
    std::string line;
};

}  // namespace

struct egress_proxy::impl {
    impl(asio::any_io_executor ex, event_sink s, resolver_options r)
        : executor(ex),
          sink(std::move(s)),
          tasks(ex, "egress proxy"),
          sampler(ex),
          resolver_limits(r),
          resolver(ex, std::move(r)) {}

    asio::any_io_executor executor;
    event_sink sink;
    task_group tasks;
    std::map<std::string, std::shared_ptr<sandbox_entry>, std::less<>> sandboxes;
    // Measures every sandbox's buffered bytes once per buffer_sample_interval while any has
    // connections open (publish_buffered), so the meters stay current for `moat inventory`.
    asio::steady_timer sampler;
    bool is_sampling = false;
    resolver_options resolver_limits;
    name_resolver resolver;  // every sandbox's lookups, each sandbox under its own limits

    void emit(const egress_event& event) {
        if (!sink) return;
        try {
            sink(event);
        } catch (const std::exception& e) {
            detail::log(log_level::warning, "egress", std::string("event sink threw: ") + e.what());
        }
    }
};

namespace {

// A connection's task may outlive the proxy (its destructor closes the connections, and the
// tasks end afterwards, when the executor runs them): it reaches the proxy through a weak
// reference, so an event of a proxy that is gone is dropped, never sent through freed memory.
void emit_to(const std::weak_ptr<egress_proxy::impl>& proxy, const egress_event& event) {
    if (auto live = proxy.lock()) live->emit(event);
}

// The reply and the lingering close that follows it end within `linger` (the head timeout
// unless the caller gives a shorter one).
asio::awaitable<void> send_refusal(std::shared_ptr<connection> c,
                                   std::weak_ptr<egress_proxy::impl> proxy, std::string host,
                                   std::uint16_t port, int status, std::string line,
                                   std::optional<std::chrono::milliseconds> linger = {}) {
    egress_event event;
    event.sandbox_id = c->sandbox->id;
    event.host = std::move(host);
    event.port = port;
    event.outcome = egress_outcome::refused;
    event.status = status;
    event.reason = line;
    emit_to(proxy, event);
    if (c->is_closed) co_return;
    c->current = phase::reply;
    c->arm(clock::now() + linger.value_or(c->sandbox->limits.head_timeout));
    const std::string text = reply_text(status, line);
    auto buffer = asio::buffer(text);
    auto [ec, n] = co_await asio::async_write(c->client, buffer, use_tuple);
    (void)ec;
    (void)n;
    // A lingering close: stop sending, then read and discard what the client still sends (up to
    // a cap, under the reply deadline) before closing. Closing with unread bytes queued would
    // send a reset, and the client could lose the reply (an oversized head is refused unread).
    std::error_code ignored;
    c->client.shutdown(asio::socket_base::shutdown_send, ignored);
    std::array<char, head_read_bytes> discard{};
    std::size_t drained = 0;
    while (!c->is_closed && drained < lingering_close_bytes) {
        auto discard_buffer = asio::buffer(discard);
        auto [read_error, got] = co_await c->client.async_read_some(discard_buffer, use_tuple);
        drained += got;
        if (read_error) break;
    }
    c->close("refused");
}

// The sandbox's --resolve table, else the proxy's resolver under the connection's deadline (the
// connect timer's expiry); close() and the deadline abort a pending lookup at once.
asio::awaitable<resolution> resolve(std::shared_ptr<connection> c,
                                    std::weak_ptr<egress_proxy::impl> proxy,
                                    const std::string& host) {
    resolution out;
    if (const auto* pinned = c->sandbox->policy.pinned(host)) {
        out.addresses = *pinned;
        co_return out;
    }
    const auto& limits = c->sandbox->limits;
    asio::awaitable<result<std::vector<asio::ip::address>>> lookup;
    resolver_options settings;
    if (auto live = proxy.lock()) {
        settings = live->resolver_limits;
        lookup =
            live->resolver.async_resolve(c->sandbox->id, host, deadline::at(c->timer.expiry()));
    } else {
        out.status = 502;
        out.line = "could not resolve " + host + " (the proxy is shutting down)";
        co_return out;
    }
    auto executor = c->client.get_executor();
    auto token = asio::bind_cancellation_slot(c->resolve_cancel.slot(), asio::use_awaitable);
    auto answer = co_await asio::co_spawn(executor, std::move(lookup), token);
    c->resolve_cancel.slot().clear();
    if (answer) {
        out.addresses = std::move(*answer);
    } else if (c->connect_timed_out || answer.error().code == errc::deadline_exceeded) {
        out.status = 504;
        out.line = "resolving " + host + " took longer than " +
                   std::to_string(limits.connect_timeout.count()) + " ms";
    } else if (answer.error().code == errc::limit_exceeded) {
        out.status = 429;
        out.line = "resolving " + host + ": this sandbox has " +
                   std::to_string(settings.max_waiting_per_key) +
                   " lookups waiting for one of its " +
                   std::to_string(settings.max_in_flight_per_key) + " running ones, its limit";
    } else {
        out.status = 502;
        out.line = answer.error().detail;  // "could not resolve HOST (why)"
    }
    co_return out;
}

// What the request's host is: an address to check, or a normalised name, or a refusal.
struct host_reading {
    std::optional<asio::ip::address> address;
    std::string name;  // normalised name, or the address as text
    int status = 0;
    std::string line;
};

host_reading read_host(const proxy_request& request) {
    host_reading out;
    if (request.host_is_ipv6_literal) {
        std::error_code ec;
        auto v6 = asio::ip::make_address_v6(request.host, ec);
        if (ec || request.host.find('%') != std::string::npos) {
            out.status = 400;
            out.line = "the request's IPv6 host is not an IPv6 address";
            return out;
        }
        out.address = asio::ip::address(v6);
        out.name = v6.to_string();
        return out;
    }
    if (looks_numeric(request.host)) {
        auto v4 = parse_numeric_ipv4(request.host);
        if (!v4) {
            out.status = 400;
            out.line = "the request's host looks numeric but is not an IPv4 address";
            return out;
        }
        out.address = asio::ip::address(*v4);
        out.name = v4->to_string();
        return out;
    }
    auto name = normalise_host_name(request.host, true);
    if (!name) {
        out.status = 400;
        out.line = "the request's host is not a valid host name";
        return out;
    }
    out.name = std::move(*name);
    return out;
}

// The refusal line when `address` is one of this host's own (host_addresses.hpp), as loopback is
// refused: unless an operator's --allow-address range covers it.
std::optional<std::string> host_address_refusal(const asio::ip::address& address,
                                                const host_reading& host,
                                                const network_policy& policy) {
    for (const auto& range : policy.allowed_ranges()) {
        if (range.contains(address)) return std::nullopt;
    }
    const auto verdict = check_host_address(address);
    if (verdict == host_address_verdict::elsewhere) return std::nullopt;
    const std::string what = verdict == host_address_verdict::this_host
                                 ? "an address of this host"
                                 : "an address this host could not check is not its own";
    if (host.address) return "host " + host.name + " is " + what;
    return host.name + " resolves to " + address.to_string() + ", " + what;
}

// Why `policy` refuses the request's host before any lookup, or nullopt. `named` is the host as
// the request spelled it (an address may be spelled otherwise: 0x7f.1).
std::optional<std::string> host_refusal(const host_reading& host, const std::string& named,
                                        std::uint16_t port, const network_policy& policy) {
    if (policy.mode() == network_mode::none) {
        return "host " + host_and_port(host.name, port) +
               " is refused: this sandbox's network access is off";
    }
    if (host.address) {
        if (auto refused = refusal_for(*host.address, policy.allowed_ranges())) {
            if (named == host.name) return "host " + host.name + " is " + describe(*refused);
            return "host " + named + " is " + host.name + ", " + describe(*refused);
        }
        if (policy.mode() != network_mode::all)
            return "host " + host.name + " is an IP address; this sandbox's allow-list names hosts";
        return std::nullopt;
    }
    if (!policy.allows_host(host.name, port))
        return "host " + host_and_port(host.name, port) + " is not on this sandbox's allow-list";
    return std::nullopt;
}

// Why `policy` refuses an address the host resolved to (or is), or nullopt.
std::optional<std::string> address_refusal(const asio::ip::address& address,
                                           const host_reading& host, const network_policy& policy) {
    if (auto refused = refusal_for(address, policy.allowed_ranges()))
        return host.name + " resolves to " + address.to_string() + ", " + describe(*refused);
    return host_address_refusal(address, host, policy);
}

// Why `policy` refuses the destination of a connection already past the checks, or nullopt:
// the request's checks again, and a name now pinned elsewhere than the addresses it reached.
std::optional<std::string> destination_refusal(const connection& c, const network_policy& policy) {
    host_reading host;
    host.address = c.host_address;
    host.name = c.host;
    if (auto line = host_refusal(host, host.name, c.port, policy)) return line;
    const auto* pinned = host.address ? nullptr : policy.pinned(host.name);
    for (const auto& address : c.addresses) {
        if (pinned && std::find(pinned->begin(), pinned->end(), address) == pinned->end())
            return host.name + " is now pinned to other addresses than " + address.to_string();
        if (auto line = address_refusal(address, host, policy)) return line;
    }
    return std::nullopt;
}

// Puts `policy` in force for the sandbox and closes what it no longer allows.
std::size_t apply_policy(sandbox_entry& sandbox, network_policy policy) {
    sandbox.policy = std::move(policy);
    std::vector<std::pair<connection*, std::string>> refused;
    for (auto* c : sandbox.connections) {
        if (!c->has_destination || c->is_closed) continue;
        if (auto line = destination_refusal(*c, sandbox.policy)) refused.emplace_back(c, *line);
    }
    for (auto& [c, line] : refused) c->close("policy changed: " + line);
    return refused.size();
}

// Asks the sandbox's policy_source for a newer policy and applies it.
void refresh_policy(sandbox_entry& sandbox) {
    if (!sandbox.source) return;
    std::optional<network_policy> newer;
    try {
        newer = sandbox.source();
    } catch (const std::exception& e) {
        detail::log(log_level::warning, "egress", std::string("policy source threw: ") + e.what(),
                    sandbox.id);
    }
    if (newer) apply_policy(sandbox, std::move(*newer));
}

asio::awaitable<void> run_connection(std::shared_ptr<connection> c,
                                     std::weak_ptr<egress_proxy::impl> proxy) {
    auto& limits = c->sandbox->limits;

    // 1. The request head, under its deadline and the caps.
    c->arm(clock::now() + limits.head_timeout);
    std::string buffered;
    std::array<char, head_read_bytes> chunk{};
    parse_outcome parsed;
    while (true) {
        parsed = parse_proxy_request(buffered, limits.caps);
        if (parsed.state != parse_outcome::state::incomplete) break;
        auto read_buffer = asio::buffer(chunk);
        auto [ec, n] = co_await c->client.async_read_some(read_buffer, use_tuple);
        buffered.append(chunk.data(), n);
        if (ec) {
            if (buffered.empty() || c->is_closed) {
                c->close(c->is_closed ? c->close_reason : "client left");
                co_return;
            }
            parsed = parse_proxy_request(buffered, limits.caps);
            if (parsed.state == parse_outcome::state::incomplete) {
                c->close("client left mid-request");
                co_return;
            }
            break;
        }
    }
    if (parsed.state == parse_outcome::state::refused) {
        co_await send_refusal(c, proxy, "", 0, parsed.status, parsed.reason);
        co_return;
    }
    const auto& request = parsed.request;

    // 2. The policy (the sandbox's current one): the host, then the byte budget.
    auto host = read_host(request);
    if (host.status != 0) {
        co_await send_refusal(c, proxy, "", request.port, host.status, host.line);
        co_return;
    }
    refresh_policy(*c->sandbox);
    // A reference: a policy changed from here on is the one the addresses meet below.
    const auto& policy = c->sandbox->policy;
    if (auto line = host_refusal(host, request.host, request.port, policy)) {
        co_await send_refusal(c, proxy, host.name, request.port, 403, std::move(*line));
        co_return;
    }
    c->has_destination = true;
    c->host = host.name;
    c->host_address = host.address;
    c->port = request.port;
    if (c->sandbox->meter->used() >= limits.max_bytes) {
        std::string line = "this sandbox's egress byte budget (" +
                           std::to_string(limits.max_bytes) + " bytes) is used up";
        co_await send_refusal(c, proxy, host.name, request.port, 403, std::move(line));
        co_return;
    }

    // 3. Resolve, check every address, connect to exactly the checked ones.
    c->current = phase::connect;
    c->arm(clock::now() + limits.connect_timeout);
    resolution resolved;
    if (host.address) {
        resolved.addresses.push_back(*host.address);
    } else {
        resolved = co_await resolve(c, proxy, host.name);
    }
    if (c->is_closed) co_return;
    if (resolved.status != 0) {
        co_await send_refusal(c, proxy, host.name, request.port, resolved.status, resolved.line);
        co_return;
    }
    for (const auto& address : resolved.addresses) {
        if (auto line = address_refusal(address, host, policy)) {
            co_await send_refusal(c, proxy, host.name, request.port, 403, std::move(*line));
            co_return;
        }
    }
    c->addresses = resolved.addresses;
    std::error_code connect_error = asio::error::host_not_found;
    for (const auto& address : resolved.addresses) {
        if (c->is_closed || c->connect_timed_out) break;
        std::error_code ignored;
        c->upstream.close(ignored);
        const asio::ip::tcp::endpoint endpoint(address, request.port);
        std::error_code opened;
        c->upstream.open(endpoint.protocol(), opened);
        if (opened) {
            connect_error = opened;
            continue;
        }
        // Before the connect, so the window it offers is sized by them.
        size_upstream(*c);
        auto [ec] = co_await c->upstream.async_connect(endpoint, use_tuple);
        connect_error = ec;
        if (!ec) break;
    }
    if (c->is_closed) co_return;
    if (connect_error || c->connect_timed_out) {
        std::string line;
        int status = 502;
        if (c->connect_timed_out) {
            status = 504;
            line = "connecting to " + host_and_port(host.name, request.port) +
                   " took longer than " + std::to_string(limits.connect_timeout.count()) + " ms";
        } else {
            line = "could not connect to " + host.name + ":" + std::to_string(request.port) + " (" +
                   connect_error.message() + ")";
        }
        co_await send_refusal(c, proxy, host.name, request.port, status, std::move(line));
        co_return;
    }

    // 4. Relay.
    egress_event allowed;
    allowed.sandbox_id = c->sandbox->id;
    allowed.host = host.name;
    allowed.port = request.port;
    allowed.outcome = egress_outcome::allowed;
    emit_to(proxy, allowed);

    c->current = phase::relay;
    c->last_activity = clock::now();
    c->arm(c->last_activity + limits.idle_timeout);
    std::string first;
    if (request.is_connect) {
        const std::string established = "HTTP/1.1 200 Connection established\r\n\r\n";
        auto buffer = asio::buffer(established);
        auto [ec, n] = co_await asio::async_write(c->client, buffer, use_tuple);
        (void)n;
        if (ec) c->close("client left");
    } else {
        first = request.upstream_head;
    }
    first.append(buffered, request.head_bytes);
    if (!c->is_closed && !first.empty() && charge(*c, first.size(), c->bytes_out)) {
        auto buffer = asio::buffer(first);
        auto [ec, n] = co_await asio::async_write(c->upstream, buffer, use_tuple);
        (void)n;
        if (ec) c->close("upstream left");
    }
    if (!c->is_closed) co_await relay(c);
    c->close(c->close_reason);

    egress_event closed;
    closed.sandbox_id = c->sandbox->id;
    closed.host = host.name;
    closed.port = request.port;
    closed.outcome = egress_outcome::closed;
    closed.reason = c->close_reason;
    closed.bytes_out = c->bytes_out;
    closed.bytes_in = c->bytes_in;
    emit_to(proxy, closed);
}

void sample_buffers_soon(const std::shared_ptr<egress_proxy::impl>& proxy) {
    if (proxy->is_sampling) return;
    proxy->is_sampling = true;
    proxy->sampler.expires_after(buffer_sample_interval);
    std::weak_ptr<egress_proxy::impl> weak = proxy;
    proxy->sampler.async_wait([weak](std::error_code ec) {
        auto live = weak.lock();
        if (!live) return;
        live->is_sampling = false;
        if (ec) return;
        bool any_open = false;
        for (auto& [id, sandbox] : live->sandboxes) {
            if (!sandbox->connections.empty()) refresh_policy(*sandbox);
            publish_buffered(*sandbox);
            any_open = any_open || !sandbox->connections.empty();
        }
        if (any_open) sample_buffers_soon(live);
    });
}

// A refusal past max_connections, counted in its sandbox's `refusing` while it runs (the count
// drops when the task ends or is destroyed).
asio::awaitable<void> refuse_at_door(std::shared_ptr<connection> c,
                                     std::weak_ptr<egress_proxy::impl> proxy, std::string line) {
    struct counted {
        std::shared_ptr<sandbox_entry> sandbox;
        ~counted() { --sandbox->refusing; }
    } count{c->sandbox};
    const auto& limits = c->sandbox->limits;
    const auto linger = std::min(limits.refusal_linger, limits.head_timeout);
    co_await send_refusal(c, proxy, "", 0, 429, std::move(line), linger);
}

}  // namespace

const char* to_string(egress_outcome outcome) noexcept {
    switch (outcome) {
        case egress_outcome::allowed:
            return "allowed";
        case egress_outcome::refused:
            return "refused";
        case egress_outcome::closed:
            return "closed";
    }
    return "unknown";
}

egress_proxy::egress_proxy(asio::any_io_executor executor, event_sink sink,
                           resolver_options resolver)
    : impl_(std::make_shared<impl>(executor, std::move(sink), std::move(resolver))) {
    if (const auto& why = impl_->resolver.startup_error(); !why.empty()) {
        detail::log(log_level::warning, "egress",
                    "the proxy's resolver did not start, every lookup will fail: " + why);
    }
}

egress_proxy::~egress_proxy() {
    for (auto& [id, sandbox] : impl_->sandboxes) {
        for (auto* c :
             std::vector<connection*>(sandbox->connections.begin(), sandbox->connections.end())) {
            c->close("proxy destroyed");
        }
        // This process's connections are gone: its share of the meter goes with them.
        sandbox->meter->add_buffered(-static_cast<std::int64_t>(sandbox->published_buffered));
    }
}

result<void> egress_proxy::add_sandbox(std::string sandbox_id, network_policy policy,
                                       egress_limits limits, std::shared_ptr<byte_meter> meter,
                                       policy_source source) {
    if (impl_->sandboxes.contains(sandbox_id)) {
        return make_error(errc::invalid_argument,
                          "sandbox " + sandbox_id + " already has an egress policy");
    }
    auto entry = std::make_shared<sandbox_entry>();
    entry->id = sandbox_id;
    entry->policy = std::move(policy);
    entry->source = std::move(source);
    entry->limits = limits;
    entry->meter = meter ? std::move(meter) : std::make_shared<byte_meter>();
    impl_->sandboxes.emplace(std::move(sandbox_id), std::move(entry));
    return {};
}

void egress_proxy::serve(std::string_view sandbox_id,
                         asio::generic::stream_protocol::socket socket) {
    auto it = impl_->sandboxes.find(sandbox_id);
    if (it == impl_->sandboxes.end()) {
        std::error_code ignored;
        socket.close(ignored);
        egress_event event;
        event.sandbox_id = std::string(sandbox_id);
        event.reason = "no egress policy for this sandbox";
        impl_->emit(event);
        return;
    }
    auto c = std::make_shared<connection>(it->second, std::move(socket));
    auto& sandbox = *it->second;
    const bool at_connection_limit = sandbox.connections.size() >= sandbox.limits.max_connections;
    std::uint64_t held = 0;
    const bool admitted = !at_connection_limit && allot(sandbox, *c, held);
    if (!admitted) {
        std::string line =
            at_connection_limit
                ? "this sandbox has " + std::to_string(sandbox.connections.size()) +
                      " proxied connections open, its limit"
                : "this sandbox's " + std::to_string(sandbox.connections.size()) +
                      " proxied connections hold " + std::to_string(held) +
                      " bytes of host buffers its programs have not read; another would pass "
                      "its limit of " +
                      std::to_string(sandbox.limits.max_buffered_bytes);
        if (sandbox.refusing >= sandbox.limits.max_refusing) {
            // Already answering as many refusals as it may: this one is closed unanswered.
            c->close("refused");
            egress_event event;
            event.sandbox_id = sandbox.id;
            event.outcome = egress_outcome::refused;
            event.reason = line + "; closed unanswered";
            impl_->emit(event);
            return;
        }
        ++it->second->refusing;
        impl_->tasks.spawn(refuse_at_door(std::move(c), impl_, std::move(line)));
        return;
    }
    // Registered now, not when the task first runs, so the limit counts it at once.
    sandbox.connections.insert(c.get());
    impl_->tasks.spawn(run_connection(std::move(c), impl_));
    sample_buffers_soon(impl_);
}

result<std::size_t> egress_proxy::set_policy(std::string_view sandbox_id, network_policy policy) {
    auto it = impl_->sandboxes.find(sandbox_id);
    if (it == impl_->sandboxes.end()) {
        return make_error(errc::sandbox_not_found,
                          "sandbox " + std::string(sandbox_id) + " has no egress policy here");
    }
    return apply_policy(*it->second, std::move(policy));
}

std::size_t egress_proxy::close_sandbox(std::string_view sandbox_id) {
    auto it = impl_->sandboxes.find(sandbox_id);
    if (it == impl_->sandboxes.end()) return 0;
    auto sandbox = it->second;
    impl_->sandboxes.erase(it);
    sandbox->is_closed = true;
    const std::vector<connection*> open(sandbox->connections.begin(), sandbox->connections.end());
    for (auto* c : open) c->close("sandbox closed");
    sandbox->meter->add_buffered(-static_cast<std::int64_t>(sandbox->published_buffered));
    sandbox->published_buffered = 0;
    return open.size();
}

std::optional<egress_sandbox_stats> egress_proxy::stats(std::string_view sandbox_id) const {
    auto it = impl_->sandboxes.find(sandbox_id);
    if (it == impl_->sandboxes.end()) return std::nullopt;
    auto& sandbox = *it->second;
    egress_sandbox_stats out;
    out.active_connections = sandbox.connections.size();
    out.bytes_used = sandbox.meter->used();
    out.refusing_connections = sandbox.refusing;
    out.buffered_bytes = publish_buffered(sandbox);
    return out;
}

asio::awaitable<void> egress_proxy::async_shutdown() {
    std::vector<std::string> ids;
    for (const auto& [id, sandbox] : impl_->sandboxes) ids.push_back(id);
    for (const auto& id : ids) close_sandbox(id);
    impl_->sampler.cancel();
    co_await impl_->tasks.async_wait_all();
}

}  // namespace moat::egress
