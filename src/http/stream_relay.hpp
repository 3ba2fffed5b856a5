// Relays bytes both ways between two byte streams (stream.hpp: plain TCP or TLS) until both
// directions are done: what a forwarded port is once it is connected (`moat port-forward`, a
// handle's loopback forward, `moat serve`'s port hosts after the request head).
//
// Each direction reads into a buffer of its own and writes it out before reading again, so the
// relay holds at most two buffers however fast one side sends and the other reads: a side that
// stops reading stops the other side's sends (TCP backpressure). When a side ends its sending
// (EOF), the other side's sending is shut down and the opposite direction goes on (a half-close,
// as HTTP/1.0 clients and `nc -q` use it). A failed read or write, the idle limit or close()
// closes both streams at once.
#pragma once

#include "http/stream.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moat::http {

struct relay_options {
    // Closes both streams when neither direction moved a byte for this long; zero: no limit.
    std::chrono::milliseconds idle_timeout{15 * 60 * 1000};
    // Each direction's buffer.
    std::size_t buffer_bytes = 64 * 1024;
};

struct relay_totals {
    std::uint64_t a_to_b = 0;
    std::uint64_t b_to_a = 0;
    bool idle = false;  // ended by the idle limit
};

// Relays until both directions ended or failed; both streams are closed on return. `a_first`
// is sent to b before anything read from a (bytes a caller read ahead of the relay, such as
// the start of a request body behind its head). Cancellation: both streams are closed and the
// relay returns.
asio::awaitable<relay_totals> async_relay(stream& a, stream& b, relay_options options,
                                          std::string_view a_first = {});

}  // namespace moat::http
