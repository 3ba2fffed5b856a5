#include "support/serve_api.hpp"

#include "e2b_protocol/sandbox_replies.hpp"

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
    auto parsed = e2b_protocol::parse_sandbox_reply(reply->body);
    if (!parsed || parsed->envd_access_token.empty())
        co_return make_error(errc::protocol_error, "the create reply has no sandboxID or token");
    serve_sandbox made;
    made.id = std::move(parsed->sandbox_id);
    made.token = std::move(parsed->envd_access_token);
    co_return made;
}

e2b_config e2b_config_for(const serve_process& serve) {
    e2b_config config;
    config.api_key = serve.api_key();
    config.api_url = serve.api_url();
    config.sandbox_url = serve.envd_url();
    config.domain = "localhost";
    return config;
}

}  // namespace moat::test
