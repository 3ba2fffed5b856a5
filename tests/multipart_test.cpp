// The multipart/form-data parser envd's POST /files reads uploads with: bodies split at every byte
// offset, CRLF edge cases inside data, the boundary from Content-Type, the caps, and malformed
// bodies (no closing boundary, garbage, broken headers).
#include "serve/multipart.hpp"

#include <doctest/doctest.h>

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

using moat::serve::multipart_boundary;
using moat::serve::multipart_event;
using moat::serve::multipart_limits;
using moat::serve::multipart_parser;

namespace {

// What a body parsed into: each part's head and its reassembled data.
struct parsed_part {
    moat::serve::multipart_part_head head;
    std::string data;
    bool ended = false;
};

struct parsed {
    std::vector<parsed_part> parts;
    bool finished_event = false;
    bool feed_failed = false;
    bool finish_ok = false;
    std::size_t max_buffered = 0;
};

void apply(const std::vector<multipart_event>& events, parsed& out) {
    for (const auto& e : events) {
        switch (e.type) {
            case multipart_event::kind::part_begin:
                REQUIRE(!out.finished_event);
                REQUIRE((out.parts.empty() || out.parts.back().ended));
                out.parts.push_back(parsed_part{e.head, {}, false});
                break;
            case multipart_event::kind::data:
                REQUIRE(!out.parts.empty());
                REQUIRE(!out.parts.back().ended);
                REQUIRE(!e.data.empty());
                out.parts.back().data += e.data;
                break;
            case multipart_event::kind::part_end:
                REQUIRE(!out.parts.empty());
                out.parts.back().ended = true;
                break;
            case multipart_event::kind::finished:
                out.finished_event = true;
                break;
        }
    }
}

// Feeds `body` in the given pieces (split at `cuts`, ascending offsets).
parsed parse_split(std::string_view body, const std::vector<std::size_t>& cuts,
                   std::string boundary = "XyZ", multipart_limits limits = {}) {
    parsed out;
    multipart_parser parser(std::move(boundary), limits);
    std::size_t at = 0;
    auto feed = [&](std::string_view piece) {
        std::vector<multipart_event> events;
        const auto r = parser.feed(piece, events);
        apply(events, out);
        out.max_buffered = std::max(out.max_buffered, parser.buffered());
        if (!r) {
            CHECK(r.error().code == moat::errc::protocol_error);
            CHECK(r.error().detail.find('\n') == std::string::npos);
            out.feed_failed = true;
        }
        return r.has_value();
    };
    for (auto cut : cuts) {
        if (!feed(body.substr(at, cut - at))) return out;
        at = cut;
    }
    if (!feed(body.substr(at))) return out;
    out.finish_ok = parser.finish().has_value();
    return out;
}

parsed parse_whole(std::string_view body, std::string boundary = "XyZ",
                   multipart_limits limits = {}) {
    return parse_split(body, {}, std::move(boundary), limits);
}

// What the SDK (undici's FormData) sends for files.write("/home/user/a.txt", data).
std::string sdk_body(std::string_view data) {
    std::string b = "--XyZ\r\n";
    b += "Content-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.txt\"\r\n";
    b += "Content-Type: application/octet-stream\r\n\r\n";
    b += data;
    b += "\r\n--XyZ--\r\n";
    return b;
}

}  // namespace

TEST_CASE("a body like the SDK's parses into one part with its name, filename and data") {
    const auto p = parse_whole(sdk_body("hello\n"));
    REQUIRE(!p.feed_failed);
    CHECK(p.finish_ok);
    CHECK(p.finished_event);
    REQUIRE(p.parts.size() == 1);
    CHECK(p.parts[0].head.disposition == "form-data");
    CHECK(p.parts[0].head.name == "file");
    CHECK(p.parts[0].head.has_filename);
    CHECK(p.parts[0].head.filename == "/home/user/a.txt");
    CHECK(p.parts[0].head.content_type == "application/octet-stream");
    CHECK(p.parts[0].head.headers.size() == 2);
    CHECK(p.parts[0].data == "hello\n");
    CHECK(p.parts[0].ended);
}

