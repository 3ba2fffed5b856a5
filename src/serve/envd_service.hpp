// How envd's services plug into the envd server: ONE interface for every service.
//
// The envd server (envd_server.hpp) demultiplexes each request to a sandbox of the registry (the
// E2b-Sandbox-Id header, or a `49983-<id>.<domain>` Host), answers 502
// {"code":502,"message":"The sandbox was not found","sandboxId":...} when there is none, checks
// X-Access-Token against the sandbox's token in constant time (401 when it is wrong or missing),
// and only then calls the route's handler with an envd_call. A service never sees a request for
// a sandbox that is not live, nor an unauthenticated one.
//
//     void add_process_service(envd_routes& routes, serve_context& context) {
//         routes.add("POST", "/process.Process/List", list_processes);
//     }
//     asio::awaitable<void> list_processes(envd_call& call) {
//         auto body = co_await call.request.async_read_body();
//         ...
//         co_await send_unary(call.response, json);          // connect_rpc.hpp
//     }
//
// Signed file URLs (GET/POST /files with `signature`, `signature_expiration`): a route added with
// envd_auth::token_or_signature runs the handler without a valid X-Access-Token when a signature
// verifier (set_signature_verifier) accepts the request. The verifier gets the sandbox named by
// the request (header or Host), or null when the request names none, and returns the entry the
// signature is valid for (none: 401, "signature is already expired" when it was right but
// expired). It is the files service's to implement.
//
// Handlers run on the server's executor, one coroutine per request; a handler that must keep
// working after its request ends spawns into serve_context::background.
#pragma once

#include "http/server.hpp"
#include "serve/sandbox_registry.hpp"
#include "serve/serve_context.hpp"

#include <asio/awaitable.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace moat::serve {

struct envd_call {
    // The live sandbox the request is for. Held for the call: a kill during the call sets
    // sandbox->ended (wait on it to end a stream at once) and the handle then fails its
    // operations with sandbox_unavailable.
    std::shared_ptr<registry_entry> sandbox;
    http::server_request& request;
    http::server_response& response;
    serve_context& context;
    // True when X-Access-Token matched; false when a signature verifier let the call in.
    bool token_verified = true;
};

using envd_handler = std::function<asio::awaitable<void>(envd_call&)>;

// A handler of a service with state of its own (the process table, the watchers): `handler`
// called with the service and the call.
template <class Service>
envd_handler with_service(const std::shared_ptr<Service>& service,
                          asio::awaitable<void> (*handler)(std::shared_ptr<Service>, envd_call&)) {
    return [service, handler](envd_call& call) { return handler(service, call); };
}

enum class envd_auth {
    token,               // X-Access-Token required (every Connect RPC)
    token_or_signature,  // GET/POST /files: the token, or a signed URL (see above)
};

// What a signature verifier found: the sandbox the signature is valid for, or none; `expired`
// when the signature was right for a sandbox but its expiration has passed (envd answers that
// with its own message).
struct signature_verdict {
    std::shared_ptr<registry_entry> entry;
    bool expired = false;
};
using signature_verifier = std::function<signature_verdict(
    const http::server_request& request, const std::shared_ptr<registry_entry>& named)>;

class envd_routes {
  public:
    struct route {
        std::string method;
        std::string path;  // an http::router pattern
        envd_handler handler;
        http::route_options options;
        envd_auth auth = envd_auth::token;
    };

    void add(std::string method, std::string path, envd_handler handler,
             http::route_options options = {}, envd_auth auth = envd_auth::token);
    void set_signature_verifier(signature_verifier verifier);

    const std::vector<route>& routes() const noexcept { return routes_; }
    const signature_verifier& verifier() const noexcept { return verifier_; }

  private:
    std::vector<route> routes_;
    signature_verifier verifier_;
};

// The services, each in its own file; each adds its routes.
void add_process_service(envd_routes& routes, serve_context& context);     // envd_process.cpp
void add_filesystem_service(envd_routes& routes, serve_context& context);  // envd_filesystem.cpp
// WatchDir and the polling watchers, added by add_filesystem_service.
void add_watch_routes(envd_routes& routes, serve_context& context);  // envd_watch.cpp
void add_file_routes(envd_routes& routes, serve_context& context);   // envd_files.cpp

}  // namespace moat::serve
