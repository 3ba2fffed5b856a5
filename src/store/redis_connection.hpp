// One connection to Redis: TCP, TLS over TCP, or a unix socket, on moat's own Asio sockets.
//
// async_open connects (TLS: handshake with the peer verified), authenticates and selects the
// database; async_exchange writes a batch of commands in one write (pipelined) and reads exactly
// one reply per command, in order. Both are bounded by a watchdog: when the limit passes the
// socket is closed, the pending step completes at once, and the connection is never used again.
// Any failure mid-exchange also leaves it unusable (the replies still owed would be read by the
// next exchange). Confined to one executor; one exchange at a time (redis_client sees to that).
#pragma once

#include <moat/deadline.hpp>
#include <moat/redis_session_store.hpp>
#include <moat/result.hpp>

#include "http/connection_pool.hpp"
#include "http/tls.hpp"
#include "store/redis_reply.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/steady_timer.hpp>

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace moat::store {

// The code for "Redis cannot be reached or does not answer".
inline constexpr errc unavailable_code = errc::store_unavailable;

using redis_command = std::vector<std::string>;

class redis_connection : public http::pooled_connection,
                         public std::enable_shared_from_this<redis_connection> {
  public:
    // `tls` is the client context for rediss://, null otherwise.
    redis_connection(asio::any_io_executor executor, const redis_config& config,
                     std::shared_ptr<asio::ssl::context> tls);
    ~redis_connection();
    redis_connection(const redis_connection&) = delete;
    redis_connection& operator=(const redis_connection&) = delete;

    // Within `limit`: connect, TLS handshake, AUTH, SELECT. `limit_is_callers`: the limit is the
    // caller's deadline (its passing is deadline_exceeded), not a connect timeout
    // (unavailable_code). unauthorized when Redis refuses the credentials or wants some.
    asio::awaitable<result<void>> async_open(deadline limit, bool limit_is_callers);

    // Sends `commands` and reads their replies, in order, within `limit`. An error reply is a
    // reply (the caller judges it), not an error; NOAUTH is unauthorized.
    asio::awaitable<result<std::vector<redis_reply>>> async_exchange(
        std::span<const redis_command> commands, deadline limit, bool limit_is_callers);

    // Open, not failed, and (checked without blocking) not closed by the peer, nothing unasked
    // waiting.
    bool is_reusable() const noexcept override;
    void close() noexcept override;

  private:
    void arm(deadline limit);
    void disarm();
    error failure(const std::string& step, const std::error_code& ec, bool limit_is_callers);
    asio::awaitable<std::error_code> async_write_all(const std::string& bytes);
    asio::awaitable<std::tuple<std::error_code, std::size_t>> async_read_some(
        asio::mutable_buffer into);
    int native_handle() const noexcept;

    asio::any_io_executor executor_;
    const redis_config& config_;
    std::string where_;  // config.to_string(): no credentials
    std::shared_ptr<asio::ssl::context> tls_context_;
    asio::ip::tcp::resolver resolver_;
    asio::ip::tcp::socket plain_;
    std::unique_ptr<http::tls_stream> tls_;
    asio::local::stream_protocol::socket unix_;
    reply_reader reader_;
    std::vector<char> buffer_;
    bool failed_ = false;
    http::connection_watchdog watchdog_;
};

}  // namespace moat::store
