// Pure parts of moat-sandboxd, checked without a sandbox: the cgroup.procs parser pid 1 kills
// strays with (src/sandboxd/pid_lines.hpp) and the arithmetic of the helper's TTL backstop under
// wall-clock steps the host's clock cannot take in a test (src/sandboxd/ttl_backstop.hpp).
#include <doctest/doctest.h>

#include "sandboxd/pid_lines.hpp"
#include "sandboxd/ttl_backstop.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace {

using moat::sandboxd::backstop_anchor;
using moat::sandboxd::backstop_at;
using moat::sandboxd::backstop_grace_ms;
using moat::sandboxd::clock_reading;
using moat::sandboxd::pid_lines;
using moat::sandboxd::recorded_backstop_at;

// The pids of `text` read in chunks of `chunk` bytes, as read(2) might return them.
std::vector<int> parse_in_chunks(std::string_view text, std::size_t chunk,
                                 std::size_t* skipped = nullptr) {
    pid_lines lines;
    std::vector<int> pids;
    for (std::size_t at = 0; at < text.size(); at += chunk)
        lines.feed(text.substr(at, chunk), pids);
    lines.finish();
    if (skipped != nullptr) *skipped = lines.skipped();
    return pids;
}

constexpr std::uint64_t minute_ms = 60'000;
constexpr std::uint64_t hour_ms = 60 * minute_ms;

}  // namespace

TEST_CASE("a pid split across two reads of cgroup.procs is one pid, not two") {
    // Lines of "1000000\n" would end each 4096-byte read at a line's end: a shorter line shifts
    // them, so that the pid 4242424 straddles the boundary ("4242" + "424\n").
    std::string text;
    std::vector<int> expected;
    while (text.size() + 8 <= 4092) {
        text += "1000000\n";
        expected.push_back(1000000);
    }
    text += std::string(4092 - text.size() - 1, '7') + "\n";
    expected.push_back(777);
    text += "4242424\n12\n";
    expected.push_back(4242424);
    expected.push_back(12);
    constexpr std::size_t boundary = 4096;
    REQUIRE(text.substr(boundary - 4, 8) == "4242424\n");
    std::size_t skipped = 0;
    CHECK(parse_in_chunks(text, boundary, &skipped) == expected);
    CHECK(skipped == 0);
    // Whatever the chunk size, also one byte at a time.
    for (const std::size_t chunk : {1, 2, 3, 7, 4095, 65536}) {
        CAPTURE(chunk);
        CHECK(parse_in_chunks(text, chunk) == expected);
    }
}

TEST_CASE("only whole lines of digits naming a pid are pids in cgroup.procs") {
    std::size_t skipped = 0;
    const auto pids = parse_in_chunks(
        "1\n0\n\n-5\n+7\n 8\n9 \n12a\n2147483647\n2147483648\n99999999999999999999\n0042\n77", 3,
        &skipped);
    CHECK(pids == std::vector<int>{1, 2147483647, 42});
    // 0, the empty line, the signs, the spaces, 12a, the two too large and the unfinished 77.
    CHECK(skipped == 10);
    CHECK(parse_in_chunks("", 4096).empty());
}

TEST_CASE("the TTL backstop counts from the boot clock, past the TTL by its grace") {
    const clock_reading created{5'000, 1'700'000'000'000};
    CHECK(backstop_at(created, 0) == 0);  // no TTL, no backstop
    CHECK(backstop_at(created, minute_ms) == 5'000 + minute_ms + backstop_grace_ms);
}

namespace {

// The clocks `elapsed` ms after `created`, the wall clock stepped by `step` ms meanwhile.
clock_reading later(clock_reading created, std::uint64_t elapsed, std::int64_t step) {
    return {created.boot_ms + elapsed,
            created.wall_ms + elapsed + static_cast<std::uint64_t>(step)};
}

constexpr std::int64_t steps[] = {0, std::int64_t{hour_ms}, -std::int64_t{hour_ms}, 30'000,
                                  -30'000};

}  // namespace

TEST_CASE("a wall-clock step does not move the TTL backstop of a sandbox") {
    const clock_reading created{5'000, 1'700'000'000'000};
    const std::uint64_t backstop = backstop_at(created, minute_ms);
    // The library wrote the record a moment before the create.
    const backstop_anchor anchor{backstop, created.wall_ms - 20 + minute_ms};
    for (const std::int64_t step : steps) {
        CAPTURE(step);
        // Due, the wall clock `step` off: the record, as it was, ends the sandbox now.
        const clock_reading due = later(created, backstop - created.boot_ms, step);
        CHECK(recorded_backstop_at(anchor.recorded_wall_ms, anchor, due) == backstop);
    }
}

TEST_CASE("an extended TTL moves the backstop however the wall clock was stepped after") {
    const clock_reading created{5'000, 1'700'000'000'000};
    const std::uint64_t backstop = backstop_at(created, minute_ms);
    const backstop_anchor anchor{backstop, created.wall_ms + minute_ms};
    // Extended to an hour 30 s after the create, the clock not stepped so far.
    const std::uint64_t recorded = created.wall_ms + 30'000 + hour_ms;
    const std::uint64_t extended = created.boot_ms + 30'000 + hour_ms + backstop_grace_ms;
    for (const std::int64_t step : steps) {
        CAPTURE(step);
        const clock_reading due = later(created, backstop - created.boot_ms, step);
        const std::uint64_t moved = recorded_backstop_at(recorded, anchor, due);
        CHECK(moved >= extended);
        // Late only by a step back (the conversion through the clocks now), never early.
        CHECK(moved <= extended + static_cast<std::uint64_t>(step < 0 ? -step : 0));
        // At the extended backstop, with the clock stepped the same, it ends.
        const clock_reading end = later(created, moved - created.boot_ms, step);
        CHECK(recorded_backstop_at(recorded, anchor, end) <= end.boot_ms);
    }
}

TEST_CASE("a TTL extended after a wall-clock step moves the backstop no earlier than asked") {
    const clock_reading created{5'000, 1'700'000'000'000};
    const std::uint64_t backstop = backstop_at(created, minute_ms);
    const backstop_anchor anchor{backstop, created.wall_ms + minute_ms};
    for (const std::int64_t step : steps) {
        CAPTURE(step);
        // Stepped 10 s after the create; extended to ten minutes 20 s after it, through the
        // stepped clock; the helper looks at the record when the minute's backstop comes due.
        const std::uint64_t recorded = later(created, 20'000, step).wall_ms + 10 * minute_ms;
        const std::uint64_t extended = created.boot_ms + 20'000 + 10 * minute_ms;
        const clock_reading due = later(created, backstop - created.boot_ms, step);
        CHECK(recorded_backstop_at(recorded, anchor, due) >= extended + backstop_grace_ms);
    }
}

TEST_CASE("a TTL shortened by an extend ends at the earlier time") {
    const clock_reading created{5'000, 1'700'000'000'000};
    const std::uint64_t backstop = backstop_at(created, hour_ms);
    const backstop_anchor anchor{backstop, created.wall_ms + hour_ms};
    // Set to a minute 10 s after the create: the helper reads it when a later backstop is due.
    const std::uint64_t recorded = created.wall_ms + 10'000 + minute_ms;
    const clock_reading due = later(created, backstop - created.boot_ms, 0);
    CHECK(recorded_backstop_at(recorded, anchor, due) <= due.boot_ms);
}
