// `moat serve`'s sandbox metrics (E2B's getMetrics()): every live sandbox's usage
// (sandbox::async_usage) is read every metrics_interval into its registry entry's usage_history
// (an hour of readings), and the control plane answers from those histories:
//
//   GET /sandboxes/{id}/metrics?start=&end=   200 SandboxMetric[] in [start, end] (unix seconds,
//                                             each optional), oldest first; 404; 400 bad query
//   GET /sandboxes/metrics?sandbox_ids=a,b    200 {"sandboxes": {id: latest SandboxMetric}}, for
//                                             the ids that are live and have a reading; 400
//
// A reading costs a few cgroupfs and statfs calls on the host, on the sandbox's side lane (never
// behind a long command); a sandbox whose backend has no usage (e2b) is simply not read.
#pragma once

#include "http/server.hpp"
#include "serve/serve_context.hpp"

#include <asio/awaitable.hpp>

#include <chrono>

namespace moat::serve {

inline constexpr std::chrono::seconds metrics_interval{5};

// Reads every live sandbox's usage every metrics_interval until cancelled (terminal).
asio::awaitable<void> run_metrics_sampler(serve_context& context);

// The two routes above (the control plane checked the API key).
asio::awaitable<void> answer_sandbox_metrics(serve_context& context, http::server_request& request,
                                             http::server_response& response);
asio::awaitable<void> answer_sandboxes_metrics(serve_context& context,
                                               http::server_request& request,
                                               http::server_response& response);

}  // namespace moat::serve
