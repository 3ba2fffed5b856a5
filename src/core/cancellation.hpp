// The one Asio 1.22 rule that shapes every cleanup path: once a coroutine's cancellation state is
// set, its next co_await throws (even with as_tuple, and even when awaiting another coroutine).
// Only the this_coro awaitables are exempt. A cancellation can also arrive after an operation
// completed but before the coroutine resumed. So code that must clean up checks the state and
// clears it in place, with this idiom (a helper coroutine cannot do it: awaiting it would throw):
//
//     if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
//         co_await asio::this_coro::reset_cancellation_state();
//         ... clean up, then complete with errc::cancelled
//     }
#pragma once

#include <asio/cancellation_state.hpp>
#include <asio/this_coro.hpp>

namespace moat {

inline bool is_cancelled(const asio::cancellation_state& state) noexcept {
    return state.cancelled() != asio::cancellation_type::none;
}

}  // namespace moat
