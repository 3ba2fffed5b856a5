// `moat serve` as one coroutine: the runtime, the registry (adopting this server's sandboxes
// left running by an earlier run), the control plane and envd listeners on the caller's
// executor, until cancelled.
//
// On start it announces one line per listener through `announce` ("api http://127.0.0.1:3000",
// "envd http://127.0.0.1:49983"; https with TLS). Cancellation (terminal: SIGINT/SIGTERM in the
// CLI) is the graceful stop: both listeners stop accepting, in-flight requests get `stop_grace`
// to finish (then their connections are closed), background work is cancelled and awaited, and
// with destroy_on_exit every sandbox of the registry is destroyed, confirmed. Otherwise the
// sandboxes run on until their E2B timeout (their moat TTL) and the next start adopts them.
//
// Returns 0 after a clean stop; 2 when a listener or TLS file is unusable (one line on stderr
// through `report`), 3 when the backend or the state directory fails (one that another user
// owns, or that its group or others may write, is refused as found), or a destroy on exit
// could not be confirmed.
#pragma once

#include <moat/backend.hpp>

#include "serve/serve_options.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <functional>
#include <string_view>

namespace moat::serve {

struct serve_hooks {
    std::function<void(std::string_view line)> announce;  // stdout, flushed
    std::function<void(std::string_view line)> report;    // stderr: one line per problem
    std::chrono::milliseconds stop_grace{5000};
};

asio::awaitable<int> async_run_serve(backend& sandboxes, serve_options options, serve_hooks hooks);

}  // namespace moat::serve
