// What E2B's control plane answers: Sandbox (create, connect), SandboxDetail (GET /sandboxes/{id}),
// and ListedSandbox[] (GET /v2/sandboxes) (its Error body is error_body.hpp's). Each has one
// struct, one writer (moat serve answers with it) and one parser (the e2b backend's client reads
// it), unit-tested in tests/e2b_protocol_test.cpp and fuzzed (fuzz/e2b_response_fuzzer.cpp).
//
// The parsers read untrusted bytes: a body over its cap is refused, unknown fields are ignored,
// int64 fields may come as strings (as E2B's generated clients accept), and every failure is
// errc::protocol_error (the server broke the protocol) with a one-line detail naming the field.
// No parser copies a value into an error detail, so a token in a reply never reaches an error.
#pragma once

#include "e2b_protocol/sandbox_requests.hpp"

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

// Caps on what the control plane may send: one sandbox, one list page.
inline constexpr std::size_t max_sandbox_body_bytes = 256 * 1024;
inline constexpr std::size_t max_list_body_bytes = 4 * 1024 * 1024;
// Sandboxes in one list page at most (E2B pages at 100), and metadata entries per sandbox. A
// string field is at most max_string_bytes, a network list max_network_entries entries (the
// caps of sandbox_requests.hpp).
inline constexpr std::size_t max_listed_sandboxes = 1000;
inline constexpr std::size_t max_metadata_entries = max_map_entries;

// E2B's constant client id.
inline constexpr std::string_view e2b_client_id = "6532622b";

// Sandbox: the reply to a create or a connect.
struct sandbox_reply {
    std::string sandbox_id;
    std::string template_id;
    std::string alias;
    std::string client_id;
    std::string envd_version;
    std::string envd_access_token;     // "" when the sandbox is not secured
    std::string traffic_access_token;  // "" (null): its ports are public
    std::string domain;                // "" for null: the client's domain applies
};
std::string encode_sandbox_reply(const sandbox_reply& reply);
result<sandbox_reply> parse_sandbox_reply(std::string_view body);

// SandboxDetail and ListedSandbox (the latter without the token, the domain, the egress and the
// lifecycle: the list writer leaves them out, the list parser does not report the egress).
struct sandbox_detail {
    std::string sandbox_id;
    std::string template_id;
    std::string alias;
    std::string client_id;
    std::chrono::system_clock::time_point started_at;
    std::chrono::system_clock::time_point end_at;
    std::string state;  // "running", "paused", ...
    std::int64_t cpu_count = 0;
    std::int64_t memory_mb = 0;
    std::int64_t disk_size_mb = 0;
    std::string envd_version;
    std::map<std::string, std::string> metadata;
    std::string envd_access_token;
    std::string domain;  // "" is written as null
    // SandboxDetail only: its egress switch (nullopt when absent or null: E2B's default, which
    // is on) and the `network` object's allowOut (names, CIDRs) and denyOut (CIDRs), written when
    // either list has an entry.
    std::optional<bool> allow_internet_access;
    std::vector<std::string> allow_out;
    std::vector<std::string> deny_out;
    // SandboxDetail only: whether its ports are public (network.allowPublicTraffic; nullopt
    // when absent).
    std::optional<bool> allow_public_traffic;
    // SandboxDetail only: network.maskRequestHost (nullopt when absent).
    std::optional<std::string> mask_request_host;
    // What happens at the end (SandboxDetail's lifecycle; written, not read).
    std::string on_timeout = "kill";
    bool auto_resume = false;
    // True when parsed from a SandboxDetail, whose egress fields describe the sandbox (absent
    // ones meaning E2B's defaults); false for a ListedSandbox, which has none.
    bool network_reported = false;
};
std::string encode_sandbox_detail(const sandbox_detail& detail);
result<sandbox_detail> parse_sandbox_detail(std::string_view body);
std::string encode_sandbox_list(const std::vector<sandbox_detail>& sandboxes);
result<std::vector<sandbox_detail>> parse_sandbox_list(std::string_view body);

}  // namespace moat::e2b_protocol
