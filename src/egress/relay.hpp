// A proxied connection's relay and the host memory it may hold (see egress_limits).
//
// Host memory: each connection of a sandbox has an allotment of the sandbox's max_buffered_bytes
// (allot() when it arrives, regrow() when another goes), which sizes its socket buffers and pipes;
// buffered_bytes() measures what it holds, publish_buffered() a sandbox's total into its meter.
// The relay: two pumps, one per direction, through pipes with splice(2), charging the sandbox's
// byte budget before bytes are passed on.
#pragma once

#include "egress/proxy_connection.hpp"

#include <asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace moat::egress::internal {

// What one connection holds in host memory now: its sockets' queues as the kernel counts them
// (SO_MEMINFO) plus the bytes in its pipes.
std::uint64_t buffered_bytes(connection& c);

// Measures what the sandbox's connections hold and publishes the change to its meter.
std::uint64_t publish_buffered(sandbox_entry& sandbox);

// Admits `incoming`'s allotment: true (and every open connection moved to the new target, never
// below what it holds) when the sandbox's allotments stay within max_buffered_bytes; false
// (nothing changed) otherwise. `held_now` receives what the open connections hold.
bool allot(sandbox_entry& sandbox, connection& incoming, std::uint64_t& held_now);

// Sizes the upstream socket for the connection's allotment (call once it is open, before the
// connect, so the window it offers is sized by it).
void size_upstream(connection& c);

// Counts `n` bytes against the connection's sandbox; false (the connection closed) when they
// would pass its byte budget.
bool charge(connection& c, std::size_t n, std::uint64_t& counter);

// Relays bytes both ways until both directions are done or the connection closes.
asio::awaitable<void> relay(std::shared_ptr<connection> c);

}  // namespace moat::egress::internal
