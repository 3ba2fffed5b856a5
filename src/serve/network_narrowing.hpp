// How a create request's network (E2B's allow_internet_access and network object) becomes a
// sandbox's: always within the operator's policy, which a request may only narrow.
#pragma once

#include <moat/result.hpp>
#include <moat/sandbox_spec.hpp>

#include "e2b_protocol/sandbox_requests.hpp"

namespace moat::serve {

// A create request's network narrowed onto the operator's (--allow-host, --network, ...): a
// request may only narrow. allow_internet_access false gives none; a network whose denyOut has
// "0.0.0.0/0" with names in allowOut gives the operator's `all` that list, an operator allow-list
// the hosts in both lists (exact match), none when nothing is left. Operator none stays none.
// Every other denyOut entry must be an IP address or CIDR range that the result already refuses
// (any, under an allow-list or none; under `all` one inside a non-public block that no
// --allow-address opens, egress::refuses_whole_range): otherwise invalid_argument naming the
// entries, since the egress proxy cannot deny a public range by address. Everything else in
// `network` (allowPublicTraffic, egressProxy, rules, CIDRs in allowOut) is ignored. A name that
// is not a valid pattern (or has a port) is invalid_argument naming it.
result<sandbox_network> narrow_network(const sandbox_network& operator_network,
                                       const e2b_protocol::create_request& request);

}  // namespace moat::serve
