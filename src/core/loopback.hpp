// Whether a host names this machine's loopback: the one rule the HTTP client (plain http:// only
// to loopback) and moat serve's envd listener (which Host names a loopback listener answers) use.
//
// Loopback is an IP literal in 127.0.0.0/8 or ::1, or the name "localhost" (ASCII case ignored,
// as DNS does). Nothing else: no other name (not "*.localhost", which glibc does not resolve to
// loopback), no IPv4-mapped ::ffff:127.0.0.1, no shortened IPv4 ("127.1"). A name that passes
// is still only dialled at the loopback addresses it resolves to (http::client_connection).
#pragma once

#include "core/ascii.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <string_view>

namespace moat::detail {

// `host` is a name or an IP literal, without brackets or port.
inline bool is_loopback_host(std::string_view host) noexcept {
    if (iequals(host, "localhost")) return true;
    char literal[INET6_ADDRSTRLEN + 1] = {};
    if (host.empty() || host.size() >= sizeof literal) return false;
    std::memcpy(literal, host.data(), host.size());
    in_addr v4{};
    if (::inet_pton(AF_INET, literal, &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    in6_addr v6{};
    if (::inet_pton(AF_INET6, literal, &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
    return false;
}

// The same for an authority as a Host header carries it: "host", "host:port", "[v6]" or
// "[v6]:port". A malformed one (an unclosed bracket) is not loopback.
inline bool is_loopback_authority(std::string_view authority) noexcept {
    auto host = authority;
    if (host.starts_with('[')) {
        const auto close = host.find(']');
        if (close == std::string_view::npos) return false;
        host = host.substr(1, close - 1);
    } else if (const auto colon = host.find(':');
               colon != std::string_view::npos &&
               host.find(':', colon + 1) == std::string_view::npos) {
        host = host.substr(0, colon);
    }
    return is_loopback_host(host);
}

}  // namespace moat::detail
