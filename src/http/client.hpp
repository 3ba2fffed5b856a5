// moat's HTTP/1.1 client: keep-alive connections pooled per origin, TLS verified by default,
// bodies streamed both ways, every step bounded by the caller's deadline, every response bounded.
//
//     http::client client(executor, options);
//     http::request req;
//     req.method = "POST";
//     req.url = "https://api.example.com/v2/sandboxes";
//     req.headers.add("X-API-Key", key);
//     req.body = R"({"templateID":"base"})";
//     req.limit = deadline::after(10s);
//     auto r = co_await client.async_fetch(std::move(req), 1 << 20);   // status, headers, body
//
// or, streaming: `auto r = co_await client.async_send(req)` returns once the response head is in;
// then `co_await r->async_read_some()` yields the body piece by piece (an empty piece at its end).
// The client reads the socket only when the caller asks for the next piece, so a caller that stops
// reading stops the server (TCP flow control): backpressure without a buffer in between.
//
// Policy:
// - The deadline (request::limit) bounds every step: waiting for a pooled connection, resolving,
//   connecting, the TLS handshake, writing the request, reading the response head, and every body
//   read after async_send returned. When it passes, the step completes with deadline_exceeded
//   (naming the step) and the connection is closed, never reused.
// - Redirects are not followed: a 3xx is returned to the caller like any status, so credentials
//   are never re-sent to another origin.
// - Plain http:// only to loopback (localhost, 127.0.0.0/8, ::1; a name must also resolve only to
//   loopback addresses) unless the caller opts the host in by name (client_options).
// - Caps: the response head (64 KiB by default; past it protocol_error), a unary body
//   (async_fetch's max_body_bytes or async_read_body's cap: protocol_error), and streamed frames
//   (connect::envelope_decoder's cap, applied by the caller).
// - The client sets the framing headers itself (Host unless given, Content-Length or
//   Transfer-Encoding: chunked); a caller's Content-Length, Transfer-Encoding or Connection header
//   is refused (invalid_argument), so a caller cannot desynchronise the connection.
// - Errors: deadline_exceeded; cancelled; backend_failure (retryable) for a refused, reset or
//   closed connection and for TLS failures ("TLS handshake with https://h:443: certificate verify
//   failed: unknown CA" / "... host name mismatch" / "... expired"); protocol_error for a response
//   that breaks HTTP/1.1 or a cap; invalid_argument for a bad URL or a refused plain-http host.
//   Details name the origin, the method and the path, never a query string or a header value:
//   no credential (Authorization, X-API-Key, X-Access-Token, a token in a query) reaches an error
//   or a log line.
// - Connections are pooled per origin by http::connection_pool (connection_pool.hpp): short calls
//   and streams (request::is_stream) have separate budgets, idle connections are closed after
//   idle_timeout by a sweep, and an origin with nothing busy, idle or waiting keeps no state.
// - A pooled connection the server closed while idle is detected before reuse; a request that
//   fails on a reused connection before any response byte arrived is retried once on a new one
//   when it is idempotent (GET, HEAD, PUT, DELETE, OPTIONS) and its body is not streamed.
//
// Per-operation cancellation: cancelling async_send / async_fetch / a body read (terminal or
// partial) closes the connection in use and completes with errc::cancelled.
//
// Confined to one executor. A response may outlive the client object: the pool is shared.
#pragma once

#include <moat/deadline.hpp>
#include <moat/result.hpp>

#include "http/message.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat::http {

class connection_pool;
class client_connection;
class message_parser;

