// The host names of E2B's egress rules (a create's network.allowOut, a SandboxDetail's): exact
// names and "*." wildcards, matched on HTTP and HTTPS, never with a port. moat serve checks the
// names a request sends, the e2b backend the names it asks E2B for, by this one rule.
#pragma once

#include <moat/result.hpp>

#include <string_view>

namespace moat::e2b_protocol {

// Whether `name` is an allowOut host name: a host pattern as moat's egress proxy reads them
// (egress/network_policy.hpp). invalid_argument "'<name>' <why>" when it is not one;
// not_supported "'<name>' has a port ..." when it names a port, which E2B cannot filter by. An IP
// address or CIDR (egress::is_address_entry) is an address rule, not a name: check it apart.
result<void> check_allow_out_name(std::string_view name);

}  // namespace moat::e2b_protocol
