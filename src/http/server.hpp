// The HTTP/1.1 server: many concurrent keep-alive connections on one executor, routed by method
// and path to coroutine handlers, request bodies streamed to the handler with backpressure and
// responses either unary or streamed (chunked, flushed per frame). Bounded everywhere; see
// server_options. docs/architecture.md ("The HTTP layer") has the picture.
//
//     http::server s(io.get_executor(), options);
//     s.route("GET", "/sandboxes/{id}", get_sandbox);      // handler(server_request&,
//     server_response&) auto endpoint = s.start();                           //
//     result<tcp::endpoint>
//     ...
//     co_await s.async_stop(std::chrono::seconds(5));      // graceful: in-flight requests finish
//
// A HEAD request with no HEAD route runs the GET route; the server sends its head only.
//
// A handler pulls the body piece by piece (async_read_some): while it does not ask, the server
// does not read the socket, so the client's sends block (backpressure). It answers once with
// async_send(), or streams: async_begin(), async_write() per frame (each written and flushed
// before it returns: at most one frame is buffered per connection), async_end(). A handler that
// returns without answering gets a 500; one that throws is logged and its connection closed.
//
// What the server answers itself, always with a JSON body {"code":<status>,"message":"..."}:
// 400 malformed request (and the connection closes: framing is lost), 404 no route, 405 wrong
// method (with Allow), 413 body past the route's cap, 421 a Host this server does not serve, 400
// no Host on HTTP/1.1, 431 head past 64 KiB or too many headers, 501 CONNECT, 505 HTTP/2 or 0.9,
// 503 past the connection cap (then closed). A peer past a deadline is disconnected without an
// answer. Header values are never logged or put in an error (credentials live there).
//
// Confined to its executor: construct, route, start and stop it from that executor (the
// io_context may run on one thread, or pass a strand). Handlers run on it too.
#pragma once

#include "http/message.hpp"
#include "http/message_parser.hpp"
#include "http/stream.hpp"

#include <moat/result.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat::http {

class server_connection;
class path_params;

// Turns an accepted socket into the stream the connection runs over: empty means plain TCP. For
// TLS, make_tls_stream_factory (tls_server_stream.hpp) performs the handshake, bounded by
// `deadline` (the head deadline); an error closes that connection.
using stream_factory = std::function<asio::awaitable<result<std::unique_ptr<stream>>>(
    asio::ip::tcp::socket socket, std::chrono::steady_clock::time_point deadline)>;

