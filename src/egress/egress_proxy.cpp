#include "egress/egress_proxy.hpp"

#include <moat/log.hpp>
#include <moat/task_group.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include "core/unique_fd.hpp"
#include "egress/host_addresses.hpp"

#include <fcntl.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace moat::egress {

namespace {

using clock = std::chrono::steady_clock;
constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::size_t relay_chunk_bytes = 1024 * 1024;
constexpr std::size_t head_read_bytes = 4096;
constexpr std::size_t lingering_close_bytes = 256 * 1024;
// How often the buffered bytes of open connections are measured and published to the meter.
constexpr auto buffer_sample_interval = std::chrono::seconds(1);

struct sandbox_entry {
    std::string id;
    network_policy policy;
    egress_limits limits;
    std::shared_ptr<byte_meter> meter;
    std::uint64_t published_buffered = 0;  // this proxy's share of meter->buffered()
    bool is_closed = false;
    std::set<struct connection*> connections;
    std::size_t refusing = 0;  // door refusals in flight (not in `connections`)
};

enum class phase { head, connect, relay, reply };

// One direction's pipe for splice(2).
struct relay_pipe {
    unique_fd read_end;
    unique_fd write_end;
};

struct connection : std::enable_shared_from_this<connection> {
    connection(std::shared_ptr<sandbox_entry> owner, asio::generic::stream_protocol::socket socket)
        : sandbox(std::move(owner)),
          client(std::move(socket)),
          upstream(client.get_executor()),
          timer(client.get_executor()) {}
    // Registered by serve() for close_sandbox() and the connection limit, for as long as it lives
    // (a task destroyed before it ran included); the others' shares grow back when it goes.
    ~connection();
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    std::shared_ptr<sandbox_entry> sandbox;
    asio::generic::stream_protocol::socket client;
    asio::ip::tcp::socket upstream;
    asio::cancellation_signal resolve_cancel;  // aborts a pending lookup (close, deadline)
    asio::steady_timer timer;
    phase current = phase::head;
    clock::time_point last_activity = clock::now();
    bool is_closed = false;
    bool connect_timed_out = false;
    std::string close_reason = "done";
    std::uint64_t bytes_out = 0;
    std::uint64_t bytes_in = 0;
    relay_pipe to_upstream;
    relay_pipe to_sandbox;
    // Its share of the sandbox's max_buffered_bytes (see allot()): the most its sockets and pipes
    // can hold, both directions stalled.
    std::uint64_t allotment = 0;
    bool client_fixed = false;  // its buffers were set: autotuning is off for good
    bool upstream_fixed = false;

    void close(std::string reason) {
        if (is_closed) return;
        is_closed = true;
        close_reason = std::move(reason);
        std::error_code ignored;
        client.close(ignored);
        upstream.close(ignored);
        resolve_cancel.emit(asio::cancellation_type::terminal);
        timer.cancel();
    }

    // One timer per connection: the head and reply deadlines close it, the connect deadline
    // aborts the attempt (the client still gets its 504), idleness closes a relay.
    void arm(clock::time_point when) {
        timer.expires_at(when);
        std::weak_ptr<connection> weak = weak_from_this();
        timer.async_wait([weak](std::error_code ec) {
            if (ec) return;
            if (auto self = weak.lock()) self->on_deadline();
        });
    }

