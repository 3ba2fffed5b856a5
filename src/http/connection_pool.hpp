// Connections and their keep-alive pool: one pool for every client in moat (the HTTP client's
// connections per origin, the Redis client's connections to its one server).
//
// A pooled_connection is anything the pool can judge and close: is_reusable() (checked without
// blocking: open, not timed out, the peer has not closed it, nothing unasked waiting) and close().
// A client_connection is one TCP (or TLS over TCP) connection to one HTTP origin; its I/O never
// throws and is bounded by a watchdog: arm(limit) starts a timer for the current exchange, and
// when it fires the connection is closed, so whatever step is pending (resolve, connect,
// handshake, a read or a write) completes at once and reports timed_out(). A timed-out connection
// is never reused.
//
// The connection_pool's contract:
// - Connections are grouped by a key (an origin, "https://h:443", or any string the owner picks).
//   Per key, short calls (lease_kind::call) use at most `max_per_origin` connections, busy or
//   idle; long-lived streams (lease_kind::stream: a command's output, a file streamed at the
//   caller's pace) have their own budget of `max_streams_per_origin` busy connections, so streams
//   never hold a slot a short call needs (a kill or its confirmation never waits behind them).
//   A lease past its budget waits for one to be given back, within its deadline.
// - An idle connection is taken back by either kind. It is checked before reuse: one that is not
//   reusable or idle longer than `idle_timeout` is closed instead. One pool-wide timer also sweeps
//   the idle connections (armed only while some are idle, for the oldest one's expiry), so an
//   origin that is never used again keeps no descriptor past `idle_timeout`; while it is armed the
//   executor has work (close_idle() or destroying the pool cancels it).
// - A key's state is dropped as soon as it has nothing busy, idle or waiting; drop_origin(key)
//   closes its idle connections at once and makes its busy ones close when given back (an origin
//   that is gone for good: a destroyed sandbox's envd).
// - Waiting is cancellation-safe: a waiter is a node in an intrusive list that unlinks itself
//   when its coroutine frame is destroyed (cancelled, or the task owning it destroyed), and a
//   wake it got but did not use is passed on to the next waiter. A waiter may outlive the pool.
// Per-operation cancellation: async_acquire completes with errc::cancelled (terminal or partial).
// Confined to one executor; no locks.
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
#include <functional>
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

// A socket error in a few words ("connection refused", "connection reset", "the peer closed the
// connection", "unreachable", else the system's message), for error details.
std::string describe_socket_error(const std::error_code& ec);

// A short call (counted against max_per_origin) or a long-lived stream (its own budget).
enum class lease_kind { call, stream };

struct pooled_origin;

// What the pool asks of a connection. Implementations: client_connection, store's
// redis_connection.
class pooled_connection {
  public:
    virtual ~pooled_connection();
    // Open, not failed or timed out, and (without blocking) not closed by the peer, nothing from
    // the peer waiting.
    virtual bool is_reusable() const noexcept = 0;
    // Closes at once; the connection is not used again.
    virtual void close() noexcept = 0;

  private:
    friend class connection_pool;
    // Set by the pool: the key's state, the budget the current lease counts against, since when
    // it is idle.
    std::weak_ptr<pooled_origin> origin_;
    lease_kind kind_ = lease_kind::call;
    std::chrono::steady_clock::time_point idle_since_{};
};

// Arms and disarms a deadline for one exchange on a connection: when the deadline passes the
// connection is closed (so whatever is pending completes at once) and timed_out() is true. The
// connection is held weakly: one already gone is left alone.
class connection_watchdog {
  public:
    explicit connection_watchdog(const asio::any_io_executor& executor);
    // Re-arming replaces the previous deadline; never blocks.
    void arm(deadline limit, std::weak_ptr<pooled_connection> connection);
    void disarm();
    bool timed_out() const noexcept { return state_->timed_out; }

  private:
    struct state {
        std::uint64_t generation = 0;
        bool timed_out = false;
    };
    asio::steady_timer timer_;
    std::shared_ptr<state> state_ = std::make_shared<state>();
};

