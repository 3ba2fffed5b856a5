// envd's file transfer routes: GET /files (download) and POST /files (multipart or octet-stream
// upload), reachable with the sandbox's token or a signed URL (envd_auth::token_or_signature;
// the signature check is this file's signature verifier). Until implemented, each answers 501
// {"code":501,"message":...} naming the route.
#include "serve/envd_service.hpp"

namespace moat::serve {
namespace {

asio::awaitable<void> unimplemented(envd_call& call) {
    const std::string message =
        std::string(call.request.method()) + " /files is not implemented yet";
    (void)co_await call.response.async_send_error(501, message);
}

}  // namespace

void add_file_routes(envd_routes& routes, serve_context& context) {
    http::route_options options;
    options.max_body_bytes = context.options.max_file_bytes;
    routes.add("GET", "/files", unimplemented, {}, envd_auth::token_or_signature);
    routes.add("POST", "/files", unimplemented, options, envd_auth::token_or_signature);
}

}  // namespace moat::serve
