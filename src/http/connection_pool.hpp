// The HTTP client's connections and their keep-alive pool.
//
// A client_connection is one TCP (or TLS over TCP) connection to one origin. Its I/O never throws
// and is bounded by a watchdog: arm(limit) starts a timer for the current exchange, and when it
// fires the connection is closed, so whatever step is pending (resolve, connect, handshake, a
// read or a write) completes at once and reports timed_out(). A timed-out connection is never
// reused.
//
// The connection_pool keeps, per origin (scheme, host, port), at most `max_per_origin` live
// connections (busy or idle). A request that finds none idle and the origin at its cap waits for
// one to be given back, within its deadline. An idle connection is checked before reuse: one the
// peer closed, one with unexpected bytes waiting, or one idle longer than `idle_timeout` is closed
// instead. Confined to one executor; no locks.
#pragma once

#include <moat/deadline.hpp>
#include <moat/result.hpp>

#include "http/tls.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace moat::http {

struct origin {
    bool is_tls = false;
    std::string host;  // a name or an IP literal, without brackets
    std::uint16_t port = 0;

    // "https://example.com:443", for pool keys and error details (never carries credentials).
    std::string to_string() const;
    friend bool operator==(const origin&, const origin&) = default;
};

// A loopback address or the name "localhost".
bool is_loopback_host(std::string_view host);

class client_connection : public std::enable_shared_from_this<client_connection> {
  public:
    // `tls` is the client context for an https origin, null for http.
    client_connection(asio::any_io_executor executor, origin where,
                      std::shared_ptr<asio::ssl::context> tls);
    ~client_connection();
    client_connection(const client_connection&) = delete;
    client_connection& operator=(const client_connection&) = delete;

    // Resolves, connects and (for https) completes the TLS handshake, within the armed deadline.
    // When `loopback_only`, only loopback addresses the name resolves to are dialled. Errors:
    // deadline_exceeded (the step named), backend_failure (refused, unreachable, reset: retryable),
    // invalid_argument (the name does not resolve, or to no loopback address when required), and
    // for TLS backend_failure "TLS handshake with <origin>: certificate verify failed: ...".
    asio::awaitable<result<void>> async_open(bool loopback_only);

    // Starts the watchdog for an exchange (re-arming replaces the previous deadline); disarm()
    // stops it. Never blocks.
    void arm(deadline limit);
    void disarm();
    bool timed_out() const noexcept { return timed_out_; }

    // Reads what is available into `into` (at least one byte unless it fails). EOF is
    // asio::error::eof (and, over TLS, a close without close_notify ssl::error::stream_truncated).
    asio::awaitable<std::tuple<std::error_code, std::size_t>> async_read_some(
        asio::mutable_buffer into);
    // Writes all of `buffers` (empty ones are skipped).
    asio::awaitable<std::error_code> async_write(std::array<asio::const_buffer, 3> buffers);

    // Closes at once (no TLS close_notify: HTTP framing, not the TLS close, ends a message).
    void close() noexcept;
    bool is_open() const noexcept;
    // An idle connection that may be reused: open, not timed out, nothing from the peer waiting,
    // the peer has not closed it.
    bool is_reusable_idle() const noexcept;

    const origin& where() const noexcept { return origin_; }
    std::chrono::steady_clock::time_point idle_since{};

  private:
    asio::ip::tcp::socket& socket() noexcept;

    asio::any_io_executor executor_;
    origin origin_;
    std::shared_ptr<asio::ssl::context> tls_context_;
    asio::ip::tcp::resolver resolver_;
    asio::ip::tcp::socket plain_;
    std::unique_ptr<tls_stream> tls_;
    asio::steady_timer watchdog_;
    std::uint64_t generation_ = 0;
    bool timed_out_ = false;
};

struct pool_options {
    std::size_t max_per_origin = 16;
    std::chrono::milliseconds idle_timeout{30'000};
};

class connection_pool : public std::enable_shared_from_this<connection_pool> {
  public:
    connection_pool(asio::any_io_executor executor, pool_options options);
    ~connection_pool();

    // A connection given out by acquire(); give it back with release().
    struct lease {
        std::shared_ptr<client_connection> connection;
        bool is_reused = false;  // an idle connection from the pool (already open)
    };

    // An idle connection to `where`, or a new unopened one when the origin is under its cap, or
    // (at the cap) the next one released, within `limit`. deadline_exceeded when the limit passes
    // first; cancelled on the caller's cancellation.
    asio::awaitable<result<lease>> async_acquire(const origin& where,
                                                 std::shared_ptr<asio::ssl::context> tls,
                                                 deadline limit);
    // Gives a connection back: kept idle when `reusable` (and still open), else closed. Wakes one
    // waiter for that origin either way.
    void release(std::shared_ptr<client_connection> connection, bool reusable) noexcept;

    // Closes every idle connection (busy ones close when released).
    void close_idle() noexcept;

    // Connections made since the pool was (for tests and benchmarks).
    std::uint64_t connections_opened() const noexcept { return opened_; }
    std::size_t idle_count() const noexcept;

  private:
    struct waiter {
        asio::steady_timer* timer;
        bool woken = false;
    };
    struct per_origin {
        std::vector<std::shared_ptr<client_connection>> idle;
        std::size_t live = 0;
        std::vector<waiter*> waiters;  // oldest first; woken by cancelling their timer
    };
    static void wake_one(per_origin& slot) noexcept;
    per_origin& slot(const origin& where);

    asio::any_io_executor executor_;
    pool_options options_;
    std::map<std::string, per_origin> origins_;
    std::uint64_t opened_ = 0;
};

}  // namespace moat::http
