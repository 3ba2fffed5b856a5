// Text shaped for a model: cleaning (escapes, control characters, invalid UTF-8), clamping with a
// marker, the two-part form for captured output, and reading Python tracebacks.
#include <moat/model_text.hpp>

#include "support/utf8_check.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace {

using moat::test::count_chars;
using moat::test::is_valid_utf8;

std::string repeat(std::string_view s, std::size_t times) {
    std::string out;
    out.reserve(s.size() * times);
    for (std::size_t k = 0; k < times; ++k) out += s;
    return out;
}

std::string marker(std::string_view count) {
    return "[... " + std::string(count) +
           " omitted; to see them, print a slice, filter the lines you need, or print a summary "
           "such as len() or head() ...]";
}

// Distinct digits, so a wrong cut shows.
std::string numbered(std::size_t n) {
    std::string out;
    for (std::size_t k = 0; k < n; ++k) out += static_cast<char>('0' + k % 10);
    return out;
}

constexpr std::string_view fffd = "\xEF\xBF\xBD";

}  // namespace

TEST_CASE("short text is returned unchanged and not truncated") {
    const auto shaped = moat::shape_for_model("total: 42\nmean:\t3.5\n");
    CHECK(shaped.text == "total: 42\nmean:\t3.5\n");
    CHECK_FALSE(shaped.is_truncated());
    CHECK(shaped.omitted_chars == 0);
    CHECK(moat::shape_for_model("").text.empty());
}

TEST_CASE("a text of exactly max_chars characters is kept whole") {
    const moat::shaping_limits limits{10, 20, 50};
    const std::string text = numbered(50);
    const auto shaped = moat::shape_for_model(text, limits);
    CHECK(shaped.text == text);
    CHECK_FALSE(shaped.is_truncated());
    // Code points, not bytes: 50 three-byte characters are 50 characters.
    const std::string wide = repeat("\xE6\xBC\xA2", 50);
    CHECK(moat::shape_for_model(wide, limits).text == wide);
}

