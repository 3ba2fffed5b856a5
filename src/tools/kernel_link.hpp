// One exchange between a worker and the sandbox's Python supervisor (a cell, a context operation,
// a ping; python_driver.hpp has the protocol): a connection to the supervisor's unix socket that
// the sandbox's agent made and handed out (sandbox::async_connect_unix: no process starts), or,
// on a backend without that (e2b), a relay process the worker spawned that copies between its
// stdio and the socket. Confined to one executor. Dropping the link stops the exchange: the
// socket closes, or the relay is killed; either way the supervisor sees the connection end.
#pragma once

#include <moat/exec.hpp>
#include <moat/result.hpp>

#include <asio/awaitable.hpp>
#include <asio/local/stream_protocol.hpp>

#include <optional>
#include <string>
#include <variant>

namespace moat {

class kernel_link {
  public:
    explicit kernel_link(process relay);
    explicit kernel_link(asio::local::stream_protocol::socket direct);
    kernel_link(kernel_link&&) noexcept;
    kernel_link& operator=(kernel_link&&) noexcept;
    ~kernel_link();

    // Whether the worker takes its turn itself (a direct connection: the supervisor queues it and
    // the worker withdraws with "w") or the relay does (its turn lock).
    bool is_direct() const noexcept { return direct_.has_value(); }

    // What the supervisor sent (output_channel::out), the relay's own stderr (err), or the end:
    // the relay's exit, or, for a direct connection, its end (EOF or a reset) as an exec_result
    // with exit code 0. Cancelling a direct connection's wait loses nothing and leaves it open
    // (its bytes are read only once they are there); cancelling a relay's kills it (process).
    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next();
    // Sends bytes to the supervisor (through the relay's stdin).
    asio::awaitable<result<void>> async_write(std::string bytes);
    // Ends the exchange now: the connection closes, or the relay is killed.
    void close() noexcept;

  private:
    std::optional<process> relay_;
    std::optional<asio::local::stream_protocol::socket> direct_;
    bool ended_ = false;
};

}  // namespace moat
