// libFuzzer target for the Redis store URL parser (src/store/redis_url.cpp) and the RESP reply
// reader (src/store/redis_reply.cpp), both fed what an operator or a Redis peer may send.
//
// URL: any input parses or fails with invalid_argument; an accepted tcp/tls URL's to_string()
// (which drops the user part) parses back to the same endpoint and never contains '@'.
// Replies: the input after its first byte, split at a point the first byte picks, gives the same
// replies (or the same failure) as fed whole, within small caps, and never more than the caps.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_redis_url_fuzzer &&
//   build/fuzz/fuzz/moat_redis_url_fuzzer -max_total_time=60 fuzz/corpus/redis_url
#include <moat/redis_session_store.hpp>

#include "store/redis_reply.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

void check_url(std::string_view input) {
    auto parsed = moat::parse_redis_url(input);
    if (!parsed) {
        require(parsed.error().code == moat::errc::invalid_argument);
        require(parsed.error().detail.starts_with("store URL: "));
        require(parsed.error().detail.size() < 200);
        return;
    }
    const auto& config = *parsed;
    if (config.kind == moat::redis_config::transport::unix_socket) {
        require(!config.socket_path.empty() && config.socket_path.front() == '/');
        return;
    }
    const auto printed = config.to_string();
    require(printed.find('@') == std::string::npos);
    auto again = moat::parse_redis_url(printed);
    require(again.has_value());
    require(again->kind == config.kind && again->host == config.host &&
            again->port == config.port && again->database == config.database);
}

struct replies {
    std::vector<std::string> shapes;
    bool failed = false;
};

void describe(const moat::store::redis_reply& r, std::string& out) {
    out += std::to_string(static_cast<int>(r.type)) + ":" + r.text + ":" +
           std::to_string(r.integer) + "[";
    for (const auto& e : r.elements) describe(e, out);
    out += "]";
}

replies read_all(std::string_view bytes, std::size_t split) {
    moat::store::reply_limits limits;
    limits.max_bytes = 512;
    limits.max_elements = 16;
    limits.max_depth = 3;
    moat::store::reply_reader reader(limits);
    replies out;
    for (const auto part : {bytes.substr(0, split), bytes.substr(split)}) {
        if (!reader.feed(part)) {
            out.failed = true;
            return out;
        }
        for (;;) {
            auto next = reader.next();
            if (!next) {
                out.failed = true;
                return out;
            }
            if (!*next) break;
            std::string shape;
            describe(**next, shape);
            // Nothing past the caps is ever handed out.
            require((*next)->text.size() <= limits.max_bytes);
            require((*next)->elements.size() <= limits.max_elements);
            out.shapes.push_back(std::move(shape));
        }
    }
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    check_url(input);
    if (size < 1) return 0;
    const auto bytes = input.substr(1);
    const auto split = bytes.empty() ? 0 : static_cast<std::size_t>(data[0]) % (bytes.size() + 1);
    const auto whole = read_all(bytes, bytes.size());
    const auto halves = read_all(bytes, split);
    // Fed in two parts, the reader gives what it gave for the whole, up to the failure (a part
    // may fail the buffer cap earlier than the whole would, never later).
    if (!whole.failed && !halves.failed) require(whole.shapes == halves.shapes);
    return 0;
}
