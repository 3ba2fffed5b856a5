#include "support/serve_api.hpp"

#include <simdjson.h>

#include <chrono>

namespace moat::test {

asio::awaitable<result<serve_sandbox>> async_create_serve_sandbox(http::client& client,
                                                                  const serve_process& serve) {
    http::request request;
    request.method = "POST";
    request.url = serve.api_url() + "/v2/sandboxes";
    request.headers.add("X-API-Key", serve.api_key());
    request.headers.add("Content-Type", "application/json");
    request.body = R"({"templateID":"base","timeout":600})";
    request.limit = deadline::after(std::chrono::seconds(60));
    auto reply = co_await client.async_fetch(std::move(request), 1 << 20);
    if (!reply) co_return reply.error();
    if (reply->status() != 201)
        co_return make_error(errc::backend_failure, "create answered " +
                                                        std::to_string(reply->status()) + ": " +
                                                        reply->body.substr(0, 200));
    simdjson::dom::parser parser;
    const simdjson::padded_string text(reply->body);
    simdjson::dom::element root;
    std::string_view id;
    std::string_view token;
    if (parser.parse(text).get(root) != simdjson::SUCCESS ||
        root["sandboxID"].get_string().get(id) != simdjson::SUCCESS ||
        root["envdAccessToken"].get_string().get(token) != simdjson::SUCCESS)
        co_return make_error(errc::protocol_error, "the create reply has no sandboxID or token");
    serve_sandbox made;
    made.id = std::string(id);
    made.token = std::string(token);
    co_return made;
}

}  // namespace moat::test
