#include "egress/host_addresses.hpp"

#include "core/unique_fd.hpp"
#include "egress/address_policy.hpp"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace moat::egress {

namespace {

// Whether the namespace lets a socket bind to addresses it does not have (read per check: the
// sysctls are per network namespace and may change).
bool binds_nonlocal(bool v6) {
    std::ifstream in(v6 ? "/proc/sys/net/ipv6/ip_nonlocal_bind"
                        : "/proc/sys/net/ipv4/ip_nonlocal_bind");
    int value = 0;
    return in >> value && value != 0;
}

host_address_verdict by_interfaces(const asio::ip::address& address) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return host_address_verdict::unknown;
    host_address_verdict verdict = host_address_verdict::elsewhere;
    for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
        if (i->ifa_addr == nullptr) continue;
        if (address.is_v4() && i->ifa_addr->sa_family == AF_INET) {
            const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
            asio::ip::address_v4::bytes_type bytes{};
            std::memcpy(bytes.data(), &in->sin_addr, bytes.size());
            if (asio::ip::address_v4(bytes) == address.to_v4())
                verdict = host_address_verdict::this_host;
        } else if (address.is_v6() && i->ifa_addr->sa_family == AF_INET6) {
            const auto* in6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
            asio::ip::address_v6::bytes_type bytes{};
            std::memcpy(bytes.data(), &in6->sin6_addr, bytes.size());
            if (asio::ip::address_v6(bytes) == address.to_v6())
                verdict = host_address_verdict::this_host;
        }
    }
    ::freeifaddrs(list);
    return verdict;
}

}  // namespace

host_address_verdict check_host_address(const asio::ip::address& given) {
    asio::ip::address address = given;
    // An IPv6 form that embeds an IPv4 address reaches that IPv4 address.
    if (address.is_v6()) {
        if (auto v4 = embedded_ipv4(address.to_v6())) address = *v4;
    }
    const bool v6 = address.is_v6();
    if (binds_nonlocal(v6)) return by_interfaces(address);
    unique_fd probe(::socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!probe.is_open()) return host_address_verdict::unknown;
    int result = 0;
    if (v6) {
        sockaddr_in6 at{};
        at.sin6_family = AF_INET6;
        const auto bytes = address.to_v6().to_bytes();
        std::memcpy(&at.sin6_addr, bytes.data(), bytes.size());
        at.sin6_scope_id = address.to_v6().scope_id();
        result = ::bind(probe.get(), reinterpret_cast<const sockaddr*>(&at), sizeof at);
    } else {
        sockaddr_in at{};
        at.sin_family = AF_INET;
        const auto bytes = address.to_v4().to_bytes();
        std::memcpy(&at.sin_addr, bytes.data(), bytes.size());
        result = ::bind(probe.get(), reinterpret_cast<const sockaddr*>(&at), sizeof at);
    }
    if (result == 0) return host_address_verdict::this_host;
    // EADDRNOTAVAIL: not ours. EINVAL: an address no socket can have here (a link-local one
    // without its interface), which the address policy refuses before asking.
    if (errno == EADDRNOTAVAIL || errno == EINVAL) return host_address_verdict::elsewhere;
    return host_address_verdict::unknown;
}

}  // namespace moat::egress
