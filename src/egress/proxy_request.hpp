// The egress proxy's request parser (pure; untrusted bytes from the sandbox; fuzzed by
// fuzz/egress_request_fuzzer.cpp).
//
// Two request shapes are accepted:
//   CONNECT host:port HTTP/1.1          a tunnel (authority form, port required, [v6] allowed)
//   GET http://host[:port]/path HTTP/1.1  plain HTTP in absolute form (any method, port 80 default)
// Everything else is refused with a 4xx status and a one-line reason that never echoes request
// bytes: an origin-form request (not a proxy request), https:// in absolute form (use CONNECT),
// userinfo in the URL, a bad request line, header or target (400), a request line over the cap
// (414), too many or too large headers (431).
//
// A plain-HTTP request is rewritten for the upstream: origin-form target, Host set to the
// target's authority, the hop-by-hop headers (Connection, Keep-Alive, Proxy-*, TE, Upgrade)
// dropped and `Connection: close` added, so one proxied connection carries exactly one request to
// the one checked address. The request body (if any) is relayed as bytes after the head.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moat::egress {

struct request_caps {
    std::size_t max_request_line_bytes = 8192;
    std::size_t max_head_bytes = 32768;  // request line + headers + the blank line
    std::size_t max_headers = 100;
    std::size_t max_connect_target_bytes = 262;  // a 253-byte name, ':' and 5 digits, brackets
};

struct proxy_request {
    bool is_connect = false;
    std::string host;  // as written: a name, an IPv4 literal in any notation, or an IPv6 literal
    bool host_is_ipv6_literal = false;  // host is the text between the brackets
    std::uint16_t port = 0;
    std::string upstream_head;   // plain HTTP: the rewritten head to send; empty for CONNECT
    std::size_t head_bytes = 0;  // how much of the input the head took (the rest is body / tunnel)
};

struct parse_outcome {
    enum class state { incomplete, complete, refused } state = state::incomplete;
    proxy_request request;  // when complete
    int status = 0;         // when refused: 400, 414, 431
    std::string reason;     // when refused: one line, no request bytes
};

// Parses the bytes received so far. `incomplete` means read more (the caps are already checked
// against what is there, so an oversized head is refused as soon as it passes a cap).
parse_outcome parse_proxy_request(std::string_view buffered, const request_caps& caps = {});

// "Bad Request" for 400, ...: the reason phrase for the statuses the proxy answers with.
const char* status_phrase(int status) noexcept;

}  // namespace moat::egress
