// The Connect protocol's wire forms, as the HTTP layer sends and receives them with the JSON codec:
//
// - Streaming bodies (Content-Type application/connect+json) are a sequence of envelopes, each a
//   5-byte prefix [flags: u8][length: u32 big-endian] and `length` bytes of payload. Flag 0x02
//   marks the last envelope, the end-stream message: a JSON object `{}` or
//   `{"error":{"code":"not_found","message":"..."},"metadata":{"key":["value"]}}`. Flag 0x01 means
//   the payload is compressed; moat never negotiates compression, so a compressed envelope is a
//   protocol_error (as connect-web refuses it). Other flag bits are reserved: protocol_error.
// - Unary calls (Content-Type application/json) carry the message itself; an error is a non-200
//   status with the body `{"code":"not_found","message":"..."}`.
// - A Connect error code has a fixed HTTP status (the server side) and, when a response carries no
//   code, the status implies one (the client side); both tables are the Connect protocol's.
//
// Everything here is a pure function over bytes or a small state machine (envelope_decoder): no
// I/O, unit-tested and fuzzed (fuzz/connect_envelope_fuzzer.cpp).
#pragma once

#include <moat/errc.hpp>
#include <moat/result.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat::http::connect {

// The Connect error codes, numbered as in gRPC (the Connect protocol names them in snake_case).
enum class code : int {
    canceled = 1,
    unknown = 2,
    invalid_argument = 3,
    deadline_exceeded = 4,
    not_found = 5,
    already_exists = 6,
    permission_denied = 7,
    resource_exhausted = 8,
    failed_precondition = 9,
    aborted = 10,
    out_of_range = 11,
    unimplemented = 12,
    internal = 13,
    unavailable = 14,
    data_loss = 15,
    unauthenticated = 16,
};

// "not_found". Every enumerator has a name.
std::string_view to_string(code c) noexcept;
// The code a name denotes, or nullopt for a name the protocol does not define.
std::optional<code> code_from_string(std::string_view name) noexcept;

// The HTTP status a server sends with an error of this code (canceled 499, unknown 500,
// invalid_argument 400, deadline_exceeded 504, not_found 404, already_exists 409,
// permission_denied 403, resource_exhausted 429, failed_precondition 400, aborted 409,
// out_of_range 400, unimplemented 501, internal 500, unavailable 503, data_loss 500,
// unauthenticated 401).
int http_status(code c) noexcept;
// The code a client infers from a non-200 status when the body names none: 400 internal,
// 401 unauthenticated, 403 permission_denied, 404 unimplemented, 429/502/503/504 unavailable,
// anything else unknown.
code code_from_http_status(int status) noexcept;

// A Connect error as moat reports it. canceled → cancelled, deadline_exceeded → deadline_exceeded,
// invalid_argument / already_exists / failed_precondition / out_of_range → invalid_argument,
// not_found → file_not_found (a caller that knows the RPC names the missing thing itself),
// permission_denied → permission_denied, resource_exhausted → rate_limited, unimplemented →
// not_supported, unauthenticated → unauthorized, and unknown / aborted / internal / unavailable /
// data_loss → backend_failure (retryable).
errc to_errc(code c) noexcept;
// The Connect code a server reports for a moat error (the inverse where one exists: cancelled →
// canceled, deadline_exceeded → deadline_exceeded, invalid_argument / invalid_path /
// is_directory / too_large → invalid_argument, sandbox_not_found / file_not_found → not_found,
// permission_denied → permission_denied, limit_exceeded / rate_limited → resource_exhausted,
// not_supported → unimplemented, unauthorized → unauthenticated, sandbox_unavailable /
// shutting_down / store_unavailable / connection_refused → unavailable, layer_unavailable →
// failed_precondition, backend_failure / protocol_error → internal). A code outside moat's category
// is internal.
code from_errc(std::error_code e) noexcept;

struct connect_error {
    connect::code code = connect::code::unknown;
    std::string message;  // the peer's text, as sent (may be empty)
};

// The error as a moat::error: to_errc(code), detail "connect <code>: <message>" with the message
// cut to one line of at most 200 bytes (the peer's text; it is not trusted to be short).
::moat::error to_error(const connect_error& e);

// The envelope flags.
inline constexpr std::uint8_t flag_compressed = 0x01;
inline constexpr std::uint8_t flag_end_stream = 0x02;
inline constexpr std::size_t envelope_prefix_size = 5;

struct envelope {
    std::uint8_t flags = 0;
    std::string payload;
    bool is_end_stream() const noexcept { return (flags & flag_end_stream) != 0; }
};

// Appends one envelope (prefix and payload) to `out`. The payload must be shorter than 4 GiB.
void append_envelope(std::string& out, std::uint8_t flags, std::string_view payload);
std::string encode_envelope(std::uint8_t flags, std::string_view payload);

// Splits a byte stream into envelopes as the bytes arrive, in any pieces.
//
// A frame whose announced length exceeds `max_payload` is refused as soon as its prefix is
// complete, before any of its payload is buffered, so the decoder holds at most one prefix plus
// `max_payload` bytes. After an error, or after the end-stream envelope, the decoder is finished:
// every later feed() fails (bytes after end-stream are a protocol_error).
class envelope_decoder {
  public:
    explicit envelope_decoder(std::size_t max_payload) : max_payload_(max_payload) {}

    // Consumes `bytes`, appending each completed envelope to `out`. Errors (protocol_error, the
    // detail naming what was wrong): a compressed or reserved flag, a frame over the cap, bytes
    // after the end-stream envelope.
    result<void> feed(std::string_view bytes, std::vector<envelope>& out);

    // The stream's end: fails (protocol_error) when it stops inside an envelope, or before the
    // end-stream envelope ("missing end-stream message").
    result<void> finish() const;

    bool has_ended() const noexcept { return ended_; }
    // Bytes of an incomplete envelope held now.
    std::size_t buffered() const noexcept { return buffer_.size(); }

  private:
    std::size_t max_payload_;
    std::string buffer_;        // the prefix so far, then the payload so far
    std::uint8_t flags_ = 0;    // of the envelope being read, once its prefix is complete
    std::size_t expected_ = 0;  // its payload length, once its prefix is complete
    bool have_prefix_ = false;
    bool ended_ = false;  // the end-stream envelope was read
    std::optional<::moat::error> failed_;
};

// The end-stream message.
struct end_stream {
    std::optional<connect_error> error;
    std::map<std::string, std::vector<std::string>> metadata;  // trailers; usually empty
};

// Parses an end-stream payload. protocol_error when it is not a JSON object, when "error" is not
// an object with a string "code" the protocol defines, or when "metadata" is not an object of
// string arrays. Unknown fields (and "details") are ignored.
result<end_stream> parse_end_stream(std::string_view json);
// `{}`, or the error and metadata as JSON.
std::string encode_end_stream(const end_stream& message);

// The error of a unary call's non-200 response. The body's `code` and `message` when it is a JSON
// object naming a defined code; otherwise the code implied by the status (code_from_http_status)
// and an empty message. Never fails: a garbage body still yields an error for the status.
connect_error parse_unary_error(int http_status, std::string_view body);
// `{"code":"not_found","message":"..."}`.
std::string encode_unary_error(const connect_error& e);

}  // namespace moat::http::connect
