// `moat serve`'s live network rules: PUT /sandboxes/{id}/network (E2B's updateNetwork()), the
// sandbox's egress rules replaced while it runs (sandbox::async_update_network).
//
// The body is E2B's SandboxNetworkUpdateConfig: the whole new configuration, an omitted field
// cleared (so {} is the fullest the server allows: the operator's network). It maps onto the
// operator's network as a create's does (narrow_network: allow_internet_access false is none,
// denyOut "0.0.0.0/0" with names in allowOut an allow-list of those names, other denyOut ranges
// only where already refused), except that a listed name the operator's network does not cover is
// refused naming it rather than dropped: an update may narrow, and widen only within the
// operator's list (egress/network_bounds.hpp).
//
//   204  applied: the sandbox's proxy checks new connections against it, and its proxied
//        connections to a host it no longer allows are closed
//   400  a malformed body or entry, named; 403 a name past the operator's network, named
//   404  no such sandbox; 409 a sandbox created without network access (it has no egress proxy
//        endpoint, and none is added while it runs)
#pragma once

#include "e2b_protocol/sandbox_requests.hpp"
#include "http/server.hpp"
#include "serve/serve_context.hpp"

#include <moat/result.hpp>
#include <moat/sandbox_spec.hpp>

#include <asio/awaitable.hpp>

namespace moat::serve {

// The network an update asks for under `operator_network` (the rules above). invalid_argument
// for a bad entry, permission_denied for a name past the operator's network.
result<sandbox_network> network_for_update(const sandbox_network& operator_network,
                                           const e2b_protocol::network_update_request& update);

// The route (the control plane checked the API key).
asio::awaitable<void> answer_update_network(serve_context& context, http::server_request& request,
                                            http::server_response& response);

}  // namespace moat::serve
