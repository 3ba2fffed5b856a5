// Decoding the interpreter's structured channel into a cell's results, error and count, within
// the cell's bounds (moat/cell_result.hpp).
#include "tools/cell_events.hpp"

#include <doctest/doctest.h>

#include "tools/cell_output.hpp"

#include <string>
#include <vector>

namespace {

std::string record(char tag, const std::string& data) {
    return tag + std::to_string(data.size()) + "\n" + data;
}

std::string rep(char how, const std::string& type, const std::string& data) {
    return how + type + " " + std::to_string(data.size()) + "\n" + data;
}

const std::string png("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);

}  // namespace

TEST_CASE("results, the error and the count arrive in order with the output, whatever the split") {
    const std::string shown =
        "R 0 2\n" + rep('+', "text/plain", "<Figure>") + rep('+', "image/png", png);
    const std::string main =
        "R 1 2\n" + rep('+', "text/plain", "   a\n0  1") + rep('+', "text/html", "<table></table>");
    const std::string error = "E 8 5 10\nKeyError'key'Traceback!C 7\n";
    const std::string stream = record('o', "before\n") + record('d', shown) +
                               record('o', "after\n") + record('d', main.substr(0, 9)) +
                               record('d', main.substr(9)) + record('e', "warn\n") +
                               record('d', error) + record('r', "007 error KeyError\n");
    for (std::size_t chunk = 1; chunk <= stream.size(); ++chunk) {
        moat::cell_output reader(moat::output_limits{1024, 1024});
        std::string order;
        reader.on_output([&](moat::output_channel, std::string_view data) { order += data; });
        reader.on_event([&](const moat::cell_event& event) {
            if (const auto* r = std::get_if<moat::display_result>(&event)) {
                order += r->is_main_result ? "[main]" : "[display]";
            } else {
                order += "[error]";
            }
        });
        for (std::size_t at = 0; at < stream.size(); at += chunk) {
            reader.feed(stream.substr(at, chunk));
        }
        REQUIRE(reader.is_done());
        CHECK(order == "before\n[display]after\n[main]warn\n[error]");
        const auto cell = reader.finish_result();
        CHECK(cell.execution_count == 7);
        REQUIRE(cell.events.size() == 6);
        CHECK(std::get<moat::stream_text>(cell.events[0]).text == "before\n");
        const auto results = cell.results();
        REQUIRE(results.size() == 2);
        CHECK_FALSE(results[0]->is_main_result);
        REQUIRE(results[0]->find("image/png") != nullptr);
        CHECK(results[0]->find("image/png")->data == png);  // the exact bytes, not base64
        REQUIRE(cell.main_result() == results[1]);
        CHECK(cell.main_result()->text() == "   a\n0  1");
        CHECK(cell.main_result()->find("text/html")->data == "<table></table>");
        REQUIRE(cell.error() != nullptr);
        CHECK(cell.error()->name == "KeyError");
        CHECK(cell.error()->value == "'key'");
        CHECK(cell.error()->traceback == "Traceback!");
        CHECK(std::get<moat::stream_text>(cell.events[4]).channel == moat::output_channel::err);
    }
}

TEST_CASE("what the bounds remove is said: dropped representations, results and stream bytes") {
    moat::cell_result_builder builder(moat::cell_limits{.max_representation_bytes = 10,
                                                        .max_result_bytes = 15,
                                                        .max_results = 2,
                                                        .max_stream_bytes = 4,
                                                        .max_error_bytes = 3});
    builder.add_stream(moat::output_channel::out, "abc");
    builder.add_stream(moat::output_channel::out, "def");
    builder.feed("R 1 4\n" + rep('+', "image/png", std::string(11, 'x')) +
                 rep('~', "text/plain", "cut head") + rep('-', "text/html", "") +
                 rep('+', "image/svg+xml", "<svg>12</svg>"));
    builder.feed("R 0 0\nR 0 0\n");
    builder.feed("E 5 1 0\nValueX");
    CHECK_FALSE(builder.is_broken());
    const auto cell = builder.finish();
    CHECK(cell.omitted_stream_bytes == 2);
    CHECK(std::get<moat::stream_text>(cell.events[0]).text == "abcd");
    CHECK(cell.dropped_results == 1);
    const auto results = cell.results();
    REQUIRE(results.size() == 2);
    const auto& main = *results[0];
    REQUIRE(main.representations.size() == 1);
    CHECK(main.representations[0].media_type == "text/plain");
    CHECK(main.representations[0].is_truncated);
    REQUIRE(main.dropped.size() == 3);
    CHECK(main.dropped[0].media_type == "image/png");  // over the representation cap
    CHECK(main.dropped[0].size == 11);
    CHECK(main.dropped[1].media_type == "text/html");  // dropped by the interpreter
    CHECK(main.dropped[1].size == 0);
    CHECK(main.dropped[2].media_type == "image/svg+xml");  // over the cell's cap
    REQUIRE(cell.error() != nullptr);
    CHECK(cell.error()->name == "Val");
    CHECK(cell.error()->value == "X");
}

TEST_CASE("a malformed item ends the structure, keeps what came before, and not the output") {
    for (const std::string& bad : std::vector<std::string>{
             "Z 1\n", "R 2 1\n", "R 1 99\n", "R 1 1\n+not a type 3\nabc", "C x\n",
             "R 1 1\n*text/plain 1\nx", "E 1 2\nab", std::string(300, 'R')}) {
        moat::cell_output reader(moat::output_limits{1024, 1024});
        reader.feed(record('d', "C 3\n") + record('d', bad) + record('o', "still output\n") +
                    record('d', "R 1 0\n") + record('r', "001 ok -\n"));
        CHECK(reader.is_done());
        CHECK(reader.finish_out().text() == "still output\n");
        const auto cell = reader.finish_result();
        CHECK(cell.execution_count == 3);
        CHECK(cell.results().empty());
    }
}

TEST_CASE("media types are checked before they are kept") {
    CHECK(moat::is_media_type("image/png"));
    CHECK(moat::is_media_type("application/vnd.plotly.v1+json"));
    CHECK_FALSE(moat::is_media_type("png"));
    CHECK_FALSE(moat::is_media_type("/png"));
    CHECK_FALSE(moat::is_media_type("image/"));
    CHECK_FALSE(moat::is_media_type("a/b/c"));
    CHECK_FALSE(moat::is_media_type("text/plain\n"));
    CHECK_FALSE(moat::is_media_type(std::string(200, 'a') + "/b"));
}
