// Splitting the Python driver's output channels into a cell's output and the end marker.
#include "tools/cell_output.hpp"

#include <doctest/doctest.h>

#include <string>

namespace {

const std::string marker = "\x1emoat-cell-0123abcd ";

moat::cell_output reader(std::size_t head = 1024, std::size_t tail = 1024) {
    return moat::cell_output(marker, moat::output_limits{head, tail});
}

}  // namespace

TEST_CASE("a cell's output is everything before the marker, whatever the split") {
    const std::string stream = "hello\nworld" + marker + "007 ok -\nlate thread output";
    for (std::size_t chunk = 1; chunk <= stream.size(); ++chunk) {
        auto r = reader();
        for (std::size_t at = 0; at < stream.size(); at += chunk) r.feed(stream.substr(at, chunk));
        REQUIRE(r.is_done());
        CHECK(r.marker_line() == "007 ok -");
        CHECK(r.finish().text() == "hello\nworld");
    }
}

TEST_CASE("a marker line waits for its newline and is cut at its limit") {
    auto r = reader();
    r.feed("x" + marker + "001 err");
    CHECK_FALSE(r.is_done());
    r.feed("or KeyError\n");
    REQUIRE(r.is_done());
    const auto status = moat::parse_marker_line(r.marker_line());
    CHECK(status.raised);
    CHECK(status.exception_type == "KeyError");
    CHECK(r.finish().text() == "x");

    auto flood = reader();
    flood.feed(marker + std::string(10'000, 'y'));
    REQUIRE(flood.is_done());
    CHECK(flood.marker_line().size() == moat::cell_output::max_marker_line);
}

TEST_CASE("text that only resembles the marker is the cell's output") {
    auto r = reader();
    const std::string lookalike = "\x1emoat-cell-ffff 001 ok -\n\x1emoat-cell-0123abc";
    r.feed(lookalike);
    CHECK_FALSE(r.is_done());
    CHECK(r.finish().text() == lookalike);
}

TEST_CASE("a huge cell output is kept as head and tail until the marker") {
    auto r = reader(8, 8);
    r.feed(std::string(100'000, 'a') + "TAILDATA" + marker + "002 ok -\n");
    REQUIRE(r.is_done());
    const auto out = r.finish();
    CHECK(out.total_bytes == 100'008);
    CHECK(out.tail == "TAILDATA");
    CHECK(out.is_truncated());
}

TEST_CASE("marker lines parse to ok, an exception type, or nothing usable") {
    CHECK_FALSE(moat::parse_marker_line("001 ok -").raised);
    const auto error = moat::parse_marker_line("002 error json.decoder.JSONDecodeError");
    CHECK(error.raised);
    CHECK(error.exception_type == "json.decoder.JSONDecodeError");
    const auto unnamed = moat::parse_marker_line("003 error -");
    CHECK(unnamed.raised);
    CHECK(unnamed.exception_type.empty());
    CHECK_FALSE(moat::parse_marker_line("").raised);
    CHECK_FALSE(moat::parse_marker_line("garbage").raised);
    CHECK(moat::parse_marker_line("004 error").raised);
}

TEST_CASE("a marker line whose newline comes past its limit in the same read is cut at the limit") {
    // Found by the cell_output fuzzer: the newline was found, so the cap was not applied.
    auto r = reader();
    r.feed("out" + marker + "001 error " + std::string(1'000, 'z') + "\nlater");
    REQUIRE(r.is_done());
    CHECK(r.marker_line().size() == moat::cell_output::max_marker_line);
    CHECK(r.finish().text() == "out");
}
