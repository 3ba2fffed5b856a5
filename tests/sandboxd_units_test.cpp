// Pure parts of moat-sandboxd, checked without a sandbox: the cgroup.procs parser pid 1 kills
// strays with (src/sandboxd/pid_lines.hpp).
#include <doctest/doctest.h>

#include "sandboxd/pid_lines.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace {

using moat::sandboxd::pid_lines;

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
