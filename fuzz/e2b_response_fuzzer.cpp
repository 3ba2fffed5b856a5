// libFuzzer target for the parsers of what an E2B control plane sends, which the e2b backend runs
// (src/e2b_protocol/sandbox_replies.hpp, error_body.hpp): Sandbox, SandboxDetail,
// ListedSandbox[], Error bodies and RFC 3339 times; what parses is written back (moat serve's
// writers) and must parse to the same. And the label filter's encoding, which must round-trip
// through its decoding (the same three decodes as E2B's server). The first byte picks the parser;
// the rest is its input.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_e2b_response_fuzzer &&
//   build/fuzz/fuzz/moat_e2b_response_fuzzer -max_total_time=60 fuzz/corpus/e2b_response
#include "e2b_protocol/error_body.hpp"
#include "e2b_protocol/sandbox_replies.hpp"
#include "e2b_protocol/sandbox_requests.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace protocol = moat::e2b_protocol;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

void check_error(const moat::error& e) {
    require(e.code == moat::errc::protocol_error && !e.detail.empty() && e.detail.size() < 300);
}

void check_detail(const protocol::sandbox_detail& d) {
    require(protocol::is_valid_sandbox_id(d.sandbox_id));
    require(d.metadata.size() <= protocol::max_metadata_entries);
    require(d.allow_out.size() <= protocol::max_network_entries);
    require(d.deny_out.size() <= protocol::max_network_entries);
    auto again = protocol::parse_sandbox_detail(protocol::encode_sandbox_detail(d));
    require(again.has_value());
    require(again->sandbox_id == d.sandbox_id && again->metadata == d.metadata);
    require(again->allow_out == d.allow_out && again->deny_out == d.deny_out);
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
    const std::string query = "metadata=" + protocol::encode_metadata_filter(filter);
    auto parsed = protocol::parse_query(query);
    require(parsed.has_value());
    auto pairs = protocol::parse_metadata_filter(parsed->at("metadata"));
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
            auto r = protocol::parse_sandbox_reply(input);
            if (!r) {
                check_error(r.error());
            } else {
                require(protocol::is_valid_sandbox_id(r->sandbox_id));
                auto again = protocol::parse_sandbox_reply(protocol::encode_sandbox_reply(*r));
                require(again.has_value() && again->envd_access_token == r->envd_access_token);
            }
            break;
        }
        case 1: {
            auto r = protocol::parse_sandbox_detail(input);
            if (!r) {
                check_error(r.error());
            } else {
                check_detail(*r);
            }
            break;
        }
        case 2: {
            auto r = protocol::parse_sandbox_list(input);
            if (!r) {
                check_error(r.error());
            } else {
                require(r->size() <= protocol::max_listed_sandboxes);
                for (const auto& d : *r) check_detail(d);
            }
            break;
        }
        case 3: {
            auto m = protocol::parse_error_message(input);
            if (m) require(m->size() <= 203 && m->find('\n') == std::string::npos);
            break;
        }
        case 4:
            (void)protocol::parse_rfc3339(input);
            break;
        default:
            check_filter(input);
            break;
    }
    return 0;
}
