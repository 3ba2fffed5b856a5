// Which of the server's sandboxes a list request gets (GET /v2/sandboxes, GET /sandboxes): E2B's
// filters, its order by start time, and pages with this server's own cursor (X-Next-Token:
// base64url of "<start ms>__<id>[__asc]"). The control plane writes the answer.
#pragma once

#include "e2b_protocol/sandbox_requests.hpp"
#include "serve/sandbox_registry.hpp"

#include <moat/result.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat::serve {

// A list request as this server reads it: E2B's parameters, and the page cursor decoded from
// nextToken.
struct list_query {
    e2b_protocol::list_request request;
    // The states asked for: `state` names them; without it, /v2 lists both, /sandboxes (v1)
    // running ones only.
    bool running = true;
    bool paused = true;
    bool descending = true;
    std::size_t limit = 100;
    std::optional<std::pair<std::int64_t, std::string>> after;  // the next token's cursor
};
// invalid_argument for a bad parameter (naming it) or "Invalid next token".
result<list_query> parse_list_query(std::string_view raw, bool paged);

// One page of `live` (the registry's live entries) for `q`.
struct list_page {
    std::vector<std::shared_ptr<registry_entry>> entries;
    std::size_t total = 0;                  // all that match, before the cursor and the limit
    std::optional<std::string> next_token;  // when a page follows (paged lists only)
};
list_page select_page(std::vector<std::shared_ptr<registry_entry>> live, const list_query& q,
                      bool paged);

}  // namespace moat::serve