struct client_options {
    // Live connections (busy or idle) per origin; a request past it waits for one (its deadline
    // bounds the wait).
    std::size_t max_connections_per_origin = 16;
    // Busy streams (requests with request::is_stream) per origin: their own budget, so streams
    // never hold a connection a short call needs.
    std::size_t max_streams_per_origin = 256;
    // An idle connection older than this is closed: before reuse, and by the pool's sweep even
    // when its origin is not used again.
    std::chrono::milliseconds idle_timeout{30'000};
    // The response's status line and headers.
    std::size_t max_head_bytes = 64 * 1024;
    // Host names (exactly as in the URL) that may be reached over plain http:// although they
    // are not loopback.
    std::vector<std::string> plain_http_hosts;
    // TLS trust: the system CA store and/or a PEM file of CAs.
    bool use_system_ca_store = true;
    std::string ca_file;
};

// The next piece of a streamed request body; an empty string ends the body. An error aborts the
// request (the connection is closed) and is what async_send returns.
using body_producer = std::function<asio::awaitable<result<std::string>>()>;

struct request {
    std::string method = "GET";
    std::string url;  // http://host[:port]/path?query or https://...; no user:password@
    header_list headers;
    std::string body;           // sent with Content-Length (when body_stream is empty)
    body_producer body_stream;  // when set: the body, sent chunked
    deadline limit;             // bounds the whole exchange, body reads included
    // A long-lived exchange (a command's output stream, a file read or written at the caller's
    // pace): its connection counts against max_streams_per_origin, not the short-call cap.
    bool is_stream = false;
};

struct parsed_url {
    bool is_tls = false;
    std::string host;  // without brackets
    std::uint16_t port = 0;
    std::string target;  // "/path?query", "/" when the URL has none
};

// Parses an absolute http(s) URL. invalid_argument for another scheme, user info, a bad port, an
// empty host, or bytes that cannot appear in a request target.
result<parsed_url> parse_url(std::string_view url);

// A non-2xx status as a moat error, for callers that treat one as a failure: 401 → unauthorized,
// 429 → rate_limited (retry_after from a delta-seconds Retry-After, also written at the end of the
// detail as "retry after <N> s"), 403 → permission_denied, 404 → file_not_found, 413 → too_large,
// other 4xx → invalid_argument, 5xx and anything else → backend_failure. The detail is
// "<what>: HTTP <status>" (plus the retry hint): `what` is the caller's, and no header value but
// Retry-After's number is read.
struct status_error {
    ::moat::error error;
    std::optional<std::chrono::seconds> retry_after;
};
status_error error_for_status(int status, const header_list& headers, std::string_view what);

// Retry-After as delta-seconds (an HTTP date, a negative or absurd value: nullopt).
std::optional<std::chrono::seconds> parse_retry_after(const header_list& headers);

namespace detail {
struct exchange;
}

// A response whose head has arrived. Its body is read with async_read_some or async_read_body;
// destroying it before the body ended closes the connection (it is not reused).
class response {
  public:
    response(response&&) noexcept;
    response& operator=(response&&) noexcept;
    ~response();

    int status() const noexcept;
    const response_head& head() const noexcept;
    const header_list& headers() const noexcept;

    // The next piece of the body, valid until the next call; empty once the body has ended (the
    // connection then goes back to the pool when keep-alive allows). Errors: deadline_exceeded,
    // cancelled, backend_failure (reset), protocol_error (truncated or malformed framing).
    asio::awaitable<result<std::string_view>> async_read_some();
    // The rest of the body, at most `max_bytes` (protocol_error past it: a declared
    // Content-Length past it fails before any body byte is read).
    asio::awaitable<result<std::string>> async_read_body(std::size_t max_bytes);

    bool has_ended() const noexcept;

  private:
    friend class client;
    explicit response(std::unique_ptr<detail::exchange> state);
    std::unique_ptr<detail::exchange> state_;
};

struct full_response {
    response_head head;
    std::string body;
    int status() const noexcept { return head.status; }
};

class client {
  public:
    client(asio::any_io_executor executor, client_options options = {});
    ~client();
    client(const client&) = delete;
    client& operator=(const client&) = delete;

    // Sends the request and returns once the response head has arrived (1xx heads are skipped).
    asio::awaitable<result<response>> async_send(request req);
    // async_send, then the whole body (at most max_body_bytes).
    asio::awaitable<result<full_response>> async_fetch(request req, std::size_t max_body_bytes);

    // Closes the idle connections to the origin of `url` (http(s)://host[:port], any path) and
    // forgets it: its busy connections close when their exchange ends. For an origin that is
    // gone for good (a destroyed sandbox's envd). A bad URL is ignored.
    void drop_origin(std::string_view url) noexcept;

    // Connections opened so far, connections idle in the pool now, and origins the pool holds
    // state for (something busy, idle or waiting) (tests, benchmarks).
    std::uint64_t connections_opened() const noexcept;
    std::size_t idle_connections() const noexcept;
    std::size_t origins_held() const noexcept;

  private:
    asio::awaitable<result<response>> send(request req);
    asio::awaitable<result<full_response>> fetch(request req, std::size_t max_body_bytes);

    struct state;
    std::shared_ptr<state> state_;
};

}  // namespace moat::http
