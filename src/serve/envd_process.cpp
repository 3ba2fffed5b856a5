// envd's process service (process.Process/*): Start, Connect, List, SendInput, StreamInput,
// CloseStdin, SendSignal, Update. Until implemented, each answers the Connect error
// `unimplemented` naming the method.
#include "serve/connect_rpc.hpp"
#include "serve/envd_service.hpp"

namespace moat::serve {
namespace {

asio::awaitable<void> unimplemented_stream(envd_call& call) {
    connect_stream stream(call.response);
    const std::string message = std::string(call.request.path()) + " is not implemented yet";
    (void)co_await stream.async_end(http::connect::code::unimplemented, message);
}

asio::awaitable<void> unimplemented_unary(envd_call& call) {
    const std::string message = std::string(call.request.path()) + " is not implemented yet";
    (void)co_await async_send_unary_error(call.response, http::connect::code::unimplemented,
                                          message);
}

}  // namespace

void add_process_service(envd_routes& routes, serve_context&) {
    for (const char* method : {"Start", "Connect", "StreamInput"}) {
        routes.add("POST", std::string("/process.Process/") + method, unimplemented_stream);
    }
    for (const char* method : {"List", "SendInput", "CloseStdin", "SendSignal", "Update"}) {
        routes.add("POST", std::string("/process.Process/") + method, unimplemented_unary);
    }
}

}  // namespace moat::serve