struct server_options {
    asio::ip::tcp::endpoint listen{asio::ip::make_address("127.0.0.1"), 0};  // port 0: any free
    // Host header values served (case-insensitive, "name" or "name:port"). Empty: on a loopback
    // listener localhost, 127.0.0.1 and [::1], with and without the bound port (DNS-rebinding
    // defence: a page on another origin that resolves to 127.0.0.1 sends its own name); on any
    // other listener every Host. A Host not served gets 421.
    std::vector<std::string> allowed_hosts;
    // When set, a Host the list above does not serve is served when this returns true (a name
    // pattern the list cannot spell: `moat serve`'s `49983-<id>.<domain>`).
    std::function<bool(std::string_view host)> accept_host;
    // Open connections at most; one more is accepted, answered 503 (best effort) and closed, so a
    // client fails fast instead of waiting in the listen backlog.
    std::size_t max_connections = 1024;
    // A connection is unauthenticated until a handler vouches for one of its requests
    // (server_request::mark_authenticated). Unauthenticated connections get a share of the
    // connections (max_unauthenticated) and a shorter idle timeout. When a new connection finds a
    // cap reached (this one or max_connections), the oldest unauthenticated connection that is idle
    // (waiting for a request, or trickling a head, for at least unauthenticated_grace, and
    // nothing of its next request waits unread) is closed to make room; if there is none, the new
    // connection is refused as past the cap. So idle clients that never authenticate cannot keep
    // others out, and one that does is limited only by max_connections (behind a proxy, every
    // client has the proxy's address). The grace lets a burst of new connections from one proxy
    // send their first requests before any of them counts as idle. A peer address that holds
    // max_unauthenticated_per_peer unauthenticated connections loses its own oldest idle one for
    // each new one it opens, so one peer's idle connections cannot crowd out another's.
    std::size_t max_unauthenticated = 256;
    std::size_t max_unauthenticated_per_peer = 64;
    std::chrono::milliseconds unauthenticated_idle_timeout{5'000};
    std::chrono::milliseconds unauthenticated_grace{1'000};
    // A connection must send a complete head within this of its first byte (or of being accepted,
    // for its first request): slowloris.
    std::chrono::milliseconds head_timeout{10'000};
    // A keep-alive connection with no request in flight is closed after this.
    std::chrono::milliseconds idle_timeout{30'000};
    // Each read of a request body (a client that stops sending mid-body) and each write (a client
    // that stops reading: the socket buffer fills and the write never completes) must finish
    // within these, or the connection is dropped.
    std::chrono::milliseconds body_read_timeout{30'000};
    std::chrono::milliseconds write_timeout{30'000};
    parser_limits limits;  // head 64 KiB, header count
    // The body cap of a route that does not give its own.
    std::uint64_t default_max_body_bytes = 1024 * 1024;
    // The read buffer of each connection; body pieces are at most this large.
    std::size_t read_buffer_bytes = 16 * 1024;
    stream_factory make_stream;  // empty: plain TCP
};

struct route_options {
    std::optional<std::uint64_t> max_body_bytes;  // default: server_options::default_max_body_bytes
};

// A connection a handler took over (server_request::take_over): its stream, and what the client
// sent after the head that the server had read already (the body's start, or more).
struct taken_connection {
    stream* connection = nullptr;
    std::string_view read_ahead;  // valid until the handler returns
};

// The request as a handler sees it. Valid for the handler's call.
class server_request {
  public:
    const request_head& head() const noexcept { return *head_; }
    std::string_view method() const noexcept { return head_->method; }
    std::string_view path() const noexcept { return head_->path(); }
    std::string_view query() const noexcept { return head_->query(); }
    const header_list& headers() const noexcept { return head_->headers; }
    // `{name}` of the matched route ("" when absent).
    std::string_view param(std::string_view name) const noexcept;
    // Whether a body follows the head, and its declared length (none when chunked).
    bool has_body() const noexcept;
    std::optional<std::uint64_t> content_length() const noexcept;

    // The next piece of the body: a view valid until the next call; empty at the end of the body.
    // Errors: too_large (past the route's cap: the server answers 413 unless the handler has),
    // protocol_error (malformed framing: 400), deadline_exceeded (the client stalled past
    // body_read_timeout), backend_failure (the connection broke). Sends "100 Continue" first when
    // the client asked for it. Cancellation: the connection is closed.
    asio::awaitable<result<std::string_view>> async_read_some();
    // The whole body, up to the route's cap (same errors).
    asio::awaitable<result<std::string>> async_read_body();

    // The handler authenticated this request: its connection leaves the unauthenticated share
    // (server_options::max_unauthenticated) for good.
    void mark_authenticated() noexcept;

    // Takes the connection over right after the head, for a proxy: the bytes both ways are the
    // handler's from here (the body and anything after it are in `read_ahead`, then the stream),
    // the server sends nothing more on it, no deadline of the server's runs, and the connection
    // closes when the handler returns. invalid_argument once a body read or a response started.
    result<taken_connection> take_over();

  private:
    friend class server_connection;
    server_request(server_connection& c, request_head& h, const path_params& p)
        : connection_(&c), head_(&h), params_(&p) {}
    server_connection* connection_;
    request_head* head_;
    const path_params* params_;
};

// The response a handler writes: once with async_send, or streamed.
class server_response {
  public:
    // A unary response; Content-Length is set (and Transfer-Encoding / Connection headers the
    // handler set are replaced). Errors: invalid_argument (called twice, a bad header),
    // deadline_exceeded (the client did not read within write_timeout), backend_failure.
    asio::awaitable<result<void>> async_send(int status, header_list headers, std::string body);
    // {"code":status,"message":message} as application/json.
    asio::awaitable<result<void>> async_send_error(int status, std::string_view message);

    // A streamed response: the head now (chunked), then each async_write() is one chunk, written
    // and flushed before it returns, then async_end(). Same errors as async_send.
    asio::awaitable<result<void>> async_begin(int status, header_list headers);
    asio::awaitable<result<void>> async_write(std::string_view frame);
    asio::awaitable<result<void>> async_end();
    // A started response is cut off when the handler returns: no last chunk, the connection
    // closed, so the client sees the body end early (what a peer that died mid-answer looks like).
    // Before the response started it does nothing.
    void abort() noexcept;

    bool is_started() const noexcept;

  private:
    friend class server_connection;
    explicit server_response(server_connection& c) : connection_(&c) {}
    server_connection* connection_;
};

using handler = std::function<asio::awaitable<void>(server_request&, server_response&)>;

struct server_stats {
    std::uint64_t accepted = 0;
    std::uint64_t refused_over_cap = 0;  // accepted past a cap and closed (503)
    std::uint64_t evicted = 0;           // idle unauthenticated connections closed for a newer one
    std::uint64_t requests = 0;          // heads routed to a handler or answered by the server
    std::size_t open_connections = 0;
};

class server {
  public:
    server(asio::any_io_executor executor, server_options options);
    ~server();
    server(const server&) = delete;
    server& operator=(const server&) = delete;

    // Adds a route (before start). invalid_argument for a bad pattern or method.
    result<void> route(std::string method, std::string_view pattern, handler h,
                       route_options options = {});
    // Sends every request `matches` accepts to `h`, whatever its method and path, ahead of the
    // routes (before start; one interceptor per server). No body cap applies: the handler takes
    // the connection over (a proxy) or answers. `matches` sees the head only, after the Host
    // check.
    void intercept(std::function<bool(const request_head&)> matches, handler h);

    // Binds, listens and starts accepting; the bound endpoint (its port, when 0 was asked).
    // backend_failure when the address cannot be bound.
    result<asio::ip::tcp::endpoint> start();

    // Graceful stop: stops accepting, closes connections with no request in flight, lets
    // in-flight requests finish (their responses say Connection: close) for up to `grace`, then
    // closes what is left (handlers are cancelled) and completes when every connection is gone.
    // Cancellation: none (it is itself the bounded shutdown).
    asio::awaitable<void> async_stop(std::chrono::milliseconds grace);

    server_stats stats() const noexcept;

    struct state;  // implementation detail (server_state.hpp)

  private:
    std::shared_ptr<state> state_;
};

}  // namespace moat::http
