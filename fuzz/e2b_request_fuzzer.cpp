// libFuzzer target for moat serve's E2B request parsers (src/serve/e2b_requests.hpp): the
// create, timeout, connect and refresh bodies, the list query and its metadata filter, RFC 3339
// times and base64url page tokens. The first byte picks the parser; the rest is its input.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_e2b_request_fuzzer &&
//   build/fuzz/fuzz/moat_e2b_request_fuzzer -max_total_time=60 fuzz/corpus/e2b_request
#include "serve/e2b_requests.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace serve = moat::serve;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

void check_create(std::string_view body) {
    auto r = serve::parse_create_request(body);
    if (!r) {
        require(r.error().code == moat::errc::invalid_argument && !r.error().detail.empty());
        return;
    }
    require(body.size() <= serve::max_e2b_body_bytes);
    require(r->metadata.size() <= serve::max_e2b_map_entries);
    require(r->env_vars.size() <= serve::max_e2b_map_entries);
    if (r->timeout_s)
        require(*r->timeout_s >= 0 && *r->timeout_s <= serve::max_e2b_timeout_seconds);
    if (r->network) {
        for (const auto* list : {&r->network->allow_out, &r->network->deny_out}) {
            require(list->size() <= serve::max_e2b_network_entries);
            for (const auto& entry : *list) {
                require(entry.size() <= serve::max_e2b_network_entry_bytes);
            }
        }
    }
}

void check_query(std::string_view query) {
    auto q = serve::parse_query(query);
    if (!q) return;
    const auto it = q->find("metadata");
    if (it == q->end()) return;
    auto pairs = serve::parse_metadata_filter(it->second);
    if (pairs) require(pairs->size() <= serve::max_e2b_map_entries);
}

void check_time(std::string_view text) {
    auto t = serve::parse_rfc3339(text);
    if (!t) return;
    // What moat prints it parses back (to the millisecond it prints).
    const std::string printed = serve::format_rfc3339(*t);
    auto again = serve::parse_rfc3339(printed);
    require(again.has_value());
    require(serve::format_rfc3339(*again) == printed);
}

void check_base64(std::string_view bytes) {
    const std::string encoded = serve::base64url_encode(bytes);
    require(serve::base64url_decode(encoded) == std::string(bytes));
    (void)serve::base64url_decode(bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
    switch (data[0] % 7) {
        case 0:
            check_create(input);
            break;
        case 1:
            (void)serve::parse_timeout_request(input);
            break;
        case 2:
            (void)serve::parse_connect_request(input);
            break;
        case 3:
            (void)serve::parse_refresh_request(input);
            break;
        case 4:
            check_query(input);
            break;
        case 5:
            check_time(input);
            break;
        default:
            check_base64(input);
            break;
    }
    return 0;
}