TEST_CASE(
    "the same parts come out for a body split at every byte offset, and in two cuts anywhere") {
    std::string data;
    // CR, LF, dashes and near-boundaries inside the data: none of it is a delimiter.
    data += "\r\n\r\n-XyZ-not\r--XyZ\n--XyZ \r\n-XyZ\r\n--Xy\r\n--";
    for (int i = 0; i < 256; ++i) data.push_back(static_cast<char>(i));
    data += "\r\n--X";
    std::string body =
        "preamble to ignore\r\n--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\n";
    body += data;
    body += "\r\n--XyZ  \t\r\n\r\n\r\n--XyZ\r\nContent-Disposition: form-data; name=\"b\"\r\n\r\n";
    body += "\r\n--XyZ--epilogue is ignored\r\n--XyZ\r\n";
    const auto whole = parse_whole(body);
    REQUIRE(!whole.feed_failed);
    REQUIRE(whole.finish_ok);
    REQUIRE(whole.parts.size() == 3);
    CHECK(whole.parts[0].head.name == "a");
    CHECK(whole.parts[0].data == data);
    CHECK(whole.parts[1].head.headers.empty());  // a part with no headers at all
    CHECK(whole.parts[1].data.empty());
    CHECK(whole.parts[2].head.name == "b");
    CHECK(whole.parts[2].data.empty());

    for (std::size_t cut = 0; cut <= body.size(); ++cut) {
        CAPTURE(cut);
        const auto p = parse_split(body, {cut});
        REQUIRE(!p.feed_failed);
        REQUIRE(p.finish_ok);
        REQUIRE(p.parts.size() == 3);
        CHECK(p.parts[0].data == data);
        CHECK(p.parts[2].head.name == "b");
    }
    std::vector<std::size_t> every;
    for (std::size_t i = 1; i < body.size(); ++i) every.push_back(i);
    const auto bytewise = parse_split(body, every);
    REQUIRE(bytewise.finish_ok);
    REQUIRE(bytewise.parts.size() == 3);
    CHECK(bytewise.parts[0].data == data);
    // Fed a byte at a time it holds no more than a delimiter's prefix or a header block.
    CHECK(bytewise.max_buffered <= 128);
    for (std::size_t a = 0; a < body.size(); a += 7) {
        for (std::size_t b = a; b <= body.size(); b += 11) {
            const auto p = parse_split(body, {a, b});
            REQUIRE(p.finish_ok);
            REQUIRE(p.parts.size() == 3);
            REQUIRE(p.parts[0].data == data);
        }
    }
}

TEST_CASE("a large part is handed out as it arrives, holding at most a delimiter between feeds") {
    multipart_parser parser("XyZ");
    std::vector<multipart_event> events;
    REQUIRE(parser.feed("--XyZ\r\nContent-Disposition: form-data; name=file\r\n\r\n", events));
    std::size_t data_bytes = 0;
    const std::string chunk(16 * 1024, 'q');
    for (int i = 0; i < 64; ++i) {
        events.clear();
        REQUIRE(parser.feed(chunk, events));
        for (const auto& e : events) data_bytes += e.data.size();
        CHECK(parser.buffered() < 16);
    }
    events.clear();
    REQUIRE(parser.feed("\r\n--XyZ--", events));
    for (const auto& e : events) data_bytes += e.data.size();
    CHECK(data_bytes == 64 * chunk.size());
    CHECK(parser.is_finished());
    CHECK(parser.finish());
}

TEST_CASE("a body without its closing boundary fails at finish, however it ends") {
    for (std::string body :
         {std::string("--XyZ\r\n\r\ndata"), std::string("--XyZ\r\n\r\ndata\r\n--XyZ"),
          std::string("--XyZ\r\n\r\ndata\r\n--XyZ\r\n"), std::string("--XyZ\r\nA: b"),
          std::string(""), std::string("--XyZ-"), std::string("no boundary at all")}) {
        CAPTURE(body);
        const auto p = parse_whole(body);
        CHECK(!p.feed_failed);
        CHECK(!p.finish_ok);
        CHECK(!p.finished_event);
    }
}

TEST_CASE("garbage, broken part headers and bytes where a delimiter ends are protocol errors") {
    const std::vector<std::string> bodies = {
        "--XyZ\r\nno colon here\r\n\r\ndata\r\n--XyZ--",
        "--XyZ\r\n: empty name\r\n\r\n\r\n--XyZ--",
        "--XyZ\r\nA: b\r\n folded: continuation\r\n\r\n\r\n--XyZ--",
        "--XyZ\r\nA: b\rc\r\n\r\n\r\n--XyZ--",
        "--XyZ\r\nA: b\nc\r\n\r\n\r\n--XyZ--",
        "--XyZ\r\nContent-Disposition: form-data; name=\"unterminated\r\n\r\n\r\n--XyZ--",
        "--XyZ\r\nContent-Disposition: form-data; name=a; name=b\r\n\r\n\r\n--XyZ--",
        "--XyZ\r\nContent-Disposition: a\r\nContent-Disposition: b\r\n\r\n\r\n--XyZ--",
        "--XyZ\r\nContent-Disposition: ; name=a\r\n\r\n\r\n--XyZ--",
        "--XyZ junk\r\n\r\n\r\n--XyZ--",
        "--XyZ-x",
        "--XyZ\n\r\n\r\n--XyZ--",
        "--XyZ\r\n\r\ndata\r\n--XyZtrailing",
    };
    for (const auto& body : bodies) {
        CAPTURE(body);
        CHECK(parse_whole(body).feed_failed);
        std::vector<std::size_t> every;
        for (std::size_t i = 1; i < body.size(); ++i) every.push_back(i);
        CHECK(parse_split(body, every).feed_failed);
    }
    // After a fault every feed is refused.
    multipart_parser parser("XyZ");
    std::vector<multipart_event> events;
    CHECK(!parser.feed("--XyZ junk\r\n", events));
    CHECK(!parser.feed("--XyZ--", events));
    CHECK(!parser.finish());
}

