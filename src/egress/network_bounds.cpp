#include "egress/network_bounds.hpp"

#include "egress/network_policy.hpp"

#include <algorithm>
#include <array>

namespace moat::egress {

namespace {

bool covers(const host_pattern& outer, const host_pattern& inner) {
    constexpr std::array<std::uint16_t, 2> web_ports = {80, 443};
    const auto outer_has = [&](std::uint16_t port) {
        if (outer.port) return *outer.port == port;
        return std::find(web_ports.begin(), web_ports.end(), port) != web_ports.end();
    };
    if (inner.port ? !outer_has(*inner.port) : !(outer_has(80) && outer_has(443))) return false;
    if (!outer.subdomains_only) return !inner.subdomains_only && inner.name == outer.name;
    const std::string suffix = "." + outer.name;
    if (inner.subdomains_only && inner.name == outer.name) return true;
    return inner.name.size() > suffix.size() && inner.name.ends_with(suffix);
}

bool covers(const address_range& outer, const address_range& inner) {
    return outer.network.is_v4() == inner.network.is_v4() &&
           outer.prefix_length <= inner.prefix_length && outer.contains(inner.network);
}

// Whether one of `policies` (the limit, the network in force) covers `item` by `rule`.
template <class Item, class Rule>
bool any_covers(const std::array<const network_policy*, 2>& policies, const Item& item, Rule rule) {
    return std::any_of(policies.begin(), policies.end(),
                       [&](const network_policy* p) { return rule(*p, item); });
}

}  // namespace

result<void> check_network_update(const sandbox_network& wanted, const sandbox_network& current,
                                  const sandbox_network& limit) {
    auto asked = make_network_policy(wanted);
    if (!asked) return std::move(asked).error();
    auto in_force = make_network_policy(current);
    auto bound = make_network_policy(limit);
    if (!in_force || !bound) {
        return make_error(errc::backend_failure,
                          "the sandbox's recorded network or limit is not a valid network");
    }
    const std::array<const network_policy*, 2> policies = {&*bound, &*in_force};
    const auto outside = [&](const std::string& what) {
        return make_error(
            errc::permission_denied,
            what + " is outside this sandbox's network limit (" + bound->summary() + ")");
    };
    if (asked->mode() == network_mode::all) {
        const auto is_all = [](const network_policy& p, int) {
            return p.mode() == network_mode::all;
        };
        if (!any_covers(policies, 0, is_all)) return outside("every host (network all)");
    }
    const auto& texts = wanted.allow_hosts;
    for (std::size_t i = 0; i < asked->patterns().size(); ++i) {
        const auto pattern_covered = [](const network_policy& p, const host_pattern& inner) {
            if (p.mode() == network_mode::all) return true;
            return std::any_of(p.patterns().begin(), p.patterns().end(),
                               [&](const host_pattern& outer) { return covers(outer, inner); });
        };
        if (!any_covers(policies, asked->patterns()[i], pattern_covered))
            return outside("host \"" + texts[i] + "\"");
    }
    for (const auto& text : wanted.resolve) {
        const auto name = normalise_host_name(text.substr(0, text.find('=')), false);
        const auto* addresses = name ? asked->pinned(*name) : nullptr;
        if (addresses == nullptr) continue;
        for (const auto& address : *addresses) {
            const auto pin_covered = [&](const network_policy& p, const asio::ip::address& a) {
                const auto* theirs = p.pinned(*name);
                return theirs && std::find(theirs->begin(), theirs->end(), a) != theirs->end();
            };
            if (!any_covers(policies, address, pin_covered))
                return outside("--resolve " + *name + "=" + address.to_string());
        }
    }
    for (std::size_t i = 0; i < asked->allowed_ranges().size(); ++i) {
        const auto range_covered = [](const network_policy& p, const address_range& inner) {
            return std::any_of(p.allowed_ranges().begin(), p.allowed_ranges().end(),
                               [&](const address_range& outer) { return covers(outer, inner); });
        };
        if (!any_covers(policies, asked->allowed_ranges()[i], range_covered))
            return outside("--allow-address " + wanted.allow_addresses[i]);
    }
    return {};
}

}  // namespace moat::egress
