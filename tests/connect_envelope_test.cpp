// The Connect wire forms: envelopes split anyhow, the end-stream message, the unary error body,
// and the code tables (HTTP status both ways, moat errc both ways).
#include "http/connect_envelope.hpp"

#include <doctest/doctest.h>

#include <ostream>
#include <string>
#include <vector>

namespace connect = moat::http::connect;

namespace {

// The bytes of the stream the SDK's Process/Start receives (three messages and the end).
std::string start_stream() {
    std::string s;
    connect::append_envelope(s, 0, R"({"event":{"start":{"pid":1000}}})");
    connect::append_envelope(s, 0, R"({"event":{"data":{"stdout":"aGkK"}}})");
    connect::append_envelope(s, 0, "");
    connect::append_envelope(s, connect::flag_end_stream, "{}");
    return s;
}

}  // namespace

TEST_CASE("an envelope has a flags byte and a big-endian length before its payload") {
    const auto e = connect::encode_envelope(0, std::string(0x4a, 'x'));
    REQUIRE(e.size() == 5 + 0x4a);
    CHECK(e.substr(0, 5) == std::string("\x00\x00\x00\x00\x4a", 5));
    const auto big = connect::encode_envelope(connect::flag_end_stream, std::string(0x10203, 'y'));
    CHECK(big.substr(0, 5) == std::string("\x02\x00\x01\x02\x03", 5));
}

TEST_CASE("the decoder yields the same envelopes however the bytes are split") {
    const auto bytes = start_stream();
    for (std::size_t step :
         {std::size_t{1}, std::size_t{2}, std::size_t{5}, std::size_t{7}, bytes.size()}) {
        CAPTURE(step);
        connect::envelope_decoder decoder(1024);
        std::vector<connect::envelope> out;
        for (std::size_t i = 0; i < bytes.size(); i += step) {
            REQUIRE(decoder.feed(std::string_view(bytes).substr(i, step), out));
        }
        REQUIRE(out.size() == 4);
        CHECK(out[0].payload == R"({"event":{"start":{"pid":1000}}})");
        CHECK(out[2].payload.empty());
        CHECK(!out[2].is_end_stream());
        CHECK(out[3].is_end_stream());
        CHECK(decoder.has_ended());
        CHECK(decoder.finish());
    }
}

TEST_CASE("a compressed, reserved-flag or oversize envelope is a protocol error") {
    std::vector<connect::envelope> out;
    {
        connect::envelope_decoder decoder(1024);
        const auto r = decoder.feed(connect::encode_envelope(connect::flag_compressed, "z"), out);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::protocol_error);
        CHECK(r.error().detail.find("compressed") != std::string::npos);
        CHECK(!decoder.feed("", out));  // finished: it stays failed
    }
    {
        connect::envelope_decoder decoder(1024);
        const auto r = decoder.feed(connect::encode_envelope(0x80, "z"), out);
        REQUIRE(!r);
        CHECK(r.error().detail.find("reserved") != std::string::npos);
    }
    {
        // Refused on the prefix alone: none of the 4 GiB is buffered.
        connect::envelope_decoder decoder(1024);
        const auto r = decoder.feed(std::string("\x00\xff\xff\xff\xff", 5), out);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::protocol_error);
        CHECK(r.error().detail.find("over the cap of 1024") != std::string::npos);
        CHECK(decoder.buffered() == 0);
    }
    {
        connect::envelope_decoder decoder(3);
        CHECK(decoder.feed(connect::encode_envelope(0, "abc"), out));  // exactly the cap
        CHECK(!decoder.feed(connect::encode_envelope(0, "abcd"), out));
    }
    CHECK(out.size() == 1);
}

TEST_CASE("a stream that stops early or runs past its end-stream message is a protocol error") {
    std::vector<connect::envelope> out;
    {
        connect::envelope_decoder decoder(1024);
        REQUIRE(decoder.feed(connect::encode_envelope(0, "{}"), out));
        const auto r = decoder.finish();
        REQUIRE(!r);
        CHECK(r.error().detail.find("without the end-stream message") != std::string::npos);
    }
    {
        connect::envelope_decoder decoder(1024);
        REQUIRE(decoder.feed(connect::encode_envelope(0, "{}").substr(0, 6), out));
        CHECK(decoder.buffered() == 1);
        const auto r = decoder.finish();
        REQUIRE(!r);
        CHECK(r.error().detail.find("inside an envelope") != std::string::npos);
    }
    {
        connect::envelope_decoder decoder(1024);
        auto bytes = connect::encode_envelope(connect::flag_end_stream, "{}");
        bytes += connect::encode_envelope(0, "{}");
        const auto r = decoder.feed(bytes, out);
        REQUIRE(!r);
        CHECK(r.error().detail.find("after the end-stream") != std::string::npos);
    }
}

