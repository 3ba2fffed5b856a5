// The backend conformance suite.
#include "http/client.hpp"

#include "support/async_test.hpp"
#include "support/serve_process.hpp"
#include "support/test_ca.hpp"

#include <asio/io_context.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <string>

using namespace std::chrono_literals;

namespace {

asio::awaitable<moat::result<moat::http::full_response>> fetch_health(moat::http::client& client,
                                                                      std::string url) {
    moat::http::request req;
    req.url = url + "/health";
    req.limit = moat::deadline::after(10s);
    co_return co_await client.async_fetch(std::move(req), 4096);
}

}  // namespace

TEST_CASE("a test's moat serve answers over plain HTTP and over TLS with the test CA, then stops") {
    moat::test::test_ca ca;
    asio::io_context io;
    {
        moat::test::serve_process serve;
        CHECK(serve.api_url().rfind("http://127.0.0.1:", 0) == 0);
        CHECK(serve.envd_url().rfind("http://127.0.0.1:", 0) == 0);
        CHECK(serve.api_port() != 0);
        moat::http::client client(io.get_executor());
        const auto health = moat::test::run_async(io, fetch_health(client, serve.api_url()));
        REQUIRE_MESSAGE(health.has_value(), health.error().detail);
        CHECK(health->status() == 200);
        CHECK(serve.sandbox_processes().empty());
        CHECK(serve.stop() == 0);
        CHECK(!serve.is_running());
    }
    {
        moat::test::serve_process_options options;
        options.tls_cert_file = ca.server_cert_file;
        options.tls_key_file = ca.server_key_file;
        options.max_sandboxes = 4;
        moat::test::serve_process serve(options);
        CHECK(serve.api_url().rfind("https://127.0.0.1:", 0) == 0);
        moat::http::client_options trusting;
        trusting.use_system_ca_store = false;
        trusting.ca_file = ca.ca_file;
        moat::http::client client(io.get_executor(), trusting);
        const auto health = moat::test::run_async(io, fetch_health(client, serve.api_url()));
        REQUIRE_MESSAGE(health.has_value(), health.error().detail);
        CHECK(health->status() == 200);
        moat::http::client_options other;
        other.use_system_ca_store = false;
        other.ca_file = ca.unknown_ca_file;
        moat::http::client stranger(io.get_executor(), other);
        const auto refused = moat::test::run_async(io, fetch_health(stranger, serve.api_url()));
        REQUIRE(!refused.has_value());
        CHECK(refused.error().detail.find("certificate verify failed") != std::string::npos);
        CHECK(serve.stop() == 0);
    }
}