TEST_CASE("the header block, preamble and part count are capped") {
    multipart_limits limits;
    limits.max_header_bytes = 64;
    limits.max_parts = 2;
    {
        const std::string body = "--XyZ\r\nX: " + std::string(100, 'h') + "\r\n\r\n\r\n--XyZ--";
        CHECK(parse_whole(body, "XyZ", limits).feed_failed);
        std::vector<std::size_t> every;
        for (std::size_t i = 1; i < body.size(); ++i) every.push_back(i);
        const auto p = parse_split(body, every, "XyZ", limits);
        CHECK(p.feed_failed);
        CHECK(p.max_buffered <= 64 + 4);
    }
    {
        const std::string ok = "--XyZ\r\nX: " + std::string(40, 'h') + "\r\n\r\n\r\n--XyZ--";
        CHECK(parse_whole(ok, "XyZ", limits).finish_ok);
    }
    CHECK(parse_whole(std::string(200, 'g') + "\r\n--XyZ--", "XyZ", limits).feed_failed);
    CHECK(parse_whole(std::string(40, 'g') + "\r\n--XyZ--", "XyZ", limits).finish_ok);
    const std::string three = "--XyZ\r\n\r\n\r\n--XyZ\r\n\r\n\r\n--XyZ\r\n\r\n\r\n--XyZ--";
    CHECK(parse_whole(three, "XyZ", limits).feed_failed);
    const std::string two = "--XyZ\r\n\r\n\r\n--XyZ\r\n\r\n\r\n--XyZ--";
    CHECK(parse_whole(two, "XyZ", limits).finish_ok);
}

TEST_CASE(
    "the boundary comes from a multipart/form-data Content-Type, bounded and RFC 2046 clean") {
    CHECK(*multipart_boundary("multipart/form-data; boundary=----formdata-undici-012345678901") ==
          "----formdata-undici-012345678901");
    CHECK(*multipart_boundary("Multipart/Form-Data;boundary=\"a b'()+_,-./:=?\"") ==
          "a b'()+_,-./:=?");
    CHECK(*multipart_boundary("multipart/form-data; charset=utf-8; BOUNDARY=x") == "x");
    for (std::string_view bad :
         {"application/octet-stream; boundary=x", "multipart/form-data",
          "multipart/form-data; boundary=", "multipart/form-data; boundary=\"\"",
          "multipart/form-data; boundary=\"ends in space \"",
          "multipart/form-data; boundary=\"has\\\"quote\"",
          "multipart/form-data; boundary=a; boundary=b", "multipart/form-data; boundary",
          "multipart/mixed; boundary=x", "", "form-data"}) {
        CAPTURE(bad);
        const auto r = multipart_boundary(bad);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::invalid_argument);
    }
    CHECK(multipart_boundary("multipart/form-data; boundary=" + std::string(70, 'b')));
    CHECK(!multipart_boundary("multipart/form-data; boundary=" + std::string(71, 'b')));
    // A parser made with an empty or oversize boundary refuses every body.
    multipart_parser parser("");
    std::vector<multipart_event> events;
    CHECK(!parser.feed("\r\n--\r\n\r\n\r\n----", events));
}

TEST_CASE("a quoted filename is unescaped and otherwise taken as sent") {
    const std::string body =
        "--XyZ\r\ncontent-disposition: form-data; filename=\"dir/a\\\"b%22c.txt\"; "
        "name=\"file\"\r\n\r\n"
        "x\r\n--XyZ--";
    const auto p = parse_whole(body);
    REQUIRE(p.finish_ok);
    REQUIRE(p.parts.size() == 1);
    CHECK(p.parts[0].head.filename == "dir/a\"b%22c.txt");
    CHECK(p.parts[0].head.name == "file");
    CHECK(p.parts[0].data == "x");
}
