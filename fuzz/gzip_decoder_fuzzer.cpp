// libFuzzer target for the streaming gzip decoder (src/http/gzip_decoder.cpp: moat serve's
// Content-Encoding: gzip uploads). Any input, split anyhow and taken in pieces of any size, gives
// the same output and the same outcome; no piece is larger than asked for and the total never
// passes the cap.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_gzip_decoder_fuzzer &&
//   build/fuzz/fuzz/moat_gzip_decoder_fuzzer -max_total_time=60 fuzz/corpus/gzip_decoder
#include "http/gzip_decoder.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

constexpr std::uint64_t cap = 1 << 20;

struct outcome {
    std::string out;
    bool failed = false;
    bool finished = false;
};

outcome decode(std::string_view bytes, std::size_t step, std::size_t most) {
    moat::http::gzip_decoder decoder(cap);
    outcome r;
    for (std::size_t at = 0; at < bytes.size(); at += step) {
        std::string_view input = bytes.substr(at, step);
        for (;;) {  // until an empty piece: the input used up and nothing held
            auto piece = decoder.decode(input, most);
            if (!piece) {
                r.failed = true;
                require(!decoder.decode(input, most));  // an error stays an error
                return r;
            }
            require(piece->size() <= most);
            if (piece->empty()) {
                require(input.empty());
                break;
            }
            r.out += *piece;
            require(r.out.size() <= cap);
        }
    }
    r.finished = decoder.finished();
    return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return 0;
    const std::size_t step = 1 + data[0] % 64;
    const std::size_t most = 1 + static_cast<std::size_t>(data[1]) * 97;
    const std::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
    const auto whole = decode(bytes, bytes.size() + 1, 64 * 1024);
    const auto split = decode(bytes, step, most);
    require(whole.failed == split.failed);
    // Output before a failure can differ with the split (less is decoded before the bad byte).
    if (!whole.failed) {
        require(whole.out == split.out);
        require(whole.finished == split.finished);
    }
    return 0;
}
