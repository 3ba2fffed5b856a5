// `moat serve`'s port hosts: a request for one of a sandbox's ports (a Host `<port>-<id>.<domain>`,
// or E2b-Sandbox-Id with E2b-Sandbox-Port: sandbox_names.hpp's requested_port) arrives on envd's
// listener and is proxied into that sandbox (sandbox::async_connect_port: the sandbox never gets
// a route). HTTP, WebSocket upgrades and anything else that starts with an HTTP head; TLS when the
// listener has it (a wildcard certificate for `*.<domain>`).
//
// One request per proxied connection: the head goes to the sandbox's server with
// `Connection: close` (an upgrade keeps its Connection and Upgrade), then the bytes are relayed
// both ways as they are (the body, the response, a WebSocket's frames) until either side ends
// (stream_relay.hpp), the idle limit passes (serve_options::port_idle_timeout) or the sandbox ends.
// So a connection can never carry a request to another sandbox, whatever the client sends next.
// The sandbox's server never sees the envd access token or the traffic token.
//
// A paused sandbox created with autoResume is resumed before the request goes on
// (sandbox_pause.hpp's wake_for_traffic; 502 "The sandbox could not be resumed: ..." when that
// fails); one without is answered as one that is gone.
//
// Answers (JSON {"code","message"}, as E2B's proxy): 502 "The sandbox was not found" for a
// sandbox that is not a live one of this server or is paused without autoResume; 403 when its ports
// are private and the request lacks its trafficAccessToken (E2B-Traffic-Access-Token, compared in
// constant time) or names moat's own port in the sandbox (the egress proxy's 3128: never
// forwarded); 502 "The sandbox is running but port is not open" when nothing listens there; 429
// past serve_options::max_port_connections open to one sandbox; 400 for an E2b-Sandbox-Port that is
// no port or no sandbox named.
#pragma once

#include "http/server.hpp"
#include "serve/serve_context.hpp"

namespace moat::serve {

// Sends every port request on `server` (envd's) to the proxy.
void add_port_proxy(http::server& server, serve_context& context);

}  // namespace moat::serve
