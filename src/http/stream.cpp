#include "http/stream.hpp"

#include "core/asio_compat.hpp"

#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

namespace moat::http {

namespace {

class tcp_stream final : public stream {
  public:
    explicit tcp_stream(asio::ip::tcp::socket socket) : socket_(std::move(socket)) {
        std::error_code ignored;
        socket_.set_option(asio::ip::tcp::no_delay(true), ignored);  // frames go out at once
    }
    ~tcp_stream() override { close(); }

    asio::awaitable<std::tuple<std::error_code, std::size_t>> async_read_some(
        asio::mutable_buffer buffer) override {
        auto token = as_tuple(asio::use_awaitable);
        co_return co_await socket_.async_read_some(buffer, token);
    }

    asio::awaitable<std::tuple<std::error_code, std::size_t>> async_write(
        std::span<const asio::const_buffer> buffers) override {
        auto token = as_tuple(asio::use_awaitable);
        co_return co_await asio::async_write(socket_, buffers, token);
    }

    asio::awaitable<void> async_shutdown() override {
        std::error_code ignored;
        socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
        co_return;
    }

    void close() noexcept override {
        std::error_code ignored;
        socket_.close(ignored);
    }

    bool is_open() const noexcept override { return socket_.is_open(); }

    std::size_t unread_bytes() const noexcept override {
        std::error_code ec;
        const auto n = socket_.available(ec);
        return ec ? 0 : n;
    }

  private:
    asio::ip::tcp::socket socket_;
};

}  // namespace

std::unique_ptr<stream> make_tcp_stream(asio::ip::tcp::socket socket) {
    return std::make_unique<tcp_stream>(std::move(socket));
}

}  // namespace moat::http