    void on_deadline() {
        if (is_closed) return;
        if (current == phase::connect) {
            connect_timed_out = true;
            std::error_code ignored;
            resolve_cancel.emit(asio::cancellation_type::terminal);
            upstream.close(ignored);
        } else if (current == phase::relay) {
            const auto idle_until = last_activity + sandbox->limits.idle_timeout;
            if (clock::now() < idle_until) {
                arm(idle_until);
                return;
            }
            close("idle");
        } else {
            close(current == phase::head ? "request head timeout" : "reply timeout");
        }
    }
};

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

// The host memory a socket holds: its receive queue and its send queue as the kernel counts them
// (with their bookkeeping overhead), 0 for a closed one.
std::uint64_t socket_memory(int fd) {
    if (fd < 0) return 0;
    std::uint32_t info[SK_MEMINFO_VARS] = {};
    socklen_t length = sizeof info;
    if (::getsockopt(fd, SOL_SOCKET, SO_MEMINFO, info, &length) != 0) return 0;
    return std::uint64_t{info[SK_MEMINFO_RMEM_ALLOC]} + info[SK_MEMINFO_WMEM_QUEUED];
}

std::uint64_t pipe_bytes(const relay_pipe& pipe) {
    int n = 0;
    if (!pipe.read_end.is_open() || ::ioctl(pipe.read_end.get(), FIONREAD, &n) != 0 || n < 0)
        return 0;
    return static_cast<std::uint64_t>(n);
}

std::uint64_t buffered_bytes(connection& c) {
    return socket_memory(c.client.native_handle()) + socket_memory(c.upstream.native_handle()) +
           pipe_bytes(c.to_upstream) + pipe_bytes(c.to_sandbox);
}

// Measures what the sandbox's connections hold and publishes the change to its meter.
std::uint64_t publish_buffered(sandbox_entry& sandbox) {
    std::uint64_t total = 0;
    for (auto* c : sandbox.connections) total += buffered_bytes(*c);
    sandbox.meter->add_buffered(static_cast<std::int64_t>(total) -
                                static_cast<std::int64_t>(sandbox.published_buffered));
    sandbox.published_buffered = total;
    return total;
}

// ---- Host memory: each connection's share of max_buffered_bytes --------------------------------
//
// A connection with allotment A gets: its upstream socket A/8 (size_upstream: a window clamp
// while it has the whole of max_connection_buffer_bytes), its sandbox-side socket A/16 (SO_RCVBUF
// and SO_SNDBUF; it keeps autotuning while that covers its namespace's maximum), the kernel
// counting up to twice each number, and each pipe A/8 (rounded down to a power of two): with both
// directions stalled its queues hold at most 2*2*A/8 + 2*2*A/16 + 2*A/8 = A. The sandbox's
// allotments never add up to more than max_buffered_bytes: a new connection's target is
// max_buffered_bytes / (connections open, it included), within [min_connection_buffer_bytes,
// max_connection_buffer_bytes], and every open one moves to that target too, but never below what
// it holds now (queued bytes cannot be taken back, so a stalled connection keeps its share until it
// drains). When the total would pass the cap the new connection gets 429. A lone download gets
// max_connection_buffer_bytes; 32 connections that keep reading get 512 KiB each; a sandbox whose
// tunnels stall is refused new ones once they hold its cap.

// SO_RCVBUF / SO_SNDBUF past net.core.rmem_max / wmem_max where the process may (the FORCE options
// need CAP_NET_ADMIN), else up to them: best effort, a socket the kernel refuses keeps its own.
void set_buffer_sizes(int fd, std::uint64_t bytes) {
    if (fd < 0) return;
    const int size = static_cast<int>(std::min<std::uint64_t>(bytes, 1u << 30));
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
        (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
        (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

// The upstream socket. At its full allotment (a lone connection) what it receives is bounded by
// the window it may offer (TCP_WINDOW_CLAMP: what arrives unread stays under about the clamp,
// twice that as the kernel counts it), which leaves the kernel's receive autotuning in place: a
// fixed SO_RCVBUF costs a fast download a few percent. A clamp is not enforced at once when it
// shrinks (a window already offered is honoured), so a connection whose allotment shrinks gets
// fixed buffers too, for good. What it sends always gets a fixed SO_SNDBUF.
void size_upstream(connection& c) {
    const int fd = c.upstream.native_handle();
    if (fd < 0) return;
    const std::uint64_t bytes = c.allotment / 8;
    if (c.allotment < c.sandbox->limits.max_connection_buffer_bytes || c.upstream_fixed) {
        c.upstream_fixed = true;
        set_buffer_sizes(fd, bytes);
        return;
    }
    const int size = static_cast<int>(std::min<std::uint64_t>(bytes, 1u << 30));
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_WINDOW_CLAMP, &size, sizeof size);
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
        (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

int pipe_size_for(std::uint64_t allotment) {
    return static_cast<int>(std::bit_floor(std::max<std::uint64_t>(allotment / 8, 4096)));
}

// A pipe's capacity: best effort (a pipe holding more than the new size keeps its size).
void set_pipe_size(const relay_pipe& pipe, std::uint64_t allotment) {
    if (pipe.write_end.is_open())
        (void)::fcntl(pipe.write_end.get(), F_SETPIPE_SZ, pipe_size_for(allotment));
}

void apply_allotment(connection& c, std::uint64_t allotment) {
    c.allotment = allotment;
    // The sandbox-side socket keeps the kernel's autotuning while its part of the allotment (up
    // to twice A/16 each way) covers what autotuning can reach in the sandbox's namespace:
    // fixed buffers cost a fast relay a few percent. Once fixed it stays fixed (the kernel
    // cannot be handed autotuning back).
    const auto autotune = c.sandbox->limits.sandbox_autotune_bytes;
    const bool covered = autotune != 0 && allotment / 8 >= autotune;
    if (!covered || c.client_fixed) {
        c.client_fixed = true;
        set_buffer_sizes(c.client.native_handle(), allotment / 16);
    }
    size_upstream(c);
    set_pipe_size(c.to_upstream, allotment);
    set_pipe_size(c.to_sandbox, allotment);
}

// What each connection of `sandbox` should get with `open` of them (the new one included).
std::uint64_t target_allotment(const egress_limits& limits, std::size_t open) {
    const std::uint64_t even = limits.max_buffered_bytes / std::max<std::size_t>(open, 1);
    return std::clamp(
        even, limits.min_connection_buffer_bytes,
        std::max(limits.min_connection_buffer_bytes, limits.max_connection_buffer_bytes));
}

// Admits a new connection's share: true (and every open connection moved to the new target, or
// kept at what it holds) when the sandbox's allotments stay within max_buffered_bytes; false
// (nothing changed) when they would not. `held_now` receives what the open ones hold.
bool allot(sandbox_entry& sandbox, connection& incoming, std::uint64_t& held_now) {
    const auto target = target_allotment(sandbox.limits, sandbox.connections.size() + 1);
    std::uint64_t total = target;
    held_now = 0;
    std::vector<std::pair<connection*, std::uint64_t>> moved;
    for (auto* c : sandbox.connections) {
        const std::uint64_t held = buffered_bytes(*c);
        held_now += held;
        const std::uint64_t next = std::max(target, held);
        total += next;
        moved.emplace_back(c, next);
    }
    if (total > sandbox.limits.max_buffered_bytes) return false;
    for (auto& [c, next] : moved) {
        if (next != c->allotment) apply_allotment(*c, next);
    }
    apply_allotment(incoming, target);
    return true;
}

// After a connection went: the others grow back to the even share.
void regrow(sandbox_entry& sandbox) {
    if (sandbox.connections.empty()) return;
    const auto target = target_allotment(sandbox.limits, sandbox.connections.size());
    for (auto* c : sandbox.connections) {
        if (c->allotment < target) apply_allotment(*c, target);
    }
}

connection::~connection() {
    sandbox->connections.erase(this);
    regrow(*sandbox);
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

// Counts `n` bytes against the connection's sandbox; false (the connection closed) when they
// would pass its byte budget.
bool charge(connection& c, std::size_t n, std::uint64_t& counter) {
    auto& sandbox = *c.sandbox;
    if (!sandbox.meter->try_charge(n, sandbox.limits.max_bytes)) {
        c.close("byte budget");
        return false;
    }
    counter += n;
    c.last_activity = clock::now();
    return true;
}

// One direction of a relay through a pipe with splice(2): the kernel moves the pages from one
// socket to the other, nothing is copied through this process. Each step is non-blocking and
// waits for readiness on the executor. The sandbox's byte budget is charged before bytes leave
// the pipe: a direction forwards at most what is left of it, and one byte past it closes the
// connection. A descriptor splice refuses closes the connection ("reset").
template <class From, class To>
asio::awaitable<void> pump(std::shared_ptr<connection> c, From& from, To& to, relay_pipe& pipe,
                           std::uint64_t& counter) {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0) {
        c->close("reset");
        co_return;
    }
    pipe.read_end.reset(ends[0]);
    pipe.write_end.reset(ends[1]);
    const int pipe_out = ends[0];
    const int pipe_in = ends[1];
    set_pipe_size(pipe, c->allotment);
    std::error_code ec;
    from.native_non_blocking(true, ec);
    if (!ec) to.native_non_blocking(true, ec);
    if (ec) {
        c->close("reset");
        co_return;
    }
    while (!c->is_closed) {
        auto& sandbox = *c->sandbox;
        const std::uint64_t used = sandbox.meter->used();
        const std::uint64_t left =
            used < sandbox.limits.max_bytes ? sandbox.limits.max_bytes - used : 0;
        // At the budget, one more byte in shows the connection would pass it.
        const std::size_t want =
            left == 0 ? 1
                      : static_cast<std::size_t>(std::min<std::uint64_t>(relay_chunk_bytes, left));
        const ssize_t in = ::splice(from.native_handle(), nullptr, pipe_in, nullptr, want,
                                    SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (in < 0 && errno == EINTR) continue;
        if (in < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            auto [wait_error] = co_await from.async_wait(asio::socket_base::wait_read, use_tuple);
            if (wait_error) {
                c->close(wait_error == asio::error::operation_aborted ? c->close_reason : "reset");
                co_return;
            }
            continue;
        }
        if (in < 0) {
            c->close("reset");
            co_return;
        }
        if (in == 0) {  // the sender is done: pass the end on
            std::error_code ignored;
            to.shutdown(asio::socket_base::shutdown_send, ignored);
            co_return;
        }
        if (!charge(*c, static_cast<std::size_t>(in), counter)) co_return;
        std::size_t pending = static_cast<std::size_t>(in);
        while (pending > 0 && !c->is_closed) {
            const ssize_t out = ::splice(pipe_out, nullptr, to.native_handle(), nullptr, pending,
                                         SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (out < 0 && errno == EINTR) continue;
            if (out < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                auto [wait_error] =
                    co_await to.async_wait(asio::socket_base::wait_write, use_tuple);
                if (wait_error) {
                    c->close(wait_error == asio::error::operation_aborted ? c->close_reason
                                                                          : "write failed");
                    co_return;
                }
                continue;
            }
            if (out <= 0) {
                c->close("write failed");
                co_return;
            }
            pending -= static_cast<std::size_t>(out);
            c->last_activity = clock::now();
        }
    }
    co_return;
}

asio::awaitable<void> relay(std::shared_ptr<connection> c) {
    using namespace asio::experimental::awaitable_operators;
    auto up = pump(c, c->client, c->upstream, c->to_upstream, c->bytes_out);
    auto down = pump(c, c->upstream, c->client, c->to_sandbox, c->bytes_in);
    auto both = std::move(up) && std::move(down);
    co_await std::move(both);
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

    // 2. The policy: the host, then the byte budget.
    auto host = read_host(request);
    if (host.status != 0) {
        co_await send_refusal(c, proxy, "", request.port, host.status, host.line);
        co_return;
    }
    const auto& policy = c->sandbox->policy;
    if (host.address) {
        if (auto refused = refusal_for(*host.address, policy.allowed_ranges())) {
            std::string line =
                "host " + request.host + " is " + host.name + ", " + describe(*refused);
            if (request.host == host.name) line = "host " + host.name + " is " + describe(*refused);
            co_await send_refusal(c, proxy, host.name, request.port, 403, std::move(line));
            co_return;
        }
        if (policy.mode() != network_mode::all) {
            std::string line =
                "host " + host.name + " is an IP address; this sandbox's allow-list names hosts";
            co_await send_refusal(c, proxy, host.name, request.port, 403, std::move(line));
            co_return;
        }
    } else if (!policy.allows_host(host.name, request.port)) {
        std::string line = "host " + host_and_port(host.name, request.port) +
                           " is not on this sandbox's allow-list";
        co_await send_refusal(c, proxy, host.name, request.port, 403, std::move(line));
        co_return;
    }
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
        if (auto refused = refusal_for(address, policy.allowed_ranges())) {
            std::string line =
                host.name + " resolves to " + address.to_string() + ", " + describe(*refused);
            co_await send_refusal(c, proxy, host.name, request.port, 403, std::move(line));
            co_return;
        }
        if (auto line = host_address_refusal(address, host, policy)) {
            co_await send_refusal(c, proxy, host.name, request.port, 403, std::move(*line));
            co_return;
        }
    }
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
                                       egress_limits limits, std::shared_ptr<byte_meter> meter) {
    if (impl_->sandboxes.contains(sandbox_id)) {
        return make_error(errc::invalid_argument,
                          "sandbox " + sandbox_id + " already has an egress policy");
    }
    auto entry = std::make_shared<sandbox_entry>();
    entry->id = sandbox_id;
    entry->policy = std::move(policy);
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
