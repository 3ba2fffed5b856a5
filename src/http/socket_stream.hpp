// What the socket-backed streams (plain TCP, TLS over TCP) share: reads and writes go through the
// derived class's next() (the socket, or the TLS stream over it); close, is_open and unread_bytes
// through its lowest layer (the TCP socket). The derived class supplies async_shutdown and the
// next() accessor (CRTP: `class tcp_stream final : public socket_stream<tcp_stream>`).
#pragma once

#include "core/asio_compat.hpp"
#include "http/stream.hpp"

#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

namespace moat::http {

template <typename Derived>
class socket_stream : public stream {
  public:
    asio::awaitable<std::tuple<std::error_code, std::size_t>> async_read_some(
        asio::mutable_buffer buffer) override {
        auto token = as_tuple(asio::use_awaitable);
        co_return co_await self().next().async_read_some(buffer, token);
    }

    asio::awaitable<std::tuple<std::error_code, std::size_t>> async_write(
        std::span<const asio::const_buffer> buffers) override {
        auto token = as_tuple(asio::use_awaitable);
        co_return co_await asio::async_write(self().next(), buffers, token);
    }

    void close() noexcept override {
        std::error_code ignored;
        self().next().lowest_layer().close(ignored);
    }

    bool is_open() const noexcept override { return self().next().lowest_layer().is_open(); }

    std::size_t unread_bytes() const noexcept override {
        std::error_code ec;
        const auto n = self().next().lowest_layer().available(ec);
        return ec ? 0 : n;
    }

  protected:
    // Sends a segment as soon as it is written (frames go out at once).
    void set_no_delay() {
        std::error_code ignored;
        self().next().lowest_layer().set_option(asio::ip::tcp::no_delay(true), ignored);
    }

  private:
    Derived& self() noexcept { return static_cast<Derived&>(*this); }
    const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace moat::http
