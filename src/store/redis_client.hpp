// The store's way to Redis: a small pool of redis_connections, reconnect with backoff, and
// every exchange bounded by the caller's deadline and the configured timeouts.
//
// async_run sends a batch of commands on one connection (pipelined, replies in order). It takes
// an idle connection (checked before reuse), or opens one while fewer than max_connections are
// open, or waits for one to be given back: the connections are held by http::connection_pool
// (one key, max_connections short-call connections, no idle timeout: an idle connection is
// checked before reuse), whose wait list is cancellation-safe. Opening is retried up to
// connect_attempts times per call, with exponential backoff shared by all callers (after a failed
// connect nobody dials again before the backoff has passed; a caller whose deadline ends earlier
// fails at once). Success resets the backoff.
//
// Errors: unavailable_code (Redis unreachable, silent past command_timeout, the connection lost
// mid-exchange: whether Redis ran the commands is then unknown), deadline_exceeded (the caller's
// deadline), unauthorized, protocol_error (a reply past the caps), cancelled. Confined to one
// executor.
#pragma once

#include <moat/deadline.hpp>
#include <moat/redis_session_store.hpp>
#include <moat/result.hpp>

#include "http/connection_pool.hpp"
#include "store/redis_connection.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moat::store {

class redis_client {
  public:
    // `tls` is the client context for rediss://, null otherwise. Not copyable (its pool is not).
    redis_client(asio::any_io_executor executor, redis_config config,
                 std::shared_ptr<asio::ssl::context> tls);
    ~redis_client();

    asio::awaitable<result<std::vector<redis_reply>>> async_run(std::vector<redis_command> commands,
                                                                deadline limit);
    asio::awaitable<result<redis_reply>> async_command(redis_command command, deadline limit);

    const redis_config& config() const noexcept { return config_; }
    std::uint64_t connections_opened() const noexcept { return opened_; }
    std::size_t idle_connections() const noexcept { return pool_.idle_count(); }

    // Connect attempts per call at most.
    static constexpr int connect_attempts = 3;

  private:
    using connection_ptr = std::shared_ptr<redis_connection>;
    asio::awaitable<result<connection_ptr>> async_take(deadline limit);
    // Opens `connection` (a new lease), retrying with backoff: a retry replaces it with a fresh
    // connection under the same lease.
    asio::awaitable<result<void>> async_open_new(connection_ptr& connection, deadline limit);

    asio::any_io_executor executor_;
    redis_config config_;
    std::shared_ptr<asio::ssl::context> tls_;
    http::connection_pool pool_;
    std::chrono::steady_clock::time_point next_connect_at_{};
    std::chrono::milliseconds backoff_{0};
    std::string last_failure_;
    std::uint64_t opened_ = 0;
};

}  // namespace moat::store
