// libFuzzer target for the Connect envelope decoder (every streamed body a Connect peer sends)
// and the end-stream and unary-error parsers, with round trips through the encoders.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_connect_envelope_fuzzer &&
//   build/fuzz/fuzz/moat_connect_envelope_fuzzer -max_total_time=60 fuzz/corpus/connect_envelope
#include "http/connect_envelope.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace connect = moat::http::connect;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

constexpr std::size_t cap = 4096;

// Decodes `bytes` fed in pieces of `step` bytes.
struct decoded {
    std::vector<connect::envelope> envelopes;
    bool failed = false;
    bool finished = false;
};

decoded decode(std::string_view bytes, std::size_t step) {
    decoded out;
    connect::envelope_decoder decoder(cap);
    for (std::size_t i = 0; i < bytes.size(); i += step) {
        if (!decoder.feed(bytes.substr(i, step), out.envelopes)) {
            out.failed = true;
            break;
        }
        require(decoder.buffered() <= connect::envelope_prefix_size + cap);
    }
    out.finished = !out.failed && decoder.finish().has_value();
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);

    // However the bytes are split, the decoder sees the same envelopes and the same outcome.
    const auto whole = decode(bytes, bytes.size() + 1);
    const auto bytewise = decode(bytes, 1);
    require(whole.failed == bytewise.failed);
    require(whole.finished == bytewise.finished);
    require(whole.envelopes.size() == bytewise.envelopes.size());
    std::string reencoded;
    for (std::size_t i = 0; i < whole.envelopes.size(); ++i) {
        const auto& e = whole.envelopes[i];
        require(e.payload == bytewise.envelopes[i].payload);
        require(e.flags == bytewise.envelopes[i].flags);
        require(e.payload.size() <= cap);
        require((e.flags & connect::flag_compressed) == 0);
        require(!e.is_end_stream() || i + 1 == whole.envelopes.size());
        connect::append_envelope(reencoded, e.flags, e.payload);
    }
    // What was decoded re-encodes to the bytes it came from.
    require(bytes.substr(0, reencoded.size()) == reencoded);

    // An end-stream payload parses or is refused; a parsed one round-trips.
    for (const auto& e : whole.envelopes) {
        if (!e.is_end_stream()) continue;
        const auto parsed = connect::parse_end_stream(e.payload);
        if (!parsed) {
            require(parsed.error().code == moat::errc::protocol_error);
            continue;
        }
        const auto again = connect::parse_end_stream(connect::encode_end_stream(*parsed));
        require(again.has_value());
        require(again->error.has_value() == parsed->error.has_value());
        require(again->metadata.size() == parsed->metadata.size());
    }

    // Any body is an error of some code, and its moat error is one line.
    const auto unary = connect::parse_unary_error(static_cast<int>(size % 600), bytes);
    const auto err = connect::to_error(unary);
    require(err.detail.find('\n') == std::string::npos);
    require(connect::parse_unary_error(500, connect::encode_unary_error(unary)).code == unary.code);
    (void)connect::parse_end_stream(bytes);
    return 0;
}
