// The E2B control plane's request bodies and query strings, parsed from untrusted bytes: pure
// functions, unit-tested and fuzzed (fuzz/e2b_request_fuzzer.cpp). Every parser refuses input
// over max_e2b_body_bytes and answers invalid_argument with a one-line detail naming the field.
//
// Field names and defaults are E2B's API (NewSandbox, NewSandboxV2, ConnectSandbox, the timeout
// and refresh bodies, GET /v2/sandboxes' query). Unknown fields are ignored, as E2B's server
// ignores them; fields moat cannot honour are parsed and reported, never obeyed silently
// (allow_internet_access and network may only narrow the operator's policy: see
// narrow_network in control_plane.hpp).
#pragma once

#include <moat/result.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moat::serve {

// A request body over this is refused before it is parsed (the route's cap is the same).
inline constexpr std::size_t max_e2b_body_bytes = 256 * 1024;
// Metadata and envVars entries at most, each key and value at most max_e2b_string_bytes.
inline constexpr std::size_t max_e2b_map_entries = 256;
inline constexpr std::size_t max_e2b_string_bytes = 8 * 1024;
// E2B's timeouts are whole seconds; moat's TTL ceiling bounds them.
inline constexpr std::int64_t max_e2b_timeout_seconds = 30LL * 24 * 3600;

// network.allowOut / network.denyOut: entries at most per list, bytes at most per entry.
inline constexpr std::size_t max_e2b_network_entries = 256;
inline constexpr std::size_t max_e2b_network_entry_bytes = 253;

// The lists of a create request's `network` object (its other fields are ignored).
struct network_request {
    std::vector<std::string> allow_out;
    std::vector<std::string> deny_out;
};

// POST /sandboxes (v1) and POST /v2/sandboxes.
struct create_request {
    std::string template_id;                // "" when absent (the caller defaults it to "base")
    std::optional<std::int64_t> timeout_s;  // absent: the version's default (v2 300, v1 15)
    std::map<std::string, std::string> metadata;
    std::map<std::string, std::string> env_vars;
    bool auto_pause = false;
    std::optional<bool> secure;
    std::optional<bool> allow_internet_access;
    std::optional<network_request> network;
};
result<create_request> parse_create_request(std::string_view body);

// POST /sandboxes/{id}/timeout: {"timeout": <s, >= 0>} (required).
result<std::int64_t> parse_timeout_request(std::string_view body);
// POST /sandboxes/{id}/connect and /v2/.../connect: {"timeout"?: s}; an empty body is {}.
result<std::optional<std::int64_t>> parse_connect_request(std::string_view body);
// POST /sandboxes/{id}/refreshes: {"duration"?: 0..3600 s}; an empty body is {}.
result<std::optional<std::int64_t>> parse_refresh_request(std::string_view body);

// Percent-decoding as Go's url.QueryUnescape: "+" is a space, "%XY" a byte; a malformed escape
// is invalid_argument.
result<std::string> query_unescape(std::string_view text);
// The query's parameters, names and values decoded once (as Go's url.ParseQuery); a repeated
// name keeps its first value. invalid_argument for a malformed escape.
result<std::map<std::string, std::string>> parse_query(std::string_view query);

// GET /v2/sandboxes' `metadata` value (already decoded once with the query) as E2B's server
// reads it: decoded again, split on '&' then each pair on '=' (exactly two parts), each key and
// value decoded a third time. The SDK encodes {user:'a b&c=d'} to match exactly this.
result<std::vector<std::pair<std::string, std::string>>> parse_metadata_filter(
    std::string_view value);

// RFC 3339 date-time ("2026-12-01T14:40:11.123Z", "...+02:00") from 1970 to 2200 (the clock's
// range, with room); invalid_argument otherwise.
result<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view text);
// UTC with milliseconds: "2026-12-01T14:40:11.123Z".
std::string format_rfc3339(std::chrono::system_clock::time_point t);

// base64url without padding, and its inverse (nullopt for a character outside the alphabet).
std::string base64url_encode(std::string_view bytes);
std::optional<std::string> base64url_decode(std::string_view text);

}  // namespace moat::serve
