// The Connect protocol (JSON codec) as envd's services answer it, shared by the process and
// filesystem services. The wire forms are http/connect_envelope.hpp's:
//
// - unary: the request body is the JSON message (application/json); the answer is 200 with the
//   JSON message, or the error's HTTP status with {"code":"not_found","message":"..."};
// - server streams: the request body is one enveloped JSON message (application/connect+json);
//   the answer is 200 application/connect+json, one envelope per message, flushed as written,
//   then the end-stream envelope ({} or {"error":{...}}). An error before any message is sent
//   the same way (200 and an end-stream error), as envd does.
//
// Every function here is confined to the server's executor; the result<void> of a send is the
// connection's (a client that went away: backend_failure; one that stopped reading:
// deadline_exceeded) and means "stop streaming".
#pragma once

#include "http/connect_envelope.hpp"
#include "http/server.hpp"

#include <moat/result.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace moat::serve {

inline constexpr std::string_view connect_json = "application/json";
inline constexpr std::string_view connect_stream_json = "application/connect+json";

// The largest request message a service accepts (a SendInput chunk, a path): 1 MiB.
inline constexpr std::size_t max_connect_request_bytes = 1024 * 1024;

// A unary request's JSON message (the whole body, up to `cap`). Errors: too_large,
// protocol_error and the connection's errors (server_request::async_read_body).
asio::awaitable<result<std::string>> async_read_unary_request(
    http::server_request& request, std::size_t cap = max_connect_request_bytes);
// A server-stream request's one message (the payload of its single envelope). protocol_error
// when the body is not exactly one envelope (the end-stream envelope may follow it).
asio::awaitable<result<std::string>> async_read_stream_request(
    http::server_request& request, std::size_t cap = max_connect_request_bytes);

// 200 application/json with `json`.
asio::awaitable<result<void>> async_send_unary(http::server_response& response, std::string json);
// A unary Connect error: the code's HTTP status and {"code":...,"message":...}.
asio::awaitable<result<void>> async_send_unary_error(http::server_response& response,
                                                     http::connect::code code,
                                                     std::string_view message);

// A server stream's response. Begin once, send messages, end once (with or without an error).
class connect_stream {
  public:
    explicit connect_stream(http::server_response& response) : response_(&response) {}

    // 200 application/connect+json. Idempotent (send and end begin when needed).
    asio::awaitable<result<void>> async_begin();
    // One envelope with `json`.
    asio::awaitable<result<void>> async_send(std::string_view json);
    // The end-stream envelope: {} or the error, then the end of the response.
    asio::awaitable<result<void>> async_end();
    asio::awaitable<result<void>> async_end(http::connect::code code, std::string_view message);

    // Cuts the started stream off (http::server_response::abort) instead of ending it: envd's
    // answer when its sandbox dies under a stream, whose client then asks whether the sandbox
    // still runs. Begins the stream first if needed.
    asio::awaitable<void> async_abort();

    bool is_ended() const noexcept { return ended_; }

  private:
    asio::awaitable<result<void>> async_finish(std::string payload);
    http::server_response* response_;
    bool begun_ = false;
    bool ended_ = false;
};

// Connect-Timeout-Ms of the request, when present and a valid number of milliseconds
// (1 to 10 digits); nullopt when absent or malformed.
std::optional<std::chrono::milliseconds> connect_timeout(const http::server_request& request);
// The longest keep-alive period a client may ask for. envd takes any whole number of seconds
// its clock can hold (the SDKs send 50); an hour is past any proxy's idle timeout, and a client
// that asks for more wants few keep-alives, which one an hour still is.
inline constexpr std::chrono::seconds max_keepalive_interval{3600};

// Keepalive-Ping-Interval of the request (keepalive_interval) or a value of it
// (parse_keepalive_interval, pure): whole seconds, digits only, at least 1; a larger number than
// max_keepalive_interval (any count of digits) is max_keepalive_interval. nullopt when absent,
// zero or not digits (a sign, a fraction, spaces): the caller's default (envd's 90 s), as envd.
std::optional<std::chrono::seconds> keepalive_interval(const http::server_request& request);
std::optional<std::chrono::seconds> parse_keepalive_interval(std::string_view value);

}  // namespace moat::serve
