// The streaming gzip decoder (src/http/gzip_decoder.hpp), against gzip bodies made with zlib's
// own gzip writer: whole, split at every byte, multi-member, corrupt, cut short, and a bomb that
// stops at its cap holding one piece.
#include "http/gzip_decoder.hpp"

#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

using moat::errc;
using moat::http::gzip_decoder;

namespace {

std::string gzip(std::string_view data) {
    z_stream z{};
    REQUIRE(deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 9,
                         Z_DEFAULT_STRATEGY) == Z_OK);
    std::string out(deflateBound(&z, data.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z.avail_in = static_cast<uInt>(data.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

struct decoded {
    std::string out;
    std::optional<moat::error> failure;
    bool finished = false;
    std::size_t largest_piece = 0;
};

decoded decode_all(std::string_view body, std::size_t step, std::uint64_t cap,
                   std::size_t most = 64 * 1024) {
    gzip_decoder d(cap);
    decoded r;
    for (std::size_t at = 0; at < body.size(); at += step) {
        std::string_view input = body.substr(at, step);
        for (;;) {  // until an empty piece: the input used up and nothing held
            auto piece = d.decode(input, most);
            if (!piece) {
                r.failure = piece.error();
                return r;
            }
            if (piece->empty()) break;
            r.largest_piece = std::max(r.largest_piece, piece->size());
            r.out += *piece;
        }
        REQUIRE(input.empty());
    }
    r.finished = d.finished();
    return r;
}

}  // namespace

TEST_CASE("a gzip body decodes whole however it is split, members one after another") {
    std::string text;
    for (int i = 0; i < 20000; ++i) text += static_cast<char>((i * 7919) % 256);
    const auto body = gzip(text);
    for (const std::size_t step :
         {std::size_t{1}, std::size_t{7}, std::size_t{4096}, body.size()}) {
        auto r = decode_all(body, step, 1 << 20);
        REQUIRE_FALSE(r.failure);
        CHECK(r.out == text);
        CHECK(r.finished);
    }
    auto two = decode_all(gzip("first ") + gzip("second"), 3, 1 << 20);
    REQUIRE_FALSE(two.failure);
    CHECK(two.out == "first second");
    CHECK(two.finished);
    auto empty = decode_all(gzip(""), 1, 16);
    REQUIRE_FALSE(empty.failure);
    CHECK(empty.out.empty());
    CHECK(empty.finished);
}

TEST_CASE("output zlib holds once the input is used up is still delivered, in small pieces") {
    // One feed of the whole body, then pieces far smaller than what it inflates to: most of the
    // output comes from calls with no input left.
    const std::string text(300000, 'a');
    auto r = decode_all(gzip(text), 1 << 20, 1 << 20, 1000);
    REQUIRE_FALSE(r.failure);
    CHECK(r.out == text);
    CHECK(r.finished);
    CHECK(r.largest_piece == 1000);
}

TEST_CASE("a gzip body that is not gzip, corrupt or cut short is an error, never output") {
    auto plain = decode_all("hello, not gzip", 100, 1 << 20);
    REQUIRE(plain.failure);
    CHECK(plain.failure->code == errc::protocol_error);
    CHECK(plain.failure->detail.find("the gzip body is corrupt") == 0);

    auto body = gzip("checked by its trailer");
    body[body.size() - 6] ^= 0x01;  // the CRC-32
    auto corrupt = decode_all(body, 5, 1 << 20);
    REQUIRE(corrupt.failure);
    CHECK(corrupt.failure->code == errc::protocol_error);

    const auto whole = gzip("cut short before its end");
    auto cut = decode_all(std::string_view(whole).substr(0, whole.size() - 4), 5, 1 << 20);
    REQUIRE_FALSE(cut.failure);
    CHECK_FALSE(cut.finished);  // the caller's "ends before its stream does"
}

TEST_CASE("a gzip bomb stops at its cap, one piece at a time") {
    const std::string zeros(16 << 20, '\0');
    const auto bomb = gzip(zeros);  // about 16 KiB
    CHECK(bomb.size() < 64 * 1024);
    auto r = decode_all(bomb, 4096, 1 << 20, 32 * 1024);
    REQUIRE(r.failure);
    CHECK(r.failure->code == errc::too_large);
    CHECK(r.failure->detail == "the gzip body inflates to more than 1048576 bytes");
    CHECK(r.out.size() <= 1 << 20);
    CHECK(r.largest_piece <= 32 * 1024);
    auto exact = decode_all(gzip(std::string(1000, 'x')), 100, 1000);
    REQUIRE_FALSE(exact.failure);
    CHECK(exact.out.size() == 1000);
}
