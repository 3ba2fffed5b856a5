// What the E2B control plane answers, parsed from untrusted bytes: pure functions, unit-tested
// and fuzzed (fuzz/e2b_response_fuzzer.cpp). Every parser refuses a body over its cap and answers
// protocol_error with a one-line detail naming the field; unknown fields are ignored, int64
// fields may come as strings (as E2B's generated clients accept). No parser copies a value into
// an error detail, so a token in a response never reaches an error.
//
// Shapes (E2B's OpenAPI): Sandbox (create, connect), SandboxDetail (GET /sandboxes/{id}),
// ListedSandbox[] (GET /v2/sandboxes), Error {"code", "message"}.
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

namespace moat::e2b {

// Caps on what the control plane may send: one sandbox, one list page, an error body.
inline constexpr std::size_t max_sandbox_body_bytes = 256 * 1024;
inline constexpr std::size_t max_list_body_bytes = 4 * 1024 * 1024;
inline constexpr std::size_t max_error_body_bytes = 16 * 1024;
// Sandboxes in one list page at most (E2B pages at 100), metadata entries per sandbox, and the
// bytes of one string field.
inline constexpr std::size_t max_listed_sandboxes = 1000;
inline constexpr std::size_t max_metadata_entries = 256;
inline constexpr std::size_t max_string_bytes = 8 * 1024;
// Entries of one of a SandboxDetail's network lists (allowOut, denyOut) at most.
inline constexpr std::size_t max_network_entries = 256;

// Sandbox: the reply to a create or a connect.
struct sandbox_reply {
    std::string sandbox_id;
    std::string template_id;
    std::string envd_version;
    std::string envd_access_token;  // "" when the sandbox is not secured
    std::string domain;             // "" when null: the client's domain applies
};
result<sandbox_reply> parse_sandbox_reply(std::string_view body);

// SandboxDetail and ListedSandbox (the latter has no token and no domain).
struct sandbox_detail {
    std::string sandbox_id;
    std::string template_id;
    std::string alias;
    std::chrono::system_clock::time_point started_at;
    std::chrono::system_clock::time_point end_at;
    std::string state;  // "running", "paused", ...
    std::int64_t cpu_count = 0;
    std::int64_t memory_mb = 0;
    std::int64_t disk_size_mb = 0;
    std::map<std::string, std::string> metadata;
    std::string envd_access_token;
    std::string domain;
    // SandboxDetail only: its egress switch (nullopt when absent or null: E2B's default, which
    // is on) and the `network` object's allowOut (names, CIDRs) and denyOut (CIDRs).
    std::optional<bool> allow_internet_access;
    std::vector<std::string> allow_out;
    std::vector<std::string> deny_out;
    // True when parsed from a SandboxDetail, whose egress fields describe the sandbox (absent
    // ones meaning E2B's defaults); false for a ListedSandbox, which has none.
    bool network_reported = false;
};
result<sandbox_detail> parse_sandbox_detail(std::string_view body);
result<std::vector<sandbox_detail>> parse_sandbox_list(std::string_view body);

// The "message" of an Error body, made safe for a one-line detail (control bytes dropped, at
// most 200 bytes); nullopt when the body is not an Error.
std::optional<std::string> parse_error_message(std::string_view body);

// RFC 3339 date-time from 1970 to 2200; protocol_error otherwise.
result<std::chrono::system_clock::time_point> parse_timestamp(std::string_view text);

// The `metadata` query value of GET /v2/sandboxes for a label filter, encoded as the JS SDK does:
// "k1=v1&k2=v2" with each key and value percent-encoded twice, the whole percent-encoded once
// more. E2B's server decodes the query, then the whole value, splits it on '&' and '=', then
// decodes each key and value: this round-trips any byte. Ready to append after "metadata=".
std::string encode_metadata_filter(const std::map<std::string, std::string>& filter);

// A sandbox id as E2B mints them ([a-z0-9], optionally "-<clientID>", at most 64 bytes): only
// such ids are put into a URL path.
bool is_valid_sandbox_id(std::string_view id) noexcept;

}  // namespace moat::e2b
