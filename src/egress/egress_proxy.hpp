// The host side of sandbox egress: a forward proxy that serves connections on behalf of
// sandboxes, each under its own network_policy and limits.
//
// A connection arrives as any connected stream socket (loopback TCP in tests; the end of the
// unix socket or socketpair bridged from inside the sandbox's network namespace later) and is
// handed to serve() with the id of the sandbox it belongs to. The proxy reads one request
// (proxy_request.hpp), checks the host against the sandbox's allow-list, resolves it itself (the
// sandbox's --resolve table first, else the proxy's one name_resolver: c-ares, every sandbox's
// lookups concurrently, each sandbox under its own lookup limits, so one sandbox's hung lookups
// never delay another's), checks every address the name resolves to (address_policy.hpp: any
// refused address refuses the request), connects to exactly the addresses it checked, and then
// relays bytes both ways until both sides are done.
// A refusal is an HTTP reply with one line saying why ("host example.com is not on this
// sandbox's allow-list"), then the connection closes.
//
// Bounds per sandbox (egress_limits): concurrent connections and the host memory they buffer (the
// next one gets 429), bytes relayed in both directions over the sandbox's life (a connection that
// passes the budget is closed, later ones get 403), idle time of a relayed connection, time to send
// the request head, time to resolve and connect (504), and lookups at once (resolver_options: past
// max_in_flight_per_key running and max_waiting_per_key waiting, the next request gets 429). Every
// decision is an egress_event through the sink given at construction: the sandbox id, host, port,
// outcome and byte counts, never request content.
//
// Confined to its executor: construct it, call every member, and run the sink there (give a
// strand if the io_context runs on several threads). It never blocks the executor: every step
// is asynchronous, name resolution included. Call async_shutdown() before destroying it.
#pragma once

#include "egress/byte_meter.hpp"
#include "egress/name_resolver.hpp"
#include "egress/network_policy.hpp"
#include "egress/proxy_request.hpp"

#include <moat/result.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/generic/stream_protocol.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace moat::egress {

struct egress_limits {
    std::size_t max_connections = 32;
    std::uint64_t max_bytes = std::uint64_t{4} << 30;
    std::chrono::milliseconds idle_timeout{std::chrono::seconds(120)};
    std::chrono::milliseconds head_timeout{std::chrono::seconds(10)};
    std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};  // resolve + connect
    // A connection past max_connections gets its 429 within refusal_linger (the reply, then a
    // short lingering close), and at most max_refusing of them are answered at once: past that
    // one is closed at once, unanswered, so a sandbox that floods the proxy holds at most
    // max_connections + max_refusing of the host's descriptors.
    std::size_t max_refusing = 8;
    std::chrono::milliseconds refusal_linger{std::chrono::seconds(1)};
    // Host memory. The sandbox's connections share max_buffered_bytes: each gets an allotment,
    // the most its socket buffers and pipes can hold with both directions stalled (fixed
    // SO_RCVBUF / SO_SNDBUF instead of the kernel's autotuning, which let one stalled tunnel hold
    // several MiB; a connection with the whole max_connection_buffer_bytes keeps autotuning where
    // a window clamp or its namespace's maximum bounds it; a direction stops reading its source
    // while its destination is full). A new
    // connection's allotment is max_buffered_bytes over the connections open, within
    // [min_connection_buffer_bytes, max_connection_buffer_bytes]; the open ones move to it too,
    // never below what they hold. If the allotments would pass max_buffered_bytes (the sandbox's
    // tunnels hold what it may), the new connection gets 429. A lone download gets
    // max_connection_buffer_bytes (its upstream socket 1 MiB: about 1 MiB per round trip on a
    // long path); 32 connections get 512 KiB each.
    std::uint64_t max_buffered_bytes = std::uint64_t{16} << 20;
    std::uint64_t max_connection_buffer_bytes = std::uint64_t{8} << 20;
    std::uint64_t min_connection_buffer_bytes = 256 * 1024;
    // How far the kernel's autotuning grows a socket in the sandbox's network namespace (the
    // local backend sets its tcp_rmem and tcp_wmem maximum to 1 MiB): a sandbox-side socket whose
    // allotment covers it keeps autotuning. 0: unknown, always fixed.
    std::uint64_t sandbox_autotune_bytes = 1024 * 1024;
    request_caps caps;
};

