// The Error body E2B's control plane and envd answer alike, {"code":<status>,"message":"..."}:
// one struct, one writer, one parser, and the two ways a client makes its message safe for a
// one-line error detail. Unit-tested in tests/e2b_protocol_test.cpp and fuzzed
// (fuzz/e2b_response_fuzzer.cpp, fuzz/envd_response_fuzzer.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moat::e2b_protocol {

// The most of an Error body the control plane's message is read from.
inline constexpr std::size_t max_error_body_bytes = 16 * 1024;

// {"code":<int>,"message":"..."}; envd's proxy adds "sandboxId" to its 502 (written when set).
struct error_body {
    std::int64_t code = 0;
    std::string message;
    std::optional<std::string> sandbox_id;
};
std::string encode_error_body(const error_body& body);
// The body as an Error; nullopt when it is not one (not JSON, no string "message").
std::optional<error_body> parse_error_body(std::string_view body);
// The control plane's "message", made safe for a one-line detail (control bytes dropped, at
// most 200 bytes, then "..."); nullopt when the body is not an Error or is over
// max_error_body_bytes.
std::optional<std::string> parse_error_message(std::string_view body);
// envd's message (/files), cut to its first line of at most 200 bytes (control bytes become
// spaces); "" when the body is not an Error.
std::string parse_envd_error_message(std::string_view body);

}  // namespace moat::e2b_protocol