TEST_CASE("a long text keeps its head and tail around a marker counting what was omitted") {
    const moat::shaping_limits limits{10, 20, 50};
    const std::string text = numbered(100);
    const auto shaped = moat::shape_for_model(text, limits);
    CHECK(shaped.omitted_chars == 70);
    CHECK(shaped.is_truncated());
    CHECK(shaped.text ==
          text.substr(0, 10) + "\n" + marker("70 characters") + "\n" + text.substr(80));

    // One over the limit, with a head ending a line: no blank line, singular noun.
    const std::string lines = "line one\n" + numbered(42);
    const auto one = moat::shape_for_model(lines, moat::shaping_limits{9, 41, 50});
    CHECK(one.omitted_chars == 1);
    CHECK(one.text == "line one\n" + marker("1 character") + "\n" + numbered(42).substr(1));

    // Default limits, thousands separators.
    const auto big = moat::shape_for_model(std::string(200'000, 'x'));
    CHECK(big.omitted_chars == 195'000);
    CHECK(big.text.find(marker("195,000 characters")) == 2001);
    CHECK(count_chars(big.text) == 5000 + count_chars(marker("195,000 characters")) + 2);
}

TEST_CASE("multi-byte characters count as one and are never split") {
    const std::string text =
        repeat("\xC3\xA9", 100) + repeat("\xE6\xBC\xA2", 100) + repeat("\xF0\x9F\x98\x80", 100);
    const auto shaped = moat::shape_for_model(text, moat::shaping_limits{7, 11, 20});
    CHECK(is_valid_utf8(shaped.text));
    CHECK(shaped.omitted_chars == 300 - 18);
    CHECK(shaped.text == repeat("\xC3\xA9", 7) + "\n" + marker("282 characters") + "\n" +
                             repeat("\xF0\x9F\x98\x80", 11));

    // Every cut point through a run of mixed widths stays valid.
    for (std::size_t head = 0; head < 12; ++head) {
        for (std::size_t tail = 0; tail < 12; ++tail) {
            const auto cut = moat::shape_for_model(text.substr(150),
                                                   moat::shaping_limits{head, tail, head + tail});
            CHECK(is_valid_utf8(cut.text));
            CHECK(cut.omitted_chars == count_chars(text.substr(150)) - head - tail);
        }
    }
}

TEST_CASE("ANSI colours, cursor moves, titles and hyperlinks are stripped") {
    CHECK(moat::shape_for_model("\x1b[1;31mERROR\x1b[0m: bad\x1b[K\n").text == "ERROR: bad\n");
    CHECK(moat::shape_for_model("\x1b[2J\x1b[H\x1b[?25lhidden cursor\x1b[?25h").text ==
          "hidden cursor");
    CHECK(moat::shape_for_model("\x1b]0;my title\x07text").text == "text");
    CHECK(moat::shape_for_model("\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\ done").text ==
          "link done");
    CHECK(moat::shape_for_model("\x1b(Bplain\x1b=\x1b>").text == "plain");
    CHECK(moat::shape_for_model("\x1bPq#0;2;0;0;0\x1b\\after").text == "after");
    // 8-bit CSI in its UTF-8 form, and colours cut at the end of the text.
    CHECK(moat::shape_for_model("\xC2\x9B"
                                "32mgreen")
              .text == "green");
    CHECK(moat::shape_for_model("red\x1b[3").text == "red");
    CHECK(moat::shape_for_model("red\x1b").text == "red");
    // An unterminated OSC costs the rest of its line, not the rest of the text.
    CHECK(moat::shape_for_model("a\x1b]title without end\nnext line").text == "a\nnext line");
    // Colours do not count towards the limit.
    const std::string coloured = repeat("\x1b[32mok\x1b[0m ", 20);
    CHECK(moat::shape_for_model(coloured, moat::shaping_limits{10, 10, 60}).text ==
          repeat("ok ", 20));
}

TEST_CASE("carriage returns and other control characters are removed") {
    CHECK(moat::shape_for_model("a\r\nb\r\n").text == "a\nb\n");
    CHECK(moat::shape_for_model(" 10%\r 50%\r100%\n").text == " 10% 50%100%\n");
    CHECK(moat::shape_for_model(std::string_view("a\0b\x07"
                                                 "c\x08"
                                                 "d\x7f"
                                                 "e\tf",
                                                 11))
              .text == "abcde\tf");
    CHECK(moat::shape_for_model("x\xC2\x85y").text == "xy");  // C1 NEL
}

TEST_CASE("invalid UTF-8 becomes U+FFFD, one per ill-formed subpart") {
    const std::string r(fffd);
    CHECK(moat::shape_for_model("a\xC0\x80z").text == "a" + r + r + "z");          // overlong
    CHECK(moat::shape_for_model("a\xE0\x80\x80z").text == "a" + r + r + r + "z");  // overlong
    CHECK(moat::shape_for_model("a\xED\xA0\x80z").text == "a" + r + r + r + "z");  // surrogate
    CHECK(moat::shape_for_model("a\xF4\x90\x80\x80z").text == "a" + r + r + r + r + "z");
    CHECK(moat::shape_for_model("a\xFF\xFEz").text == "a" + r + r + "z");
    CHECK(moat::shape_for_model("a\x80z").text == "a" + r + "z");      // stray continuation
    CHECK(moat::shape_for_model("a\xE6\xBCz").text == "a" + r + "z");  // truncated
    CHECK(moat::shape_for_model("a\xF0\x9F\x98").text == "a" + r);     // cut at the end
    const auto shaped = moat::shape_for_model("\xC0\xC1\xF5\xF8 \xE6\xBC\xA2");
    CHECK(shaped.text == r + r + r + r + " \xE6\xBC\xA2");
    CHECK(is_valid_utf8(shaped.text));
}

TEST_CASE("a capture's head and tail are shaped apart around the uncaptured bytes") {
    const std::string r(fffd);
    // A character cut on each side of the gap becomes one U+FFFD and is never split.
    const auto cut = moat::shape_for_model("abc\xE6\xBC", 1000,
                                           "\xA2\xA2"
                                           "def");
    CHECK(cut.text == "abc" + r + "\n" + marker("1,000 characters") + "\n" + r + "def");
    CHECK(cut.omitted_chars == 1000);
    CHECK(is_valid_utf8(cut.text));

    // Each part is clamped: head_chars from the head's start, tail_chars from the tail's end.
    const auto clamped =
        moat::shape_for_model(numbered(10), 50, numbered(10), moat::shaping_limits{4, 3, 100});
    CHECK(clamped.text == "0123\n" + marker("63 characters") + "\n789");
    CHECK(clamped.omitted_chars == 50 + 6 + 7);

    // An escape sequence cut at the head's end is dropped.
    CHECK(moat::shape_for_model("ok\x1b[3", 5, "1mred").text ==
          "ok\n" + marker("5 characters") + "\n1mred");

    // Nothing uncaptured: one stream, the split character is whole again.
    const auto joined = moat::shape_for_model("ab\xE6\xBC", 0,
                                              "\xA2"
                                              "cd");
    CHECK(joined.text ==
          "ab\xE6\xBC\xA2"
          "cd");
    CHECK_FALSE(joined.is_truncated());

    moat::captured_output output;
    output.head = "first\n";
    output.tail = "last\n";
    output.omitted_bytes = 123'456;
    output.total_bytes = 123'467;
    const auto from_capture = moat::shape_for_model(output);
    CHECK(from_capture.text == "first\n" + marker("123,456 characters") + "\nlast\n");
    CHECK(from_capture.omitted_chars == 123'456);

    moat::captured_output whole;
    whole.head = "\x1b[1mall\x1b[0m of it\r\n";
    whole.total_bytes = whole.head.size();
    CHECK(moat::shape_for_model(whole).text == "all of it\n");
}

TEST_CASE("python_error_type names the exception of a traceback") {
    CHECK(moat::python_error_type("Traceback (most recent call last):\n"
                                  "  File \"/workspace/.cells/001.py\", line 2, in <module>\n"
                                  "    row[\"price\"]\n"
                                  "    ~~~^^^^^^^^^\n"
                                  "KeyError: 'price'\n") == "KeyError");
    CHECK(moat::python_error_type(
              "Traceback (most recent call last):\n"
              "  File \"<cell 1>\", line 1, in <module>\n"
              "  File \"/usr/lib/python3.11/json/__init__.py\", line 346, in loads\n"
              "    return _default_decoder.decode(s)\n"
              "           ^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
              "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n") ==
          "json.decoder.JSONDecodeError");
    CHECK(moat::python_error_type("Traceback (most recent call last):\n"
                                  "  File \"<string>\", line 1, in <module>\n"
                                  "KeyboardInterrupt\n") == "KeyboardInterrupt");
    CHECK(moat::python_error_type("Traceback (most recent call last):\r\n"
                                  "  File \"x.py\", line 1, in <module>\r\n"
                                  "ZeroDivisionError: division by zero\r\n") ==
          "ZeroDivisionError");
    // What a program printed before does not matter, nor a message on several lines.
    CHECK(moat::python_error_type("loading data...\nwarning: slow\n"
                                  "Traceback (most recent call last):\n"
                                  "  File \"x.py\", line 1, in <module>\n"
                                  "ValueError: first line\nsecond: line\n") == "ValueError");
}

TEST_CASE("python_error_type reads SyntaxError reports that have no Traceback header") {
    CHECK(moat::python_error_type("  File \"/workspace/.cells/003.py\", line 1\n"
                                  "    def f(:\n"
                                  "          ^\n"
                                  "SyntaxError: invalid syntax\n") == "SyntaxError");
    CHECK(moat::python_error_type(
              "  File \"s2.py\", line 2\n"
              "    x=1\n"
              "    ^\n"
              "IndentationError: expected an indented block after 'if' statement on line 1\n") ==
          "IndentationError");
    // A "  File" line alone is not a report: a log line that happens to look like one.
    CHECK(moat::python_error_type("  File \"data.csv\", line 3\nNote: skipped\n").empty());
}

TEST_CASE("python_error_type returns the last exception of a chain") {
    const std::string chained =
        "Traceback (most recent call last):\n"
        "  File \"<string>\", line 3, in <module>\n"
        "KeyError: 'a'\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "Traceback (most recent call last):\n"
        "  File \"<string>\", line 5, in <module>\n"
        "ValueError: v\n";
    CHECK(moat::python_error_type(chained) == "ValueError");
    // Two separate tracebacks (one printed by the program, then the crash): the last wins.
    CHECK(moat::python_error_type("Traceback (most recent call last):\n  File \"a\", line 1\n"
                                  "OSError: logged and ignored\nretrying\n"
                                  "Traceback (most recent call last):\n  File \"a\", line 2\n"
                                  "TimeoutError\n") == "TimeoutError");
}

TEST_CASE("python_error_type names an exception group, not its sub-exceptions") {
    CHECK(moat::python_error_type("  + Exception Group Traceback (most recent call last):\n"
                                  "  |   File \"<string>\", line 3, in <module>\n"
                                  "  | ExceptionGroup: outer (2 sub-exceptions)\n"
                                  "  +-+---------------- 1 ----------------\n"
                                  "    | Exception Group Traceback (most recent call last):\n"
                                  "    |   File \"<string>\", line 2, in <module>\n"
                                  "    | ExceptionGroup: inner (1 sub-exception)\n"
                                  "    +-+---------------- 1 ----------------\n"
                                  "      | Traceback (most recent call last):\n"
                                  "      |   File \"<string>\", line 1, in <module>\n"
                                  "      | ValueError: 1\n"
                                  "      +------------------------------------\n"
                                  "    +---------------- 2 ----------------\n"
                                  "    | TypeError: 2\n"
                                  "    +------------------------------------\n") ==
          "ExceptionGroup");
    // What `except*` re-raises is printed without frames.
    CHECK(moat::python_error_type("  | ExceptionGroup:  (2 sub-exceptions)\n"
                                  "  +-+---------------- 1 ----------------\n"
                                  "    | Traceback (most recent call last):\n"
                                  "    |   File \"/tmp/eg.py\", line 6, in <module>\n"
                                  "    | KeyError: 'k'\n"
                                  "    +------------------------------------\n") ==
          "ExceptionGroup");
}

TEST_CASE("python_error_type ignores colours and finds nothing in text without a traceback") {
    CHECK(moat::python_error_type("\x1b[35mTraceback (most recent call last):\x1b[0m\n"
                                  "  File \x1b[35m\"x.py\"\x1b[0m, line \x1b[35m1\x1b[0m, in "
                                  "<module>\n"
                                  "\x1b[1;35mKeyError\x1b[0m: \x1b[35m'x'\x1b[0m\n") == "KeyError");
    CHECK(moat::python_error_type("").empty());
    CHECK(moat::python_error_type("all good\n").empty());
    CHECK(moat::python_error_type("Error: file not found\n").empty());
    CHECK(moat::python_error_type("Traceback (most recent call last):\n  File \"x\", line 1\n")
              .empty());
}

TEST_CASE("python_error_type finds the exception across an omission marker") {
    const std::string text =
        "Traceback (most recent call last):\n"
        "  File \"x.py\", line 9, in f\n"
        "[... 50,000 bytes omitted ...]\n"
        "  File \"x.py\", line 9, in f\n"
        "RecursionError: maximum recursion depth exceeded\n";
    CHECK(moat::python_error_type(text) == "RecursionError");
    // Header lost with the middle: the frames before the exception line still identify it.
    CHECK(moat::python_error_type(text.substr(text.find('['))) == "RecursionError");
}

TEST_CASE("python_traceback starts at the first traceback of the last chain") {
    const std::string first =
        "Traceback (most recent call last):\n"
        "  File \"<string>\", line 3, in <module>\n"
        "KeyError: 'a'\n"
        "\n"
        "During handling of the above exception, another exception "
        "occurred:\n"
        "\n";
    const std::string second =
        "Traceback (most recent call last):\n"
        "  File \"<string>\", line 5, in <module>\n"
        "ValueError: v\n";
    CHECK(moat::python_traceback("some output\n" + first + second) == first + second);
    CHECK(moat::python_traceback("old\n" + second + "unrelated line\n" + second) == second);
    CHECK(moat::python_traceback("  File \"c.py\", line 1\n    )\n    ^\nSyntaxError: unmatched "
                                 "')'\n") ==
          "  File \"c.py\", line 1\n    )\n    ^\nSyntaxError: unmatched ')'\n");
    CHECK(moat::python_traceback("nothing here\n").empty());
    CHECK(moat::python_traceback("\x1b[31mTraceback (most recent call last):\x1b[0m\n"
                                 "  File \"a\", line 1\nOSError\n") ==
          "Traceback (most recent call last):\n  File \"a\", line 1\nOSError\n");
}

TEST_CASE("python_traceback clamps a huge traceback and keeps its last line") {
    std::string text = "Traceback (most recent call last):\n";
    for (int k = 0; k < 2000; ++k) {
        text += "  File \"/workspace/deep.py\", line " + std::to_string(k) +
                ", in recurse\n    return recurse(n - 1)\n";
    }
    text += "RecursionError: maximum recursion depth exceeded in comparison\n";
    const std::string traceback = moat::python_traceback(text);
    CHECK(traceback.starts_with("Traceback (most recent call last):\n"));
    CHECK(traceback.ends_with("RecursionError: maximum recursion depth exceeded in comparison\n"));
    CHECK(traceback.find("characters omitted") != std::string::npos);
    CHECK(count_chars(traceback) <= 3000 + 200);
    CHECK(moat::python_error_type(text) == "RecursionError");
}
