// libFuzzer target for the e2b backend's parsers of what an E2B control plane sends
// (src/e2b/e2b_responses.hpp): Sandbox, SandboxDetail, ListedSandbox[], Error bodies and RFC 3339
// times; and the label filter's encoding, which must round-trip through moat serve's decoding
// (src/serve/e2b_requests.hpp, the same three decodes as E2B's server). The first byte picks the
// parser; the rest is its input.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_e2b_response_fuzzer &&
//   build/fuzz/fuzz/moat_e2b_response_fuzzer -max_total_time=60 fuzz/corpus/e2b_response
#include "e2b/e2b_responses.hpp"
#include "serve/e2b_requests.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace e2b = moat::e2b;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

void check_error(const moat::error& e) {
    require(e.code == moat::errc::protocol_error && !e.detail.empty() && e.detail.size() < 300);
}

void check_detail(const e2b::sandbox_detail& d) {
    require(e2b::is_valid_sandbox_id(d.sandbox_id));
    require(d.metadata.size() <= e2b::max_metadata_entries);
    require(d.allow_out.size() <= e2b::max_network_entries);
    require(d.deny_out.size() <= e2b::max_network_entries);
}

// Splits the input at NUL bytes into key, value, key, value...
std::map<std::string, std::string> filter_from(std::string_view input) {
    std::map<std::string, std::string> out;
    std::string key;
    bool have_key = false;
    std::size_t at = 0;
    while (at <= input.size() && out.size() < 8) {
        const auto end = std::min(input.find('\0', at), input.size());
        const std::string part(input.substr(at, end - at));
        if (have_key) {
            if (!key.empty()) out[key] = part;
        } else {
            key = part;
        }
        have_key = !have_key;
        at = end + 1;
    }
    return out;
}

void check_filter(std::string_view input) {
    const auto filter = filter_from(input);
    if (filter.empty()) return;
    const std::string query = "metadata=" + e2b::encode_metadata_filter(filter);
    auto parsed = moat::serve::parse_query(query);
    require(parsed.has_value());
    auto pairs = moat::serve::parse_metadata_filter(parsed->at("metadata"));
    require(pairs.has_value());
    std::map<std::string, std::string> back(pairs->begin(), pairs->end());
    require(back == filter);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
    switch (data[0] % 6) {
        case 0: {
            auto r = e2b::parse_sandbox_reply(input);
            if (!r) {
                check_error(r.error());
            } else {
                require(e2b::is_valid_sandbox_id(r->sandbox_id));
            }
            break;
        }
        case 1: {
            auto r = e2b::parse_sandbox_detail(input);
            if (!r) {
                check_error(r.error());
            } else {
                check_detail(*r);
            }
            break;
        }
        case 2: {
            auto r = e2b::parse_sandbox_list(input);
            if (!r) {
                check_error(r.error());
            } else {
                require(r->size() <= e2b::max_listed_sandboxes);
                for (const auto& d : *r) check_detail(d);
            }
            break;
        }
        case 3: {
            auto m = e2b::parse_error_message(input);
            if (m) require(m->size() <= 203 && m->find('\n') == std::string::npos);
            break;
        }
        case 4:
            (void)e2b::parse_timestamp(input);
            break;
        default:
            check_filter(input);
            break;
    }
    return 0;
}
