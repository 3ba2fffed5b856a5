// How far a running sandbox's network may change (pure; no I/O): the rule every live update
// (backend::async_update_network, moat serve's PUT /sandboxes/{id}/network, `moat network`) meets.
//
// An update replaces the sandbox's network. It may always narrow (what it asks for is already
// allowed now) and may widen only within the operator's limit: each host pattern, pinned name
// (`--resolve`) and address range (`--allow-address`) it lists must be covered by the limit or
// by the network in force, and `all` needs one of them to be `all`. A pattern covers another
// when every host and port the second matches, the first matches too (`*.example.org` covers
// `a.example.org` and `*.b.example.org`; `pypi.org` without a port covers `pypi.org:443`, never
// `pypi.org:8080`); a pin is covered by the same name pinned to the same address; a range by a
// range that contains it.
#pragma once

#include <moat/result.hpp>
#include <moat/sandbox_spec.hpp>

namespace moat::egress {

// Nothing when `wanted` may replace `current` under `limit`. invalid_argument when `wanted` is
// not a valid network (make_network_policy's detail); permission_denied naming the first entry
// past both, e.g. "host \"b.test\" is outside this sandbox's network limit (a.test, *.c.test)".
result<void> check_network_update(const sandbox_network& wanted, const sandbox_network& current,
                                  const sandbox_network& limit);

}  // namespace moat::egress
