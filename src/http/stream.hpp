// The byte stream an HTTP connection runs over: plain TCP here, TLS (asio::ssl) as another
// implementation of the same interface, so the server's connection code is written once.
//
// Type-erased (virtual coroutines) rather than a template: the choice of TLS is made at run time
// from the server's options, and one compiled connection loop keeps build times down. Operations
// report errors as values (the non-throwing style of src/). Confined to the executor it was made
// on; close() may be called while a read or write is pending and makes it complete with
// asio::error::operation_aborted (that is how the server's deadlines stop a stalled peer).
#pragma once

#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <system_error>
#include <tuple>

namespace moat::http {

class stream {
  public:
    virtual ~stream() = default;

    // Reads at least one byte (or fails: asio::error::eof when the peer closed cleanly).
    virtual asio::awaitable<std::tuple<std::error_code, std::size_t>> async_read_some(
        asio::mutable_buffer buffer) = 0;
    // Writes every byte of every buffer, in order, or fails.
    virtual asio::awaitable<std::tuple<std::error_code, std::size_t>> async_write(
        std::span<const asio::const_buffer> buffers) = 0;
    // Ends the sending side cleanly (TCP: shutdown(send); TLS: close_notify). Best effort.
    virtual asio::awaitable<void> async_shutdown() = 0;
    // Closes at once; pending operations complete with operation_aborted. Idempotent.
    virtual void close() noexcept = 0;
    virtual bool is_open() const noexcept = 0;
    // Bytes the peer has sent that nobody has read yet (the socket's receive queue); 0 when
    // closed or unknown. The server reads it to tell a connection that is idle from one whose
    // next request has arrived but not yet been parsed.
    virtual std::size_t unread_bytes() const noexcept = 0;
};

std::unique_ptr<stream> make_tcp_stream(asio::ip::tcp::socket socket);

}  // namespace moat::http