TEST_CASE("the end-stream message carries an optional error and metadata") {
    const auto empty = connect::parse_end_stream("{}");
    REQUIRE(empty);
    CHECK(!empty->error);
    CHECK(empty->metadata.empty());

    const auto failed = connect::parse_end_stream(
        R"({"error":{"code":"not_found","message":"no such process","details":[]},)"
        R"("metadata":{"x-trace":["a","b"]},"extra":1})");
    REQUIRE(failed);
    REQUIRE(failed->error);
    CHECK(failed->error->code == connect::code::not_found);
    CHECK(failed->error->message == "no such process");
    CHECK(failed->metadata.at("x-trace") == std::vector<std::string>{"a", "b"});

    connect::end_stream message;
    message.error = connect::connect_error{connect::code::deadline_exceeded, "too \"slow\""};
    message.metadata["k"] = {"v"};
    const auto encoded = connect::encode_end_stream(message);
    CHECK(
        encoded ==
        R"({"error":{"code":"deadline_exceeded","message":"too \"slow\""},"metadata":{"k":["v"]}})");
    const auto again = connect::parse_end_stream(encoded);
    REQUIRE(again);
    CHECK(again->error->message == "too \"slow\"");
    CHECK(connect::encode_end_stream({}) == "{}");

    for (const char* bad : {"", "[]", "{", R"({"error":{"code":"nope"}})", R"({"error":7})",
                            R"({"metadata":{"k":"v"}})", R"({"metadata":{"k":[1]}})"}) {
        CAPTURE(bad);
        const auto r = connect::parse_end_stream(bad);
        REQUIRE(!r);
        CHECK(r.error().code == moat::errc::protocol_error);
    }
}

TEST_CASE("a unary error body names its code, and the status implies one when it does not") {
    const auto named =
        connect::parse_unary_error(404, R"({"code":"not_found","message":"/x: no such file"})");
    CHECK(named.code == connect::code::not_found);
    CHECK(named.message == "/x: no such file");
    CHECK(connect::parse_unary_error(503, "<html>busy</html>").code == connect::code::unavailable);
    CHECK(connect::parse_unary_error(401, "").code == connect::code::unauthenticated);
    CHECK(connect::parse_unary_error(404, R"({"code":"bogus"})").code ==
          connect::code::unimplemented);
    CHECK(connect::parse_unary_error(418, "{}").code == connect::code::unknown);
    CHECK(connect::encode_unary_error({connect::code::unauthenticated, "bad key"}) ==
          R"({"code":"unauthenticated","message":"bad key"})");
}

TEST_CASE("every Connect code has a name, a status and an errc, per the protocol tables") {
    struct row {
        connect::code code;
        const char* name;
        int status;
        moat::errc errc;
    };
    const row rows[] = {
        {connect::code::canceled, "canceled", 499, moat::errc::cancelled},
        {connect::code::unknown, "unknown", 500, moat::errc::backend_failure},
        {connect::code::invalid_argument, "invalid_argument", 400, moat::errc::invalid_argument},
        {connect::code::deadline_exceeded, "deadline_exceeded", 504, moat::errc::deadline_exceeded},
        {connect::code::not_found, "not_found", 404, moat::errc::file_not_found},
        {connect::code::already_exists, "already_exists", 409, moat::errc::invalid_argument},
        {connect::code::permission_denied, "permission_denied", 403, moat::errc::permission_denied},
        {connect::code::resource_exhausted, "resource_exhausted", 429, moat::errc::rate_limited},
        {connect::code::failed_precondition, "failed_precondition", 400,
         moat::errc::invalid_argument},
        {connect::code::aborted, "aborted", 409, moat::errc::backend_failure},
        {connect::code::out_of_range, "out_of_range", 400, moat::errc::invalid_argument},
        {connect::code::unimplemented, "unimplemented", 501, moat::errc::not_supported},
        {connect::code::internal, "internal", 500, moat::errc::backend_failure},
        {connect::code::unavailable, "unavailable", 503, moat::errc::backend_failure},
        {connect::code::data_loss, "data_loss", 500, moat::errc::backend_failure},
        {connect::code::unauthenticated, "unauthenticated", 401, moat::errc::unauthorized},
    };
    for (const auto& r : rows) {
        CAPTURE(r.name);
        CHECK(connect::to_string(r.code) == r.name);
        CHECK(connect::code_from_string(r.name) == r.code);
        CHECK(connect::http_status(r.code) == r.status);
        CHECK(connect::to_errc(r.code) == r.errc);
    }
    CHECK(!connect::code_from_string("NOT_FOUND"));
    CHECK(connect::code_from_http_status(400) == connect::code::internal);
    CHECK(connect::code_from_http_status(403) == connect::code::permission_denied);
    CHECK(connect::code_from_http_status(429) == connect::code::unavailable);
    CHECK(connect::code_from_http_status(502) == connect::code::unavailable);
    CHECK(connect::code_from_http_status(504) == connect::code::unavailable);
    CHECK(connect::code_from_http_status(500) == connect::code::unknown);

    // moat's codes go out as the Connect code that comes back as the same kind.
    for (const auto e :
         {moat::errc::cancelled, moat::errc::deadline_exceeded, moat::errc::invalid_argument,
          moat::errc::permission_denied, moat::errc::rate_limited, moat::errc::not_supported,
          moat::errc::unauthorized, moat::errc::backend_failure}) {
        CAPTURE(moat::to_string(e));
        CHECK(connect::to_errc(connect::from_errc(moat::make_error_code(e))) == e);
    }
    CHECK(connect::from_errc(moat::make_error_code(moat::errc::sandbox_not_found)) ==
          connect::code::not_found);
    CHECK(connect::from_errc(moat::make_error_code(moat::errc::shutting_down)) ==
          connect::code::unavailable);
    CHECK(connect::from_errc(std::make_error_code(std::errc::io_error)) == connect::code::internal);
}

TEST_CASE("a Connect error becomes a one-line moat error naming its code") {
    const auto e = connect::to_error({connect::code::unauthenticated, "bad\ntoken"});
    CHECK(e.code == moat::errc::unauthorized);
    CHECK(e.detail == "connect unauthenticated: bad token");
    const auto long_message = connect::to_error({connect::code::internal, std::string(5000, 'x')});
    CHECK(long_message.detail.size() < 300);
    CHECK(connect::to_error({connect::code::unavailable, ""}).detail == "connect unavailable");
}