class client_connection : public pooled_connection,
                          public std::enable_shared_from_this<client_connection> {
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
    bool timed_out() const noexcept { return watchdog_.timed_out(); }

    // Reads what is available into `into` (at least one byte unless it fails). EOF is
    // asio::error::eof (and, over TLS, a close without close_notify ssl::error::stream_truncated).
    asio::awaitable<std::tuple<std::error_code, std::size_t>> async_read_some(
        asio::mutable_buffer into);
    // Writes all of `buffers` (empty ones are skipped).
    asio::awaitable<std::error_code> async_write(std::array<asio::const_buffer, 3> buffers);

    // Closes at once (no TLS close_notify: HTTP framing, not the TLS close, ends a message).
    void close() noexcept override;
    bool is_open() const noexcept;
    // An idle connection that may be reused: open, not timed out, nothing from the peer waiting,
    // the peer has not closed it.
    bool is_reusable() const noexcept override;

    const origin& where() const noexcept { return origin_; }

  private:
    asio::ip::tcp::socket& socket() noexcept;

    asio::any_io_executor executor_;
    origin origin_;
    std::shared_ptr<asio::ssl::context> tls_context_;
    asio::ip::tcp::resolver resolver_;
    asio::ip::tcp::socket plain_;
    std::unique_ptr<tls_stream> tls_;
    connection_watchdog watchdog_;
};

struct pool_options {
    // Short-call connections per key, busy or idle.
    std::size_t max_per_origin = 16;
    // Busy stream connections per key (their own budget).
    std::size_t max_streams_per_origin = 256;
    // Idle longer than this: closed (before reuse, and by the sweep). Zero: idle connections are
    // closed only when found unusable before reuse, and no sweep runs (the Redis client's one
    // server).
    std::chrono::milliseconds idle_timeout{30'000};
};

class connection_pool {
  public:
    connection_pool(asio::any_io_executor executor, pool_options options);
    // Closes the idle connections; busy ones close when given back.
    ~connection_pool();
    connection_pool(const connection_pool&) = delete;
    connection_pool& operator=(const connection_pool&) = delete;

    // Makes a new, unopened connection for a key under its budget.
    using factory = std::function<std::shared_ptr<pooled_connection>()>;

    struct acquire_request {
        std::string key;
        lease_kind kind = lease_kind::call;
        factory make;
        deadline limit;
        // "a connection to https://h:443", for the deadline's error detail.
        std::string what;
    };

    // A connection given out by async_acquire; give it back with release().
    struct lease {
        std::shared_ptr<pooled_connection> connection;
        bool is_reused = false;  // an idle connection from the pool (already open)
    };

    // An idle connection for the key, or a new one from `make` when the lease's budget has room
    // (the caller opens it, and releases it as not reusable when opening fails), or the next one
    // given back, within the limit. deadline_exceeded when the limit passes first ("the deadline
    // passed waiting for <what> (the pool is at its cap of N)"); cancelled on the caller's
    // cancellation.
    asio::awaitable<result<lease>> async_acquire(acquire_request request);

    // Gives a leased connection back: kept idle when `reusable`, the connection is_reusable(),
    // its key is not dropped and the key's call budget has room; else closed. Wakes a waiter
    // that can use what was freed.
    void release(std::shared_ptr<pooled_connection> connection, bool reusable) noexcept;

    // Moves a lease from `from` (closed) to `to`, a new connection that replaces it (a reconnect
    // attempt under the same slot).
    static void hand_over(pooled_connection& from, pooled_connection& to) noexcept;

    // Closes every idle connection (busy ones close when released).
    void close_idle() noexcept;
    // Closes the key's idle connections and forgets the key: its busy connections close when
    // given back, and a later lease starts afresh.
    void drop_origin(const std::string& key) noexcept;

    // Connections made since the pool was (for tests and benchmarks).
    std::uint64_t connections_opened() const noexcept;
    std::size_t idle_count() const noexcept;
    // Keys with state (something busy, idle or waiting), for tests.
    std::size_t origin_count() const noexcept;

    struct impl;

  private:
    std::shared_ptr<impl> impl_;
};

}  // namespace moat::http
