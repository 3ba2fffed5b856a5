#include "http/stream.hpp"

#include "http/socket_stream.hpp"

namespace moat::http {

namespace {

class tcp_stream final : public socket_stream<tcp_stream> {
  public:
    explicit tcp_stream(asio::ip::tcp::socket socket) : socket_(std::move(socket)) {
        set_no_delay();
    }
    ~tcp_stream() override { close(); }

    asio::ip::tcp::socket& next() noexcept { return socket_; }
    const asio::ip::tcp::socket& next() const noexcept { return socket_; }

    asio::awaitable<void> async_shutdown() override {
        std::error_code ignored;
        socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
        co_return;
    }

  private:
    asio::ip::tcp::socket socket_;
};

}  // namespace

std::unique_ptr<stream> make_tcp_stream(asio::ip::tcp::socket socket) {
    return std::make_unique<tcp_stream>(std::move(socket));
}

}  // namespace moat::http
