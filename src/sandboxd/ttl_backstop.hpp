// The helper's TTL backstop (helper.cpp): when the helper ends a sandbox whose pid 1 did not end
// it at its TTL (pid 1 stopped or stuck). Pure arithmetic on clock readings, unit-tested
// (tests/sandboxd_units_test.cpp), so that what a clock step does to it is checked without
// stepping the host's clock.
//
// The backstop counts on CLOCK_BOOTTIME, never on the wall clock: a wall clock stepped forward
// (by hand, or NTP correcting a bad clock) must not end sandboxes early, nor one stepped back keep
// them past their TTL. BOOTTIME rather than MONOTONIC because BOOTTIME also counts the time a
// suspended host slept: a TTL is a lifetime in real time, and the expiry moat records, shows and
// acts on (sandbox_info::expires_at, the janitor, the session manager) is a wall-clock time that
// passes while the host sleeps; a sandbox must not outlive it by the length of a suspend. (pid 1
// counts its TTL on CLOCK_MONOTONIC; after a suspend the backstop is what ends the sandbox.)
//
// Records keep the wall-clock expiry (for people and other processes; async_extend_ttl rewrites
// it from whichever process extended the TTL). The helper converts a recorded expiry to BOOTTIME
// at the boundary, see recorded_backstop_at.
#pragma once

#include <cstdint>

namespace moat::sandboxd {

// How long after its TTL a sandbox's pid 1 has to end it before the helper does.
inline constexpr std::uint64_t backstop_grace_ms = 1000;

// CLOCK_BOOTTIME and CLOCK_REALTIME (Unix), in ms, read one right after the other.
struct clock_reading {
    std::uint64_t boot_ms = 0;
    std::uint64_t wall_ms = 0;
};
clock_reading read_clocks();

// The backstop (BOOTTIME ms) of a sandbox created at `now` with `ttl_ms`; 0 for no TTL.
std::uint64_t backstop_at(clock_reading now, std::uint64_t ttl_ms);

// A sandbox's backstop as set at its create, with the expiry its record held then (or, with no
// record, the create's wall clock plus the TTL).
struct backstop_anchor {
    std::uint64_t backstop_ms = 0;
    std::uint64_t recorded_wall_ms = 0;
};

// The backstop (BOOTTIME ms) for `recorded_wall_ms`, the expiry the sandbox's record holds now.
// A record as it was at the create keeps the create's backstop, whatever the wall clock did. A
// record an extend rewrote holds a wall-clock time read after steps the helper cannot know of:
// converted through the anchor (the create's backstop moved by the change of the recorded expiry)
// it is off by the steps before the extend; converted through the clocks now, by the steps after.
// Each ends the sandbox early in one direction only (a step back before the extend, a step
// forward after it): the later of the two is early only when the clock went both ways.
std::uint64_t recorded_backstop_at(std::uint64_t recorded_wall_ms, backstop_anchor anchor,
                                   clock_reading now);

}  // namespace moat::sandboxd