enum class egress_outcome {
    allowed,  // the proxy connected and starts relaying
    refused,  // the request got a 4xx/5xx reply (reason says why)
    closed,  // a relayed connection ended (reason: "done", "idle", "byte budget", "sandbox closed")
};

const char* to_string(egress_outcome outcome) noexcept;

struct egress_event {
    std::string sandbox_id;
    std::string host;  // normalised; empty when the request was malformed
    std::uint16_t port = 0;
    egress_outcome outcome = egress_outcome::refused;
    int status = 0;               // refused: the HTTP status sent
    std::string reason;           // refused: the line sent; closed: why it ended
    std::uint64_t bytes_out = 0;  // sandbox to upstream (closed only)
    std::uint64_t bytes_in = 0;   // upstream to sandbox (closed only)
};

struct egress_sandbox_stats {
    std::size_t active_connections = 0;
    std::uint64_t bytes_used = 0;          // over the sandbox's life (its byte_meter)
    std::size_t refusing_connections = 0;  // past max_connections, being answered 429
    // What its connections hold in host memory now: the proxy's sockets' receive and send
    // queues as the kernel counts them (SO_MEMINFO) plus the bytes in their pipes.
    std::uint64_t buffered_bytes = 0;
};

class egress_proxy {
  public:
    using event_sink = std::function<void(const egress_event&)>;

    // `resolver`: the DNS servers, timeouts and per-sandbox lookup limits (name_resolver.hpp).
    egress_proxy(asio::any_io_executor executor, event_sink sink, resolver_options resolver = {});
    egress_proxy(const egress_proxy&) = delete;
    egress_proxy& operator=(const egress_proxy&) = delete;
    ~egress_proxy();

    // Where a sandbox's policy may change outside this proxy (the local backend: the sandbox's
    // record, which any process may update): called on the proxy's executor before each request
    // of the sandbox is checked and about once a second while it has connections open; returns
    // the policy when it changed since the last call, else nullopt. Keep it cheap (a stat).
    using policy_source = std::function<std::optional<network_policy>()>;

    // Registers a sandbox. invalid_argument if the id is already registered. `meter` counts its
    // bytes against limits.max_bytes and publishes what its connections buffer (byte_meter.hpp:
    // give the sandbox's shared one so that every process serving it charges one budget); none:
    // a count of this proxy's own. `source`: see policy_source; none, the policy changes only
    // through set_policy.
    result<void> add_sandbox(std::string sandbox_id, network_policy policy, egress_limits limits,
                             std::shared_ptr<byte_meter> meter = nullptr,
                             policy_source source = {});

    // Replaces the sandbox's policy (a policy_source's newer one takes the same path). Requests
    // checked from now on meet the new policy; a connection already past the check (resolving,
    // connecting or relaying) whose destination the new one refuses (its host, or an address it
    // resolved to, checked exactly as a new request's) is closed at once, reason "policy
    // changed: <the refusal line>". Mode none refuses every request. Returns how many
    // connections closed; sandbox_not_found if the sandbox is not registered.
    result<std::size_t> set_policy(std::string_view sandbox_id, network_policy policy);

    // Serves one connection for `sandbox_id` (returns at once; the connection runs on the
    // proxy's executor). A connection for an unknown or closed sandbox is closed unanswered and
    // reported as refused.
    void serve(std::string_view sandbox_id, asio::generic::stream_protocol::socket socket);

    // Closes every connection of the sandbox at once (both sockets, pending resolution and
    // connects) and forgets the sandbox. Returns how many connections were closed.
    std::size_t close_sandbox(std::string_view sandbox_id);

    std::optional<egress_sandbox_stats> stats(std::string_view sandbox_id) const;

    // Closes every sandbox's connections and completes when every connection task has ended.
    // Cancellation: none (it only waits for tasks already told to stop).
    asio::awaitable<void> async_shutdown();

    struct impl;  // implementation detail

  private:
    std::shared_ptr<impl> impl_;
};

}  // namespace moat::egress
