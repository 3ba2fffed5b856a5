// Calls of `moat serve`'s control plane that several tests make, through moat's own HTTP client
// (the official SDKs are driven from tests/e2b).
#pragma once

#include "http/client.hpp"
#include "support/serve_process.hpp"

#include <moat/e2b_backend.hpp>
#include <moat/result.hpp>

#include <asio/awaitable.hpp>

#include <string>

namespace moat::test {

// A sandbox made through the control plane: its id and its envd access token.
struct serve_sandbox {
    std::string id;
    std::string token;
};

// POST /v2/sandboxes (template "base", a 600 s timeout) with the server's key: the sandbox, or
// the error (a status other than 201 is backend_failure naming it).
asio::awaitable<result<serve_sandbox>> async_create_serve_sandbox(http::client& client,
                                                                  const serve_process& serve);

// An e2b backend's configuration for `serve`: its key, its control plane, one envd URL for every
// sandbox, domain "localhost"; the rest e2b_config's defaults (a test sets what it needs, such
// as a proxy's URL in place of the server's).
e2b_config e2b_config_for(const serve_process& serve);

}  // namespace moat::test
