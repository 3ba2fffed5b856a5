// HTTP/1.1 framing (src/http/message_parser.*) and heads (src/http/message.*): what the server
// accepts from clients and the client from servers, fed whole, split at every byte, and broken.
#include "http/message.hpp"
#include "http/message_parser.hpp"

#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

namespace http = moat::http;
using kind = http::parse_event::kind;

namespace {

// What feeding a byte stream produced, message by message.
struct parsed {
    std::vector<http::request_head> requests;
    std::vector<http::response_head> responses;
    std::vector<std::string> bodies;
    std::vector<bool> keep_alive;
    int ends = 0;
    http::parse_error error = http::parse_error::none;
    std::string detail;
};

// Feeds `wire` in slices of `step` bytes (0: all at once), then finish() if `close_after`.
parsed parse(http::message_parser& p, std::string_view wire, std::size_t step = 0,
             bool close_after = false) {
    parsed out;
    auto record = [&](const http::parse_event& e) {
        switch (e.what) {
            case kind::head:
                out.requests.push_back(p.request());
                out.responses.push_back(p.response());
                out.bodies.emplace_back();
                break;
            case kind::body:
                if (out.bodies.empty()) out.bodies.emplace_back();  // the head was fed before
                out.bodies.back().append(e.body);
                break;
            case kind::end:
                ++out.ends;
                out.keep_alive.push_back(p.keep_alive());
                break;
            case kind::error:
                out.error = p.error();
                out.detail = p.error_detail();
                break;
            case kind::need_more:
                break;
        }
    };
    std::size_t offset = 0;
    while (offset < wire.size() && out.error == http::parse_error::none) {
        std::size_t length = wire.size() - offset;
        if (step != 0 && step < length) length = step;
        std::string_view slice = wire.substr(offset, length);
        offset += length;
        while (out.error == http::parse_error::none) {
            const auto e = p.feed(slice);
            record(e);
            slice.remove_prefix(e.consumed);
            if (e.what == kind::need_more) break;
        }
    }
    if (close_after && out.error == http::parse_error::none) {
        auto e = p.finish();
        record(e);
        if (e.what == kind::head) record(p.finish());
    }
    return out;
}

// `wire` on one line, CR, LF and tab spelled out, for a failure message.
std::string printable(std::string_view wire) {
    std::string out;
    for (const char c : wire) {
        if (c == '\r') {
            out += "\\r";
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else {
            out += c;
        }
    }
    return out;
}

parsed parse_request(std::string_view wire, std::size_t step = 0, http::parser_limits limits = {}) {
    http::message_parser p(http::message_parser::mode::request, limits);
    return parse(p, wire, step);
}

}  // namespace

TEST_CASE("a GET request parses into method, target, version and headers") {
    const auto r = parse_request(
        "GET /sandboxes/abc?x=1 HTTP/1.1\r\nHost: localhost:3000\r\nX-Thing:  spaced value  \r\n"
        "x-thing: second\r\n\r\n");
    REQUIRE(r.error == http::parse_error::none);
    REQUIRE(r.requests.size() == 1);
    const auto& head = r.requests[0];
    CHECK(head.method == "GET");
    CHECK(head.target == "/sandboxes/abc?x=1");
    CHECK(head.path() == "/sandboxes/abc");
    CHECK(head.query() == "x=1");
    CHECK(head.version_minor == 1);
    CHECK(head.headers.find("HOST") == "localhost:3000");
    CHECK(head.headers.find("x-thing") == "spaced value");
    CHECK(head.headers.find_all("X-THING").size() == 2);
    CHECK_FALSE(head.headers.find("absent").has_value());
    CHECK(r.ends == 1);
    CHECK(r.keep_alive[0]);
    CHECK(r.bodies[0].empty());
}

TEST_CASE("a request split at every byte parses the same as whole") {
    const std::string wire =
        "POST /files?path=/a HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\nhello world"
        "PUT /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer-A: x\r\n\r\n";
    for (std::size_t step : {0, 1, 2, 3, 7, 64}) {
        CAPTURE(step);
        const auto r = parse_request(wire, step);
        REQUIRE(r.error == http::parse_error::none);
        REQUIRE(r.requests.size() == 2);
        CHECK(r.requests[0].method == "POST");
        CHECK(r.bodies[0] == "hello world");
        CHECK(r.requests[1].method == "PUT");
        CHECK(r.bodies[1] == "hello world");
        CHECK(r.ends == 2);
        CHECK_FALSE(r.requests[1].headers.contains("Trailer-A"));  // trailers are dropped
    }
}

TEST_CASE("the head event stops the parser so the caller can look before the body") {
    http::message_parser p(http::message_parser::mode::request);
    const std::string_view wire =
        "POST /x HTTP/1.1\r\nContent-Length: 4\r\n\r\nbodyGET /y HTTP/1.1\r\n\r\n";
    auto e = p.feed(wire);
    REQUIRE(e.what == kind::head);
    CHECK(wire.substr(e.consumed).starts_with("body"));
    CHECK(p.content_length() == 4u);
    CHECK(p.has_body());
    CHECK_FALSE(p.is_chunked());
    CHECK(p.is_in_body());
    auto rest = wire.substr(e.consumed);
    e = p.feed(rest);
    REQUIRE(e.what == kind::body);
    CHECK(e.body == "body");
    rest.remove_prefix(e.consumed);
    e = p.feed(rest);
    REQUIRE(e.what == kind::end);
    CHECK(p.is_between_messages());
    rest.remove_prefix(e.consumed);
    CHECK(rest.starts_with("GET /y"));  // the next message was not looked at
    e = p.feed(rest);
    REQUIRE(e.what == kind::head);
    CHECK(p.request().target == "/y");
    CHECK_FALSE(p.has_body());
}

TEST_CASE("keep-alive follows the version and the Connection header") {
    CHECK(parse_request("GET / HTTP/1.1\r\n\r\n").keep_alive.at(0));
    CHECK_FALSE(parse_request("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive.at(0));
    CHECK_FALSE(parse_request("GET / HTTP/1.0\r\n\r\n").keep_alive.at(0));
    CHECK(parse_request("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive.at(0));
}

TEST_CASE("a head past the byte cap or the header count cap is refused") {
    http::parser_limits limits;
    limits.max_head_bytes = 1024;
    limits.max_header_count = 8;
    const std::string big_value(2000, 'a');
    for (std::size_t step : {0, 1, 100}) {
        CAPTURE(step);
        auto r = parse_request("GET / HTTP/1.1\r\nX-Big: " + big_value + "\r\n\r\n", step, limits);
        CHECK(r.error == http::parse_error::head_too_large);
        CHECK(r.detail.find("aaaa") == std::string::npos);
        // Whitespace is not kept but still counts.
        r = parse_request("GET / HTTP/1.1\r\nX-Big:" + std::string(2000, ' ') + "a\r\n\r\n", step,
                          limits);
        CHECK(r.error == http::parse_error::head_too_large);
    }
    std::string many = "GET / HTTP/1.1\r\n";
    for (int i = 0; i < 9; ++i) many += "H" + std::to_string(i) + ": v\r\n";
    CHECK(parse_request(many + "\r\n", 0, limits).error == http::parse_error::too_many_headers);
    // A long request line counts too.
    CHECK(parse_request("GET /" + std::string(2000, 'p') + " HTTP/1.1\r\n\r\n", 0, limits).error ==
          http::parse_error::head_too_large);
}

TEST_CASE("a body past the limit is refused, declared or chunked") {
    http::message_parser p(http::message_parser::mode::request);
    auto e = p.feed("POST / HTTP/1.1\r\nContent-Length: 99999999999999\r\n\r\n");
    REQUIRE(e.what == kind::head);
    CHECK_FALSE(p.set_body_limit(1024));
    CHECK(p.error() == http::parse_error::body_too_large);
    CHECK(p.feed("x").what == kind::error);  // the error sticks

    http::message_parser c(http::message_parser::mode::request);
    std::string wire = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    e = c.feed(wire);
    REQUIRE(e.what == kind::head);
    CHECK(c.is_chunked());
    CHECK_FALSE(c.content_length().has_value());
    REQUIRE(c.set_body_limit(10));
    const auto r = parse(c, "6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n");
    CHECK(r.error == http::parse_error::body_too_large);
}

TEST_CASE("malformed requests are errors, never a message") {
    const std::vector<std::string> bad = {
        "garbage\r\n\r\n",
        "GET / HTTP/1.1 extra\r\n\r\n",
        "GET /\x01 HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nBad Header: v\r\n\r\n",
        "GET / HTTP/1.1\r\nX: a\x7f"
        "b\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 999999999999999999999999\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
        // llhttp's loose mode skipped the two bytes after the data and read "f" as the next size.
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked, identity\r\n\r\n",
        "GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
    };
    for (const auto& wire : bad) {
        for (std::size_t step : {0, 1}) {
            CAPTURE(wire);
            CAPTURE(step);
            const auto r = parse_request(wire, step);
            CHECK(r.error != http::parse_error::none);
            CHECK(r.ends == 0);
            CHECK_FALSE(r.detail.empty());
        }
    }
    CHECK(parse_request("GET / HTTP/2.0\r\n\r\n").error != http::parse_error::none);
    CHECK(parse_request("CONNECT h:443 HTTP/1.1\r\n\r\n").error == http::parse_error::unsupported);
}

TEST_CASE(
    "a folded header, a bare LF or a second Host is refused, whole and split at every byte, in "
    "requests and responses") {
    struct refusal {
        http::message_parser::mode mode;
        std::string wire;
        std::string named;  // in the detail
    };
    const auto request = http::message_parser::mode::request;
    const auto response = http::message_parser::mode::response;
    const std::vector<refusal> refused = {
        // A fold whose first line is empty: llhttp joined it silently, so a front end that reads
        // the fold differently frames another message (smuggling) or sees another key.
        {request, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n 2\r\n\r\nab", "fold"},
        {request,
         "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
         "fold"},
        {request, "GET / HTTP/1.1\r\nHost: a\r\nX-API-Key:\r\n KEY\r\n\r\n", "fold"},
        {request, "GET / HTTP/1.1\r\nHost: a\r\nX-API-Key: \r\n\tKEY\r\n\r\n", "fold"},
        {request, "GET / HTTP/1.1\r\n Host: a\r\n\r\n", "fold"},
        {request, "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "Host"},
        {request, "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nhost: a\r\n\r\n", "Host"},
        {request, "GET / HTTP/1.1\nHost: a\r\n\r\n", "bare LF"},
        {request, "GET / HTTP/1.1\r\nHost: a\r\n\n", "bare LF"},
        {request, "\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", "bare LF"},
        {response, "HTTP/1.1 200 OK\r\nContent-Length:\r\n 2\r\n\r\nab", "fold"},
        {response, "HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\tchunked\r\n\r\n0\r\n\r\n", "fold"},
        {response, "HTTP/1.1 200 OK\nContent-Length: 2\r\n\r\nab", "bare LF"},
        {response, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\nab", "bare LF"},
    };
    for (const auto& c : refused) {
        for (std::size_t step : {0, 1, 2, 3}) {
            const std::string wire = printable(c.wire);
            CAPTURE(wire);
            CAPTURE(step);
            http::message_parser p(c.mode);
            const auto r = parse(p, c.wire, step);
            CHECK(r.error == http::parse_error::malformed);
            CHECK(r.requests.empty());
            CHECK(r.ends == 0);
            CHECK_MESSAGE(r.detail.find(c.named) != std::string::npos, r.detail);
        }
    }
    // What stays accepted: the blank line a client may send before a request (RFC 9112, 2.2), a
    // body with bare LFs and spaces after them, a Host beside a Host-like name, and a pipelined
    // second request with its own Host.
    const auto ok = parse_request(
        "\r\nPOST / HTTP/1.1\r\nHost: a\r\nX-Host: b\r\nContent-Length: 6\r\n\r\na\n b\n\t"
        "GET / HTTP/1.1\r\nHost: c\r\n\r\n",
        1);
    REQUIRE(ok.error == http::parse_error::none);
    REQUIRE(ok.requests.size() == 2);
    CHECK(ok.bodies[0] == "a\n b\n\t");
    CHECK(ok.requests[1].headers.find("host") == "c");
    CHECK(ok.ends == 2);
}

TEST_CASE("an upgrade request is parsed as plain HTTP, and what follows as the next request") {
    const auto r = parse_request(
        "GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nGET /two HTTP/1.1\r\n\r\n");
    REQUIRE(r.error == http::parse_error::none);
    REQUIRE(r.requests.size() == 2);
    CHECK(r.requests[1].target == "/two");
}

TEST_CASE("a truncated request is reported by finish, a clean close is not") {
    http::message_parser p(http::message_parser::mode::request);
    auto r = parse(p, "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", 0, true);
    CHECK(r.error == http::parse_error::truncated);

    http::message_parser q(http::message_parser::mode::request);
    r = parse(q, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", 0, true);
    CHECK(r.error == http::parse_error::truncated);

    http::message_parser h(http::message_parser::mode::request);
    r = parse(h, "GET / HTTP/1.1\r\nHost:", 0, true);
    CHECK(r.error == http::parse_error::truncated);

    http::message_parser clean(http::message_parser::mode::request);
    r = parse(clean, "GET / HTTP/1.1\r\n\r\n", 0, true);
    CHECK(r.error == http::parse_error::none);
    CHECK(r.ends == 1);
}

TEST_CASE("responses parse with a length, chunked, to the end of the stream, and without a body") {
    http::message_parser p(http::message_parser::mode::response);
    auto r =
        parse(p,
              "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
              "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nnope\r\n0\r\n\r\n"
              "HTTP/1.1 204 No Content\r\n\r\n",
              1);
    REQUIRE(r.error == http::parse_error::none);
    REQUIRE(r.responses.size() == 3);
    CHECK(r.responses[0].status == 200);
    CHECK(r.responses[0].reason == "OK");
    CHECK(r.bodies[0] == "ok");
    CHECK(r.responses[1].status == 404);
    CHECK(r.bodies[1] == "nope");
    CHECK(r.responses[2].status == 204);
    CHECK(r.ends == 3);

    http::message_parser to_close(http::message_parser::mode::response);
    r = parse(to_close, "HTTP/1.1 200 OK\r\n\r\nall of it", 3, true);
    REQUIRE(r.error == http::parse_error::none);
    CHECK(r.bodies.at(0) == "all of it");
    CHECK(r.ends == 1);
    CHECK_FALSE(r.keep_alive.at(0));

    // The answer to HEAD declares a length but has no body: the next response follows at once.
    http::message_parser head(http::message_parser::mode::response);
    head.expect_no_body();
    r = parse(head,
              "HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nHTTP/1.1 201 Created\r\n"
              "Content-Length: 0\r\n\r\n");
    REQUIRE(r.error == http::parse_error::none);
    REQUIRE(r.responses.size() == 2);
    CHECK(r.responses[1].status == 201);
    CHECK(r.ends == 2);

    // 204 and 304 have no body even with a Content-Length (found by the response fuzzer: llhttp
    // read the next response as the body).
    http::message_parser no_content(http::message_parser::mode::response);
    r = parse(no_content,
              "HTTP/1.1 204 No Content\r\nContent-Length: 50\r\n\r\nHTTP/1.1 304 Not "
              "Modified\r\nContent-Length: 9\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    REQUIRE(r.error == http::parse_error::none);
    REQUIRE(r.responses.size() == 3);
    CHECK(r.responses[2].status == 200);
    CHECK(r.ends == 3);

    // An interim 100 Continue is a message of its own before the final response.
    http::message_parser interim(http::message_parser::mode::response);
    r = parse(interim,
              "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx");
    REQUIRE(r.responses.size() == 2);
    CHECK(r.responses[0].status == 100);
    CHECK(r.bodies[1] == "x");

    http::message_parser garbage(http::message_parser::mode::response);
    r = parse(garbage, "HTTP/1.1 abc OK\r\n\r\n");
    CHECK(r.error == http::parse_error::malformed);

    // llhttp itself takes a two-digit status (found by the response fuzzer).
    http::message_parser short_status(http::message_parser::mode::response);
    r = parse(short_status, "HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n");
    CHECK(r.error == http::parse_error::malformed);
    CHECK(r.responses.empty());

    http::message_parser upgrade(http::message_parser::mode::response);
    r = parse(upgrade, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n");
    CHECK(r.error == http::parse_error::unsupported);
}

TEST_CASE("the head writers produce parseable heads and refuse injected line breaks") {
    http::response_head head;
    head.status = 413;
    head.headers.add("Content-Type", "application/json");
    head.headers.add("Content-Length", "0");
    std::string out;
    REQUIRE(http::append_response_head(out, head));
    CHECK(out ==
          "HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\n"
          "Content-Length: 0\r\n\r\n");

    http::request_head request;
    request.method = "POST";
    request.target = "/sandboxes";
    request.headers.add("Host", "api.e2b.app");
    std::string wire;
    REQUIRE(http::append_request_head(wire, request));
    const auto r = parse_request(wire);
    REQUIRE(r.requests.size() == 1);
    CHECK(r.requests[0].headers.find("host") == "api.e2b.app");

    http::request_head injected = request;
    injected.headers.add("X-Evil", "a\r\nX-Injected: 1");
    std::string refused;
    CHECK_FALSE(http::append_request_head(refused, injected));
    CHECK(refused.empty());
    injected = request;
    injected.target = "/a HTTP/1.1\r\nX: y\r\n\r\nGET /b";
    CHECK_FALSE(http::append_request_head(refused, injected));
    injected = request;
    injected.headers.add("Bad Name", "v");
    CHECK_FALSE(http::append_request_head(refused, injected));
    CHECK(refused.empty());
}

TEST_CASE("header lists compare names case-insensitively and find comma-separated tokens") {
    http::header_list h;
    h.add("Connection", "keep-alive, Upgrade");
    h.add("Transfer-Encoding", "chunked");
    CHECK(h.has_token("connection", "upgrade"));
    CHECK(h.has_token("CONNECTION", "Keep-Alive"));
    CHECK_FALSE(h.has_token("connection", "close"));
    h.set("connection", "close");
    CHECK(h.size() == 2);
    CHECK(h.find("Connection") == "close");
    CHECK(h.remove("TRANSFER-encoding") == 1);
    CHECK(http::is_secret_header("authorization"));
    CHECK(http::is_secret_header("X-API-KEY"));
    CHECK(http::is_secret_header("x-access-token"));
    CHECK_FALSE(http::is_secret_header("content-type"));
}
