// The filter that keeps a sandbox's escape sequences off the host's terminal.
#include "cli/terminal_safe.hpp"

#include <doctest/doctest.h>

#include <string>

namespace {

std::string filtered(const std::string& data, std::size_t chunk) {
    moat::cli::terminal_safe safe;
    std::string out;
    for (std::size_t at = 0; at < data.size(); at += chunk)
        out += safe.filter(data.substr(at, chunk));
    return out + safe.finish();
}

bool has_control(const std::string& text) {
    for (std::size_t i = 0; i < text.size(); ++i) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if ((byte < 0x20 && byte != '\n' && byte != '\t' && byte != '\r') || byte == 0x7f)
            return true;
        if (byte == 0xc2 && i + 1 < text.size() &&
            static_cast<unsigned char>(text[i + 1]) <= 0x9f &&
            static_cast<unsigned char>(text[i + 1]) >= 0x80)
            return true;
    }
    return false;
}

}  // namespace

TEST_CASE("escape sequences are rendered visibly, whatever the split into chunks") {
    const std::string hostile =
        "clip\x1b]52;c;aGVsbG8=\x07title\x1b]0;owned\x1b\\clear\x1b[2J\x1b[H"
        "dcs\x1bP+q544e\x1b\\bell\x07"
        "back\bdel\x7f"
        "c1\xc2\x9b"
        "31m\xc2\x9d"
        "0;x\x9b"
        "2J\n";
    const std::string expected =
        "clip^[]52;c;aGVsbG8=^Gtitle^[]0;owned^[\\clear^[[2J^[[H"
        "dcs^[P+q544e^[\\bell^Gback^Hdel^?"
        "c1\\x9b31m\\x9d0;x\\x9b2J\n";
    for (std::size_t chunk = 1; chunk <= hostile.size(); ++chunk) {
        const auto out = filtered(hostile, chunk);
        CHECK_MESSAGE(out == expected, chunk);
        CHECK_FALSE(has_control(out));
    }
}

TEST_CASE("text, newlines, tabs, carriage returns and UTF-8 pass the terminal filter unchanged") {
    // "é" is C3 A9, "€" E2 82 AC (a continuation byte in the C1 range), U+00A0 is C2 A0, "😀"
    // is four bytes.
    const std::string text =
        "plain\tline\r\nr\xc3\xa9sum\xc3\xa9 \xe2\x82\xac \xc2\xa0 \xf0\x9f\x98\x80\n";
    for (std::size_t chunk = 1; chunk <= text.size(); ++chunk) CHECK(filtered(text, chunk) == text);
    // Invalid UTF-8 outside the C1 range is left for the terminal to show as it does.
    CHECK(filtered("\xff\xc3(\xe2", 1) == "\xff\xc3(\xe2");
    // A lone C2 at the end of the stream is kept.
    CHECK(filtered("end\xc2", 2) == "end\xc2");
}
