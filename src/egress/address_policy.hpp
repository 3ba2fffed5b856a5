// Which addresses the egress proxy may connect to (pure; no I/O).
//
// The proxy resolves every name itself and checks each address it would use against
// classify_address() before connecting to exactly that address. Anything that is not public
// unicast is refused unless an operator's --allow-address range covers it; the cloud metadata
// addresses are refused even then. IPv6 forms that embed an IPv4 address (IPv4-mapped
// ::ffff:a.b.c.d, IPv4-compatible ::a.b.c.d, NAT64 64:ff9b::/96, 6to4 2002::/16) are judged by the
// IPv4 address they embed, so ::ffff:127.0.0.1 is loopback.
//
// Numeric hosts: parse_numeric_ipv4() reads a host the way inet_aton(3) does (1 to 4 parts, each
// decimal, 0x hex or 0-prefixed octal, the last part filling the remaining bytes), so 0x7f.1,
// 2130706433, 017700000001 and 127.1 are all 127.0.0.1. looks_numeric() says whether a host must
// be read as an address (its last label is a number, the WHATWG URL rule): such a host is checked
// as an address and never handed to a resolver.
#pragma once

#include <asio/ip/address.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat::egress {

enum class address_class {
    public_unicast,
    loopback,     // 127.0.0.0/8, ::1
    private_use,  // 10/8, 172.16/12, 192.168/16, fc00::/7, fec0::/10 (site-local)
    link_local,   // 169.254/16, fe80::/10
    cgnat,        // 100.64.0.0/10
    unspecified,  // 0.0.0.0/8, ::
    multicast,    // 224/4, ff00::/8
    broadcast,    // 255.255.255.255
    reserved,     // 240/4, 192.0.0.0/24, 198.18/15, documentation ranges, discard 100::/64
    // Instance metadata services: 169.254.169.254 (AWS, GCP, Azure, OpenStack, DigitalOcean,
    // ...), fd00:ec2::254, 100.100.100.200 (Alibaba), 169.254.0.23 (Tencent), 192.0.0.192
    // (Oracle's legacy one). Never allowed.
    metadata,
    // The clouds' other host endpoints a guest can reach: Azure's WireServer 168.63.129.16 (a
    // public address: refused even under `network all`), AWS's ECS task credentials 169.254.170.2,
    // the EKS Pod Identity agent 169.254.170.23 and fd00:ec2::23, the Route 53 Resolver
    // 169.254.169.253 and fd00:ec2::253, Time Sync 169.254.169.123 and fd00:ec2::123. Allowed only
    // when an --allow-address names that exact address (a /32 or /128), never by a wider range.
    cloud_host,
};

// "a loopback address", "a private address", ...: for refusal lines.
const char* describe(address_class c) noexcept;

// The class of `address`, judging embedded IPv4 forms by the IPv4 address they carry.
address_class classify_address(const asio::ip::address& address);

// The IPv4 address an IPv6 address embeds (mapped, compatible, NAT64, 6to4), if any.
std::optional<asio::ip::address_v4> embedded_ipv4(const asio::ip::address_v6& address);

// An IP range: an address and a prefix length, host bits zero.
struct address_range {
    asio::ip::address network;
    unsigned prefix_length = 0;
    bool contains(const asio::ip::address& address) const;
};

// "10.1.0.0/16", "fd00::/8", "192.0.2.7" (a single address). nullopt with `why` set when the
// text is not a range: a bad address, a prefix past 32/128, host bits set beyond the prefix.
std::optional<address_range> parse_address_range(std::string_view text, std::string& why);

// True when refusal_for() refuses every address of `range` given the operator's `allowed`
// ranges: the range lies inside one block of a class that is not public unicast (10.0.0.0/8,
// 127.0.0.0/8, fc00::/7, ...) and overlaps none of `allowed`. Conservative: a range spanning two
// such blocks, or one written as IPv4 embedded in IPv6, is not recognised (false).
bool refuses_whole_range(const address_range& range, const std::vector<address_range>& allowed);

// True when an E2B allowOut / denyOut entry names addresses (a CIDR such as "10.0.0.0/8", or
// an IP literal) rather than a host name.
bool is_address_entry(std::string_view entry);

// The verdict on one address: nullopt when the proxy may connect to it, else its class.
// `allowed` are the operator's --allow-address ranges; they never unlock metadata, and unlock a
// cloud host endpoint only when one of them is exactly that address.
std::optional<address_class> refusal_for(const asio::ip::address& address,
                                         const std::vector<address_range>& allowed);

// True when `host` (no brackets, no port) must be read as an IPv4 address: its last dot-separated
// label (after one trailing dot) is all decimal digits or 0x followed by hex digits.
bool looks_numeric(std::string_view host);

// inet_aton(3)'s reading of `host`; nullopt when it is not an IPv4 address in any notation.
std::optional<asio::ip::address_v4> parse_numeric_ipv4(std::string_view host);

}  // namespace moat::egress
