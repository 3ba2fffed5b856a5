// E2B's sandbox metrics on the wire: GET /sandboxes/{id}/metrics?start=&end= (a SandboxMetric
// array) and GET /sandboxes/metrics?sandbox_ids=a,b (SandboxesWithMetrics: each sandbox's latest).
// The queries are what a client sends (untrusted: fuzzed in e2b_request_fuzzer).
#pragma once

#include <moat/result.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat::e2b_protocol {

// The most sandboxes one list-form request may name (E2B's maxItems).
inline constexpr std::size_t max_metrics_sandboxes = 100;

// GET /sandboxes/{id}/metrics: the interval, in unix seconds (absent: unbounded).
struct metrics_request {
    std::optional<std::int64_t> start;
    std::optional<std::int64_t> end;
};
// invalid_argument naming the parameter when start or end is not a whole number of seconds from
// 0 to 2^40, or start is after end.
result<metrics_request> parse_metrics_request(std::string_view query);

// GET /sandboxes/metrics: `sandbox_ids`, comma-separated, required, 1 to 100, unique.
result<std::vector<std::string>> parse_metrics_list_request(std::string_view query);

// One SandboxMetric.
struct sandbox_metric {
    std::chrono::system_clock::time_point at;
    std::uint32_t cpu_count = 1;
    double cpu_used_percent = 0;
    std::uint64_t mem_used = 0;
    std::uint64_t mem_total = 0;
    std::uint64_t mem_cache = 0;
    std::uint64_t disk_used = 0;
    std::uint64_t disk_total = 0;
};
// [SandboxMetric, ...] with timestamp (RFC 3339), timestampUnix, cpuCount, cpuUsedPct, memUsed,
// memTotal, memCache, diskUsed, diskTotal.
std::string encode_sandbox_metrics(const std::vector<sandbox_metric>& metrics);
// {"sandboxes": {"<id>": SandboxMetric, ...}}.
std::string encode_sandboxes_with_metrics(const std::map<std::string, sandbox_metric>& latest);

}  // namespace moat::e2b_protocol
