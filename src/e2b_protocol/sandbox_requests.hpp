// What a client sends E2B's control plane: the create body (NewSandbox, NewSandboxV2), the
// timeout, connect and refresh bodies, and GET /v2/sandboxes' query with its label filter. Each
// has one struct, one writer (the e2b backend's client sends it) and one parser (moat serve reads
// it), unit-tested in tests/e2b_protocol_test.cpp and fuzzed (fuzz/e2b_request_fuzzer.cpp).
//
// The parsers read untrusted bytes: a body over max_request_body_bytes is refused before it is
// parsed, unknown fields are ignored (as E2B's server ignores them), and every failure is
// errc::invalid_argument (a bad request: moat serve answers 400 with it) whose one-line detail
// names the field, never its value. Fields moat cannot honour are parsed and reported, never
// obeyed silently (allow_internet_access and network may only narrow the operator's policy: see
// narrow_network in serve/control_plane.hpp).
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

namespace moat::e2b_protocol {

// A request body over this is refused before it is parsed (moat serve's route cap is the same).
inline constexpr std::size_t max_request_body_bytes = 256 * 1024;
// Metadata and envVars entries at most, each key and value at most max_string_bytes.
inline constexpr std::size_t max_map_entries = 256;
inline constexpr std::size_t max_string_bytes = 8 * 1024;
// E2B's timeouts are whole seconds; moat's TTL ceiling bounds them.
inline constexpr std::int64_t max_timeout_seconds = 30LL * 24 * 3600;
// A refresh extends by at most an hour.
inline constexpr std::int64_t max_refresh_seconds = 3600;
// network.allowOut / network.denyOut: entries at most per list, bytes at most per entry.
inline constexpr std::size_t max_network_entries = 256;
inline constexpr std::size_t max_network_entry_bytes = 253;

// A sandbox id as E2B mints them ([a-z0-9], optionally "-<clientID>", at most 64 bytes): only
// such ids are put into a URL path.
bool is_valid_sandbox_id(std::string_view id) noexcept;

// A create request's `network` object (its other fields are ignored): domain names (and address
// rules) in allowOut, CIDRs in denyOut, and whether the sandbox's ports are public.
struct network_request {
    std::vector<std::string> allow_out;
    std::vector<std::string> deny_out;
    // absent: the server's default (E2B's is public); false: every port request must carry the
    // sandbox's trafficAccessToken.
    std::optional<bool> allow_public_traffic;
    // The Host header every port request carries into the sandbox ("${PORT}" replaced by the
    // port); absent: the client's own. Visible ASCII without spaces, at most
    // max_mask_request_host bytes.
    std::optional<std::string> mask_request_host;
};
inline constexpr std::size_t max_mask_request_host = 255;

// POST /sandboxes (v1) and POST /v2/sandboxes. The writer writes templateID, timeout (when set),
// metadata and envVars (always), autoPause (when true), autoResume ({"enabled": ...}),
// allow_internet_access, network and secure (when set); v2 is always secured, v1 mints an access
// token only with "secure": true.
struct create_request {
    std::string template_id;                // "" when absent (moat serve defaults it to "base")
    std::optional<std::int64_t> timeout_s;  // absent: the version's default (v2 300, v1 15)
    std::map<std::string, std::string> metadata;
    std::map<std::string, std::string> env_vars;
    bool auto_pause = false;
    // autoResume.enabled: traffic to the paused sandbox resumes it (absent: off, E2B's default).
    std::optional<bool> auto_resume;
    std::optional<bool> secure;
    std::optional<bool> allow_internet_access;  // absent: E2B's default, which is on
    std::optional<network_request> network;
};
std::string encode_create_request(const create_request& request);
result<create_request> parse_create_request(std::string_view body);

// PUT /sandboxes/{id}/network (SandboxNetworkUpdateConfig): a running sandbox's whole new egress
// configuration, every field omitted cleared. allowOut and denyOut as a create's network (same
// caps); allow_internet_access as a create's. egressProxy and rules are ignored (moat serve has
// neither). The writer writes each list when not empty and the switch when set.
struct network_update_request {
    network_request network;  // allow_public_traffic is not part of an update
    std::optional<bool> allow_internet_access;
};
std::string encode_network_update_request(const network_update_request& request);
result<network_update_request> parse_network_update_request(std::string_view body);

// POST /sandboxes/{id}/timeout: {"timeout": <s, >= 0>} (required).
std::string encode_timeout_request(std::int64_t timeout_s);
result<std::int64_t> parse_timeout_request(std::string_view body);
// POST /sandboxes/{id}/connect and /v2/.../connect: {"timeout"?: s}; an empty body is {}.
std::string encode_connect_request(std::optional<std::int64_t> timeout_s);
result<std::optional<std::int64_t>> parse_connect_request(std::string_view body);
// POST /sandboxes/{id}/refreshes: {"duration"?: 0..3600 s}; an empty body is {}.
std::string encode_refresh_request(std::optional<std::int64_t> duration_s);
result<std::optional<std::int64_t>> parse_refresh_request(std::string_view body);

// --- queries ---

// Percent-decoding as Go's url.QueryUnescape: "+" is a space, "%XY" a byte; a malformed escape
// is invalid_argument.
result<std::string> query_unescape(std::string_view text);
// A query's parameters, names and values decoded once (as Go's url.ParseQuery, which E2B's
// servers, the control plane and envd, read queries with); a repeated name keeps its first value.
// invalid_argument for a malformed escape.
result<std::map<std::string, std::string>> parse_query(std::string_view query);

// GET /v2/sandboxes' `metadata` label filter. The writer encodes as the JS SDK does: "k1=v1&k2=v2"
// with each key and value percent-encoded twice, the whole percent-encoded once more (ready to
// follow "metadata="). The parser reads the value (already decoded once with the query) as E2B's
// server does: decoded again, split on '&' then each pair on '=' (exactly two parts), each key
// and value decoded a third time. Together they round-trip any byte.
std::string encode_metadata_filter(const std::map<std::string, std::string>& filter);
result<std::vector<std::pair<std::string, std::string>>> parse_metadata_filter(
    std::string_view value);

// GET /v2/sandboxes (and GET /sandboxes, whose only parameter is the filter): what to list.
struct list_request {
    std::vector<std::pair<std::string, std::string>> metadata;  // exact matches, all of them
    std::string state;                 // "" (any), or states joined by ',': "running", "paused"
    std::string order;                 // "" (the server's: desc), "asc" or "desc" (by start time)
    std::optional<std::size_t> limit;  // a page's size; the parser clamps it to 1..100
    std::string template_id;           // "": any
    std::optional<std::chrono::system_clock::time_point> started_after;
    std::string next_token;  // the X-Next-Token of the previous page, opaque; "" for the first
};
// The query string (without '?'), the parameters in the order above, each only when set.
std::string encode_list_request(const list_request& request);
// `paged` false (GET /sandboxes): only the metadata filter is read.
result<list_request> parse_list_request(std::string_view query, bool paged);

// --- values ---

// RFC 3339 date-time ("2026-12-01T14:40:11.123Z", "...+02:00") from 1970 to 2200 (core/rfc3339);
// invalid_argument otherwise.
result<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view text);
// UTC with milliseconds, as E2B writes its times: "2026-12-01T14:40:11.123Z".
std::string format_rfc3339(std::chrono::system_clock::time_point t);

}  // namespace moat::e2b_protocol
