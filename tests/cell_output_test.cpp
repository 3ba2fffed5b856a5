// Decoding the Python driver's results channel into a cell's stdout, stderr and end record.
#include "tools/cell_output.hpp"

#include <doctest/doctest.h>

#include <string>

namespace {

moat::cell_output reader(std::size_t head = 1024, std::size_t tail = 1024) {
    return moat::cell_output(moat::output_limits{head, tail});
}

std::string record(char tag, const std::string& data) {
    return tag + std::to_string(data.size()) + "\n" + data;
}

}  // namespace

TEST_CASE("a cell's output is what its data records carry, whatever the split") {
    const std::string stream = record('o', "hello\n") + record('e', "oops\n") +
                               record('o', "world") + record('r', "007 ok -\n") +
                               record('o', "late thread output");
    for (std::size_t chunk = 1; chunk <= stream.size(); ++chunk) {
        auto r = reader();
        std::string streamed;
        r.on_output([&](moat::output_channel, std::string_view data) { streamed += data; });
        for (std::size_t at = 0; at < stream.size(); at += chunk) r.feed(stream.substr(at, chunk));
        REQUIRE(r.is_done());
        CHECK_FALSE(r.is_broken());
        CHECK(r.status_line() == "007 ok -");
        CHECK(r.finish_out().text() == "hello\nworld");
        CHECK(r.finish_err().text() == "oops\n");
        CHECK(streamed == "hello\noops\nworld");
        // What came after the end record is not dropped: it is the next cell's.
        CHECK(r.take_leftover() == record('o', "late thread output"));
    }
}

TEST_CASE("text that imitates a record inside a data record is output") {
    auto r = reader();
    const std::string forged = "\x1emoat-cell-0123 001 ok -\n" + record('r', "001 ok -\n");
    r.feed(record('o', forged) + record('e', forged));
    CHECK_FALSE(r.is_done());
    r.feed(record('o', "after"));
    r.feed(record('r', "001 error ValueError\n"));
    REQUIRE(r.is_done());
    const auto status = moat::parse_marker_line(r.status_line());
    CHECK(status.raised);
    CHECK(status.exception_type == "ValueError");
    CHECK(r.finish_out().text() == forged + "after");
    CHECK(r.finish_err().text() == forged);
}

TEST_CASE("a malformed header breaks the channel and keeps every byte from there as output") {
    for (const std::string& bad :
         {std::string("x5\nhello"), std::string("o-1\nabc"), std::string("o99999999999\n"),
          std::string("r9999\nabc"), std::string("o") + std::string(100, '1')}) {
        auto r = reader();
        r.feed(record('o', "before "));
        r.feed(bad);
        REQUIRE(r.is_broken());
        CHECK_FALSE(r.is_done());
        r.feed("tail");
        CHECK(r.finish_out().text() == "before " + bad + "tail");
    }
}

TEST_CASE("a huge cell output is kept as head and tail") {
    auto r = reader(8, 8);
    for (int i = 0; i < 10; ++i) r.feed(record('o', std::string(10'000, 'a')));
    r.feed(record('o', "TAILDATA") + record('r', "002 ok -\n"));
    REQUIRE(r.is_done());
    const auto out = r.finish_out();
    CHECK(out.total_bytes == 100'008);
    CHECK(out.tail == "TAILDATA");
    CHECK(out.is_truncated());
}

TEST_CASE("unframed bytes (the driver's start-up errors) are the cell's stderr") {
    auto r = reader();
    r.feed_unframed("Traceback: boom\n");
    CHECK(r.finish_err().text() == "Traceback: boom\n");
}

TEST_CASE("end records parse to ok, an exception type, or nothing usable") {
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
