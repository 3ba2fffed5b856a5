// moat::deadline: a point in time by which an operation must complete, computed once where a
// request enters and passed down, so that nested steps share one budget instead of each adding
// its own timeout.
//
// A caller's deadline is per-operation cancellation (docs/cancellation.md): when it passes, the
// operation stops its work (killing a process it started) and completes with
// errc::deadline_exceeded. It is unrelated to a program's wall limit, which is part of the
// request and whose outcome is data in the result.
#pragma once

#include <chrono>

namespace moat {

class deadline {
  public:
    using clock = std::chrono::steady_clock;

    // No deadline.
    constexpr deadline() noexcept = default;
    static constexpr deadline never() noexcept { return deadline{}; }
    // `d` from now, saturating: a duration past what the clock can hold from now (hours::max(),
    // a ten-digit count of seconds from a request header) is a deadline that never comes; zero or
    // a negative duration, however large, is a deadline that has already passed (now). Any
    // duration type: the range check happens before the conversion to clock::duration, which
    // would itself overflow.
    template <class Rep, class Period>
    static deadline after(std::chrono::duration<Rep, Period> d) noexcept {
        const auto now = clock::now();
        if (d <= d.zero()) return deadline{now};
        // Compared in long double (64-bit mantissa on x86-64: every int64 count is exact).
        using wide = std::chrono::duration<long double, clock::period>;
        const wide room = clock::time_point::max() - now;
        if (wide(d) >= room) return never();
        return deadline{now + std::chrono::duration_cast<clock::duration>(d)};
    }
    static constexpr deadline at(clock::time_point t) noexcept { return deadline{t}; }

    constexpr bool is_never() const noexcept { return at_ == clock::time_point::max(); }
    constexpr clock::time_point when() const noexcept { return at_; }
    bool has_expired() const noexcept { return !is_never() && clock::now() >= at_; }

    // Time left, never negative; clock::duration::max() for a deadline that never comes.
    clock::duration remaining() const noexcept {
        if (is_never()) return clock::duration::max();
        const auto left = at_ - clock::now();
        return left > clock::duration::zero() ? left : clock::duration::zero();
    }

    friend constexpr bool operator==(deadline a, deadline b) noexcept = default;

  private:
    constexpr explicit deadline(clock::time_point t) noexcept : at_(t) {}
    clock::time_point at_ = clock::time_point::max();
};

// The earlier of two deadlines.
constexpr deadline earliest(deadline a, deadline b) noexcept {
    return a.when() < b.when() ? a : b;
}

}  // namespace moat
