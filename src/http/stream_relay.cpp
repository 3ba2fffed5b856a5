#include "http/stream_relay.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include "core/asio_compat.hpp"

#include <array>
#include <memory>
#include <vector>

namespace moat::http {
namespace {

using clock = std::chrono::steady_clock;

struct relay_state {
    relay_state(stream& first, stream& second, relay_options o) : a(first), b(second), options(o) {}
    stream& a;
    stream& b;
    relay_options options;
    clock::time_point last_activity = clock::now();
    relay_totals totals;
    bool closed = false;

    void close_both() noexcept {
        closed = true;
        a.close();
        b.close();
    }
};

asio::awaitable<void> pump(relay_state& s, stream& from, stream& to, std::uint64_t& moved,
                           std::string_view first) {
    if (!first.empty()) {
        const std::array<asio::const_buffer, 1> pieces{asio::buffer(first.data(), first.size())};
        auto [error, n] = co_await to.async_write(pieces);
        if (error) co_return s.close_both();
        moved += n;
    }
    std::vector<char> buffer(s.options.buffer_bytes);
    for (;;) {
        auto [read_error, n] = co_await from.async_read_some(asio::buffer(buffer));
        if (read_error) {
            // A clean end of one direction: pass it on and let the other direction finish.
            if (read_error == asio::error::eof && !s.closed) {
                co_await to.async_shutdown();
                co_return;
            }
            co_return s.close_both();
        }
        s.last_activity = clock::now();
        const std::array<asio::const_buffer, 1> pieces{asio::buffer(buffer.data(), n)};
        auto [write_error, written] = co_await to.async_write(pieces);
        if (write_error) co_return s.close_both();
        moved += written;
        s.last_activity = clock::now();
    }
}

// Closes both streams once neither direction moved a byte for the idle limit; ends when the
// pumps end (cancelled by the operator below).
asio::awaitable<void> watch_idle(relay_state& s) {
    if (s.options.idle_timeout.count() <= 0) {
        // No limit: wait for the cancellation that comes when the pumps end.
        asio::steady_timer forever(co_await asio::this_coro::executor, clock::time_point::max());
        co_await forever.async_wait(as_tuple(asio::use_awaitable));
        co_return;
    }
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (;;) {
        const auto due = s.last_activity + s.options.idle_timeout;
        if (clock::now() >= due) {
            s.totals.idle = true;
            co_return s.close_both();
        }
        timer.expires_at(due);
        auto [error] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
        if (error) co_return;  // the pumps ended
    }
}

}  // namespace

asio::awaitable<relay_totals> async_relay(stream& a, stream& b, relay_options options,
                                          std::string_view a_first) {
    using namespace asio::experimental::awaitable_operators;
    if (options.buffer_bytes == 0) options.buffer_bytes = 64 * 1024;
    relay_state s{a, b, options};
    auto forward = pump(s, a, b, s.totals.a_to_b, a_first);
    auto back = pump(s, b, a, s.totals.b_to_a, {});
    auto both = std::move(forward) && std::move(back);
    auto watched = std::move(both) || watch_idle(s);
    co_await std::move(watched);
    a.close();
    b.close();
    co_return s.totals;
}

}  // namespace moat::http
