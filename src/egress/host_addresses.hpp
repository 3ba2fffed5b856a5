// Whether an address is one of this host's own: assigned to one of its interfaces (or inside a
// `local` route) in the network namespace the proxy connects from. A sandbox under `network all`
// must not reach what the host serves on 0.0.0.0 or [::] through the host's public addresses, as
// it must not reach it through loopback.
//
// Asked of the kernel at each check, so the answer is always current: an address added or removed
// a moment ago counts as the kernel sees it now, with nothing to keep in sync. The check binds a
// throwaway UDP socket to the address (no packet is sent): the kernel accepts that only for one of
// its own addresses (and for broadcast and multicast ones, which the address policy refuses
// anyway). Where binding to any address is permitted (the ip_nonlocal_bind sysctls) it compares
// with the interfaces' addresses (getifaddrs) instead. About 5 us a check.
#pragma once

#include <asio/ip/address.hpp>

#include <string>

namespace moat::egress {

enum class host_address_verdict {
    elsewhere,  // not an address of this host
    this_host,
    unknown,  // the kernel could not be asked (out of descriptors): refuse
};

host_address_verdict check_host_address(const asio::ip::address& address);

}  // namespace moat::egress
