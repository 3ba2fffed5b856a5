// Waiting for a descriptor to become readable or writable, bounded by a deadline.
#pragma once

#include <moat/deadline.hpp>

#include <asio/awaitable.hpp>
#include <asio/posix/stream_descriptor.hpp>

namespace moat {

enum class wait_result { ready, deadline_passed, cancelled };

// Waits until `descriptor` (or `other`, when given) is ready for `what` or `limit` passes.
// Cancellation: terminal; reports `cancelled` with the coroutine's cancellation state reset (the
// caller cleans up and completes with errc::cancelled).
asio::awaitable<wait_result> async_wait_until(asio::posix::stream_descriptor& descriptor,
                                              asio::posix::descriptor_base::wait_type what,
                                              deadline limit,
                                              asio::posix::stream_descriptor* other = nullptr);

}  // namespace moat
