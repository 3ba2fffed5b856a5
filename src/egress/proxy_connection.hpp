// The egress proxy's own parts, shared by its translation units (egress_proxy.cpp: the
// requests, the policy and the proxy's members; relay.cpp: the relay and its host memory): one
// sandbox's entry and one proxied connection. Not part of the proxy's interface.
#pragma once

#include "core/unique_fd.hpp"
#include "egress/byte_meter.hpp"
#include "egress/egress_proxy.hpp"

#include <asio/cancellation_signal.hpp>
#include <asio/generic/stream_protocol.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace moat::egress::internal {

using clock = std::chrono::steady_clock;

struct sandbox_entry {
    std::string id;
    network_policy policy;
    egress_proxy::policy_source source;  // where a newer policy comes from, if anywhere
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
    // Its destination once the policy let it through (phase connect or relay), so a changed
    // policy can be checked against it: the host as the request named it (normalised; the
    // address's text for an IP literal), the port, and the addresses checked (after resolving).
    bool has_destination = false;
    std::string host;
    std::optional<asio::ip::address> host_address;
    std::uint16_t port = 0;
    std::vector<asio::ip::address> addresses;
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

}  // namespace moat::egress::internal
