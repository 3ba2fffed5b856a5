// libFuzzer target for what a sandbox sends the egress proxy: the request head
// (src/egress/proxy_request.cpp), the host it names (numeric forms, names, IPv6 literals) and its
// classification (src/egress/address_policy.cpp), plus the policy's own parsers on the same bytes.
// The first byte picks small or default caps.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_egress_request_fuzzer &&
//   build/fuzz/fuzz/moat_egress_request_fuzzer -max_total_time=60 fuzz/corpus/egress_request
#include "egress/address_policy.hpp"
#include "egress/network_policy.hpp"
#include "egress/proxy_request.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

void check(bool condition) {
    if (!condition) std::abort();
}

void exercise_host(std::string_view host) {
    using namespace moat::egress;
    if (looks_numeric(host)) {
        if (auto v4 = parse_numeric_ipv4(host)) {
            (void)classify_address(asio::ip::address(*v4));
        }
    } else if (auto name = normalise_host_name(host, true)) {
        check(!name->empty() && name->size() <= 253);
    }
    std::error_code ec;
    auto address = asio::ip::make_address(std::string(host), ec);
    if (!ec) {
        const std::vector<address_range> none;
        const auto refused = refusal_for(address, none);
        check(refused.has_value() == (classify_address(address) != address_class::public_unicast));
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace moat::egress;
    if (size == 0) return 0;
    request_caps caps;
    if (data[0] & 1) {
        caps.max_request_line_bytes = 64;
        caps.max_head_bytes = 256;
        caps.max_headers = 4;
        caps.max_connect_target_bytes = 40;
    }
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    const auto out = parse_proxy_request(text, caps);
    switch (out.state) {
        case parse_outcome::state::incomplete:
            check(text.size() <= caps.max_head_bytes + caps.max_request_line_bytes);
            break;
        case parse_outcome::state::refused:
            check(out.status == 400 || out.status == 414 || out.status == 431);
            check(!out.reason.empty() && out.reason.find('\n') == std::string::npos);
            break;
        case parse_outcome::state::complete: {
            const auto& r = out.request;
            check(r.head_bytes <= text.size() && r.head_bytes <= caps.max_head_bytes);
            check(r.port != 0 && !r.host.empty());
            if (r.is_connect) {
                check(r.upstream_head.empty());
            } else {
                check(r.upstream_head.ends_with("\r\nConnection: close\r\n\r\n"));
                check(r.upstream_head.find("\r\n\r\n") + 4 == r.upstream_head.size());
            }
            exercise_host(r.host);
            break;
        }
    }
    // The policy's parsers on the same bytes.
    std::string why;
    if (auto pattern = parse_host_pattern(text, why)) {
        check(!pattern->name.empty());
        (void)pattern->matches(pattern->name, 443);
    } else {
        check(!why.empty());
    }
    if (auto range = parse_address_range(text, why)) check(range->contains(range->network));
    exercise_host(text);
    return 0;
}
