// A create request's network narrowed onto the operator's (network_narrowing.hpp).
#include "serve/network_narrowing.hpp"

#include "e2b_protocol/network_names.hpp"
#include "egress/address_policy.hpp"

#include <algorithm>

namespace moat::serve {

namespace protocol = e2b_protocol;
using e2b_protocol::create_request;

namespace {

// The operator's policy narrowed by allow_internet_access and by allowOut under a denyOut with
// "0.0.0.0/0" (narrow_network without its check of the other denyOut ranges).
result<sandbox_network> narrow_by_names(const sandbox_network& operator_network,
                                        const create_request& request) {
    std::vector<std::string> names;
    bool listed = false;
    if (request.network) {
        const auto& deny = request.network->deny_out;
        listed = std::find(deny.begin(), deny.end(), "0.0.0.0/0") != deny.end();
        for (const auto& entry : request.network->allow_out) {
            // CIDRs and IP literals in allowOut are E2B address rules: not a name to allow.
            if (egress::is_address_entry(entry)) continue;
            if (auto valid = protocol::check_allow_out_name(entry); !valid) {
                // A port is as much a bad request as a malformed name.
                return make_error(errc::invalid_argument,
                                  "network.allowOut " + valid.error().detail);
            }
            if (std::find(names.begin(), names.end(), entry) == names.end()) {
                names.push_back(entry);
            }
        }
    }
    if (operator_network.mode == network_mode::none) return operator_network;
    if (request.allow_internet_access == false) return sandbox_network{};
    if (!listed) return operator_network;
    sandbox_network out = operator_network;
    if (operator_network.mode == network_mode::all) {
        out.mode = network_mode::allow_list;
        out.allow_hosts = std::move(names);
    } else {
        out.allow_hosts.clear();
        for (const auto& host : operator_network.allow_hosts) {
            if (std::find(names.begin(), names.end(), host) != names.end()) {
                out.allow_hosts.push_back(host);
            }
        }
    }
    if (out.allow_hosts.empty()) return sandbox_network{};
    return out;
}

// denyOut's ranges other than "0.0.0.0/0" against the sandbox's effective `network`: each must
// already be refused there. Under an allow-list or none every address is refused but the allowed
// names' (E2B's allowOut takes precedence over denyOut too); under `all` only what the proxy
// refuses by default and no --allow-address opens.
result<void> check_deny_ranges(const sandbox_network& network, const create_request& request) {
    if (!request.network) return {};
    std::vector<egress::address_range> opened;
    for (const auto& text : network.allow_addresses) {
        std::string why;
        if (auto range = egress::parse_address_range(text, why)) opened.push_back(*range);
    }
    std::string unenforceable;
    for (const auto& entry : request.network->deny_out) {
        if (entry == "0.0.0.0/0") continue;
        std::string why;
        const auto range = egress::parse_address_range(entry, why);
        if (!range)
            return make_error(errc::invalid_argument, "network.denyOut '" + entry + "' " + why);
        if (network.mode != network_mode::all || egress::refuses_whole_range(*range, opened))
            continue;
        if (!unenforceable.empty()) unenforceable += ", ";
        unenforceable += entry;
    }
    if (unenforceable.empty()) return {};
    return make_error(errc::invalid_argument,
                      "network.denyOut cannot be enforced for " + unenforceable +
                          ": this server's sandboxes reach any public host by name, and moat "
                          "denies by address only what is not public; deny all with 0.0.0.0/0 "
                          "and list the names to allow in allowOut");
}

}  // namespace

result<sandbox_network> narrow_network(const sandbox_network& operator_network,
                                       const create_request& request) {
    auto narrowed = narrow_by_names(operator_network, request);
    if (!narrowed) return narrowed;
    if (auto enforced = check_deny_ranges(*narrowed, request); !enforced) {
        return std::move(enforced).error();
    }
    return narrowed;
}

}  // namespace moat::serve
