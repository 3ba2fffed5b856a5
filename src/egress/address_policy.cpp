#include "egress/address_policy.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace moat::egress {
namespace {

bool in_v4(std::uint32_t address, std::uint32_t network, unsigned prefix) {
    const std::uint32_t mask = prefix == 0 ? 0 : ~std::uint32_t{0} << (32 - prefix);
    return (address & mask) == (network & mask);
}

address_class classify_v4(const asio::ip::address_v4& a) {
    const std::uint32_t v = a.to_uint();
    // 169.254.169.254 (most clouds), 100.100.100.200 (Alibaba), 169.254.0.23 (Tencent),
    // 192.0.0.192 (Oracle's legacy metadata).
    if (v == 0xA9FEA9FEu || v == 0x646464C8u || v == 0xA9FE0017u || v == 0xC00000C0u) {
        return address_class::metadata;
    }
    // 168.63.129.16 (Azure WireServer), 169.254.170.2 (ECS task credentials), 169.254.170.23
    // (EKS Pod Identity), 169.254.169.253 (Route 53 Resolver), 169.254.169.123 (Time Sync).
    if (v == 0xA83F8110u || v == 0xA9FEAA02u || v == 0xA9FEAA17u || v == 0xA9FEA9FDu ||
        v == 0xA9FEA97Bu) {
        return address_class::cloud_host;
    }
    if (in_v4(v, 0x00000000u, 8)) return address_class::unspecified;
    if (in_v4(v, 0x7F000000u, 8)) return address_class::loopback;
    if (in_v4(v, 0x0A000000u, 8) || in_v4(v, 0xAC100000u, 12) || in_v4(v, 0xC0A80000u, 16)) {
        return address_class::private_use;
    }
    if (in_v4(v, 0xA9FE0000u, 16)) return address_class::link_local;
    if (in_v4(v, 0x64400000u, 10)) return address_class::cgnat;
    if (v == 0xFFFFFFFFu) return address_class::broadcast;
    if (in_v4(v, 0xE0000000u, 4)) return address_class::multicast;
    if (in_v4(v, 0xF0000000u, 4) || in_v4(v, 0xC0000000u, 24) || in_v4(v, 0xC6120000u, 15) ||
        in_v4(v, 0xC0000200u, 24) || in_v4(v, 0xC6336400u, 24) || in_v4(v, 0xCB007100u, 24)) {
        return address_class::reserved;
    }
    return address_class::public_unicast;
}

bool v6_prefix(const asio::ip::address_v6::bytes_type& b, std::initializer_list<unsigned> head,
               unsigned bits) {
    unsigned i = 0;
    for (unsigned byte : head) {
        const unsigned take = bits >= 8 ? 8 : bits;
        if (take == 0) break;
        const unsigned mask = (0xFFu << (8 - take)) & 0xFFu;
        if ((b[i] & mask) != (byte & mask)) return false;
        bits -= take;
        ++i;
    }
    return true;
}

bool is_hex(std::string_view s) {
    for (char c : s) {
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    }
    return true;
}

bool is_decimal(std::string_view s) {
    for (char c : s) {
        if (c < '0' || c > '9') return false;
    }
    return true;
}

// One inet_aton part: 0x hex, 0-prefixed octal or decimal; nullopt past 2^32 or on a bad digit.
std::optional<std::uint64_t> parse_part(std::string_view part) {
    unsigned base = 10;
    if (part.size() >= 2 && part[0] == '0' && (part[1] == 'x' || part[1] == 'X')) {
        base = 16;
        part.remove_prefix(2);  // "0x" alone is 0, as inet_aton reads it
    } else if (part.size() >= 2 && part[0] == '0') {
        base = 8;
        part.remove_prefix(1);
    } else if (part.empty()) {
        return std::nullopt;
    }
    std::uint64_t value = 0;
    for (char c : part) {
        unsigned digit = 0;
        if (c >= '0' && c <= '9') {
            digit = static_cast<unsigned>(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            digit = static_cast<unsigned>(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            digit = static_cast<unsigned>(c - 'A' + 10);
        } else {
            return std::nullopt;
        }
        if (digit >= base) return std::nullopt;
        value = value * base + digit;
        if (value > 0xFFFFFFFFu) return std::nullopt;
    }
    return value;
}

}  // namespace

const char* describe(address_class c) noexcept {
    switch (c) {
        case address_class::public_unicast:
            return "a public address";
        case address_class::loopback:
            return "a loopback address";
        case address_class::private_use:
            return "a private address";
        case address_class::link_local:
            return "a link-local address";
        case address_class::cgnat:
            return "a carrier-grade NAT (100.64.0.0/10) address";
        case address_class::unspecified:
            return "an unspecified address";
        case address_class::multicast:
            return "a multicast address";
        case address_class::broadcast:
            return "a broadcast address";
        case address_class::reserved:
            return "a reserved address";
        case address_class::metadata:
            return "a cloud metadata address";
        case address_class::cloud_host:
            return "a cloud host endpoint";
    }
    return "an address";
}

std::optional<asio::ip::address_v4> embedded_ipv4(const asio::ip::address_v6& address) {
    const auto b = address.to_bytes();
    auto tail = [&](unsigned from) {
        return asio::ip::address_v4(
            asio::ip::address_v4::bytes_type{b[from], b[from + 1], b[from + 2], b[from + 3]});
    };
    bool zero_head = true;
    for (unsigned i = 0; i < 10; ++i) zero_head = zero_head && b[i] == 0;
    if (zero_head && b[10] == 0xFF && b[11] == 0xFF) return tail(12);  // ::ffff:a.b.c.d
    if (zero_head && b[10] == 0 && b[11] == 0) {                       // ::a.b.c.d
        const auto v4 = tail(12);
        if (v4.to_uint() > 1) return v4;  // :: and ::1 are IPv6's own
        return std::nullopt;
    }
    // NAT64 well-known prefix 64:ff9b::/96 and the local-use 64:ff9b:1::/48.
    if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xFF && b[3] == 0x9B) return tail(12);
    if (b[0] == 0x20 && b[1] == 0x02) return tail(2);  // 6to4 2002:a.b.c.d::/48
    return std::nullopt;
}

address_class classify_address(const asio::ip::address& address) {
    if (address.is_v4()) return classify_v4(address.to_v4());
    const auto v6 = address.to_v6();
    if (auto v4 = embedded_ipv4(v6)) return classify_v4(*v4);
    const auto b = v6.to_bytes();
    // AWS's IPv6 endpoints share fd00:ec2::/64: ::254 metadata, ::23 EKS Pod Identity, ::253
    // the Route 53 Resolver, ::123 Time Sync.
    static const asio::ip::address_v6 ec2_base = asio::ip::make_address_v6("fd00:ec2::");
    const auto base = ec2_base.to_bytes();
    if (std::equal(b.begin(), b.begin() + 14, base.begin())) {
        const unsigned last = static_cast<unsigned>(b[14]) << 8 | b[15];
        if (last == 0x254) return address_class::metadata;
        if (last == 0x23 || last == 0x253 || last == 0x123) return address_class::cloud_host;
    }
    if (v6.is_unspecified()) return address_class::unspecified;
    if (v6.is_loopback()) return address_class::loopback;
    if (v6_prefix(b, {0xFC}, 7) || v6_prefix(b, {0xFE, 0xC0}, 10)) {
        return address_class::private_use;
    }
    if (v6_prefix(b, {0xFE, 0x80}, 10)) return address_class::link_local;
    if (v6_prefix(b, {0xFF}, 8)) return address_class::multicast;
    // discard-only 100::/64, documentation 2001:db8::/32, and everything outside 2000::/3.
    if (v6_prefix(b, {0x01, 0x00, 0, 0, 0, 0, 0, 0}, 64) ||
        v6_prefix(b, {0x20, 0x01, 0x0D, 0xB8}, 32) || !v6_prefix(b, {0x20}, 3)) {
        return address_class::reserved;
    }
    return address_class::public_unicast;
}

bool address_range::contains(const asio::ip::address& address) const {
    asio::ip::address a = address;
    if (network.is_v4() && a.is_v6()) {
        auto v4 = embedded_ipv4(a.to_v6());
        if (!v4) return false;
        a = *v4;
    }
    if (network.is_v4() != a.is_v4()) return false;
    if (a.is_v4()) return in_v4(a.to_v4().to_uint(), network.to_v4().to_uint(), prefix_length);
    const auto want = network.to_v6().to_bytes();
    const auto have = a.to_v6().to_bytes();
    unsigned bits = prefix_length;
    for (unsigned i = 0; i < 16 && bits > 0; ++i) {
        const unsigned take = bits >= 8 ? 8 : bits;
        const unsigned mask = (0xFFu << (8 - take)) & 0xFFu;
        if ((want[i] & mask) != (have[i] & mask)) return false;
        bits -= take;
    }
    return true;
}

std::optional<address_range> parse_address_range(std::string_view text, std::string& why) {
    const auto slash = text.find('/');
    const std::string address_text(text.substr(0, slash));
    std::error_code ec;
    const auto network = asio::ip::make_address(address_text, ec);
    // Strict notation only (no inet_aton forms, no zone): an operator's range is read one way.
    if (ec || address_text.find('%') != std::string::npos ||
        (network.is_v4() && network.to_string() != address_text)) {
        why = "is not an IP address or CIDR range";
        return std::nullopt;
    }
    const unsigned width = network.is_v4() ? 32 : 128;
    unsigned prefix = width;
    if (slash != std::string_view::npos) {
        const auto digits = text.substr(slash + 1);
        if (digits.empty() || digits.size() > 3 || !is_decimal(digits)) {
            why = "has a bad prefix length";
            return std::nullopt;
        }
        prefix = 0;
        for (char c : digits) prefix = prefix * 10 + static_cast<unsigned>(c - '0');
        if (prefix > width) {
            why = "has a prefix length past " + std::to_string(width);
            return std::nullopt;
        }
    }
    address_range range{network, prefix};
    // Host bits set beyond the prefix are usually a typo (10.1.2.3/8 meant 10.0.0.0/8?).
    if (network.is_v4()) {
        const std::uint32_t mask = prefix == 0 ? 0 : ~std::uint32_t{0} << (32 - prefix);
        if ((network.to_v4().to_uint() & ~mask) != 0) {
            why = "has bits set beyond its /" + std::to_string(prefix) + " prefix";
            return std::nullopt;
        }
    } else {
        const auto b = network.to_v6().to_bytes();
        for (unsigned bit = prefix; bit < 128; ++bit) {
            if (b[bit / 8] & (0x80u >> (bit % 8))) {
                why = "has bits set beyond its /" + std::to_string(prefix) + " prefix";
                return std::nullopt;
            }
        }
    }
    return range;
}

std::optional<address_class> refusal_for(const asio::ip::address& address,
                                         const std::vector<address_range>& allowed) {
    const auto c = classify_address(address);
    if (c == address_class::public_unicast) return std::nullopt;
    if (c == address_class::metadata) return c;
    for (const auto& range : allowed) {
        const unsigned whole = range.network.is_v4() ? 32 : 128;
        if (c == address_class::cloud_host && range.prefix_length != whole) continue;
        if (range.contains(address)) return std::nullopt;
    }
    return c;
}

bool refuses_whole_range(const address_range& range, const std::vector<address_range>& allowed) {
    // The blocks classify_address() puts outside public unicast, one class each.
    static const std::vector<address_range> refused_blocks = [] {
        std::vector<address_range> blocks;
        for (const char* text :
             {"0.0.0.0/8",       "127.0.0.0/8",    "10.0.0.0/8",    "172.16.0.0/12",
              "192.168.0.0/16",  "169.254.0.0/16", "100.64.0.0/10", "224.0.0.0/4",
              "240.0.0.0/4",     "192.0.0.0/24",   "198.18.0.0/15", "192.0.2.0/24",
              "198.51.100.0/24", "203.0.113.0/24", "::/128",        "::1/128",
              "fc00::/7",        "fec0::/10",      "fe80::/10",     "ff00::/8",
              "100::/64",        "2001:db8::/32"}) {
            std::string why;
            if (auto block = parse_address_range(text, why)) blocks.push_back(*block);
        }
        return blocks;
    }();
    const auto inside = [](const address_range& inner, const address_range& outer) {
        return inner.network.is_v4() == outer.network.is_v4() &&
               inner.prefix_length >= outer.prefix_length && outer.contains(inner.network);
    };
    const bool in_a_block = std::any_of(refused_blocks.begin(), refused_blocks.end(),
                                        [&](const auto& block) { return inside(range, block); });
    if (!in_a_block) return false;
    // Two ranges overlap exactly when one holds the other's first address.
    return std::none_of(allowed.begin(), allowed.end(), [&](const address_range& open) {
        return range.contains(open.network) || open.contains(range.network);
    });
}

bool is_address_entry(std::string_view entry) {
    if (entry.find('/') != std::string_view::npos) return true;
    std::error_code ec;
    (void)asio::ip::make_address(entry, ec);
    return !ec;
}

bool looks_numeric(std::string_view host) {
    if (!host.empty() && host.back() == '.') host.remove_suffix(1);
    const auto dot = host.rfind('.');
    const auto last = dot == std::string_view::npos ? host : host.substr(dot + 1);
    if (last.empty()) return false;
    if (is_decimal(last)) return true;
    return last.size() >= 2 && last[0] == '0' && (last[1] == 'x' || last[1] == 'X') &&
           is_hex(last.substr(2));
}

std::optional<asio::ip::address_v4> parse_numeric_ipv4(std::string_view host) {
    if (!host.empty() && host.back() == '.') host.remove_suffix(1);
    std::array<std::uint64_t, 4> parts{};
    std::size_t count = 0;
    while (true) {
        const auto dot = host.find('.');
        const auto text = host.substr(0, dot);
        if (count == 4) return std::nullopt;
        auto value = parse_part(text);
        if (!value) return std::nullopt;
        parts[count++] = *value;
        if (dot == std::string_view::npos) break;
        host.remove_prefix(dot + 1);
    }
    // Every part but the last is one byte; the last fills the bytes that remain.
    for (std::size_t i = 0; i + 1 < count; ++i) {
        if (parts[i] > 0xFF) return std::nullopt;
    }
    const unsigned rest_bits = static_cast<unsigned>(8 * (5 - count));
    if (rest_bits < 32 && parts[count - 1] >> rest_bits) return std::nullopt;
    std::uint32_t value = 0;
    for (std::size_t i = 0; i + 1 < count; ++i) {
        value |= static_cast<std::uint32_t>(parts[i]) << (24 - 8 * i);
    }
    value |= static_cast<std::uint32_t>(parts[count - 1]);
    return asio::ip::address_v4(value);
}

}  // namespace moat::egress
