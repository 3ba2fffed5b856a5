// libFuzzer target for the multipart/form-data parser (envd's POST /files): any body, split
// anyhow, gives the same parts and the same outcome, and the parser never holds more than its
// caps between feeds. The Content-Type boundary parser runs on the input's first line.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_multipart_fuzzer &&
//   build/fuzz/fuzz/moat_multipart_fuzzer -max_total_time=60 fuzz/corpus/multipart
#include "serve/multipart.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace serve = moat::serve;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

constexpr std::string_view boundary = "fuzzboundary";

struct outcome {
    std::vector<serve::multipart_part_head> heads;
    std::vector<std::string> data;  // per part
    bool failed = false;
    bool finished = false;
};

outcome parse(std::string_view bytes, std::size_t step, const serve::multipart_limits& limits) {
    outcome out;
    serve::multipart_parser parser{std::string(boundary), limits};
    bool open = false;
    bool ended = false;
    for (std::size_t i = 0; i < bytes.size() || i == 0; i += step) {
        std::vector<serve::multipart_event> events;
        const bool ok = parser.feed(bytes.substr(i, step), events).has_value();
        for (auto& e : events) {
            require(!ended);
            switch (e.type) {
                case serve::multipart_event::kind::part_begin:
                    require(!open);
                    require(e.head.headers.size() * 2 <= limits.max_header_bytes);
                    open = true;
                    out.heads.push_back(std::move(e.head));
                    out.data.emplace_back();
                    break;
                case serve::multipart_event::kind::data:
                    require(open && !e.data.empty());
                    out.data.back() += e.data;
                    break;
                case serve::multipart_event::kind::part_end:
                    require(open);
                    open = false;
                    break;
                case serve::multipart_event::kind::finished:
                    require(!open);
                    ended = true;
                    break;
            }
        }
        require(out.heads.size() <= limits.max_parts);
        if (!ok) {
            out.failed = true;
            return out;
        }
        // Between feeds: at most a delimiter's prefix, or an unfinished header block.
        require(parser.buffered() <= limits.max_header_bytes + boundary.size() + 8);
        if (bytes.empty()) break;
    }
    out.finished = parser.finish().has_value();
    require(out.finished == ended);
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    serve::multipart_limits limits;
    limits.max_header_bytes = 256;
    limits.max_parts = 8;

    const auto whole = parse(bytes, bytes.size() + 1, limits);
    const auto bytewise = parse(bytes, 1, limits);
    const auto odd = parse(bytes, 7, limits);
    for (const auto* other : {&bytewise, &odd}) {
        require(whole.failed == other->failed);
        require(whole.finished == other->finished);
        require(whole.heads.size() == other->heads.size());
        for (std::size_t i = 0; i < whole.heads.size(); ++i) {
            require(whole.heads[i].name == other->heads[i].name);
            require(whole.heads[i].filename == other->heads[i].filename);
            require(whole.heads[i].headers == other->heads[i].headers);
        }
        // A failed parse may have handed out less data before its fault, never other data.
        for (std::size_t i = 0; i < whole.data.size(); ++i) {
            if (whole.failed) continue;
            require(whole.data[i] == other->data[i]);
        }
    }

    const auto line = bytes.substr(0, bytes.find('\n'));
    if (const auto b = serve::multipart_boundary(line)) {
        require(!b->empty() && b->size() <= 70);
    } else {
        require(b.error().code == moat::errc::invalid_argument);
    }
    return 0;
}
