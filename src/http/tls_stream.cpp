#include "http/tls_stream.hpp"

#include "core/asio_compat.hpp"
#include "http/tls.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <openssl/ssl.h>

namespace moat::http {
namespace {

class tls_server_stream final : public stream {
  public:
    tls_server_stream(asio::ip::tcp::socket socket, asio::ssl::context& context)
        : tls_(std::move(socket), context) {
        std::error_code ignored;
        tls_.next_layer().set_option(asio::ip::tcp::no_delay(true), ignored);
    }
    ~tls_server_stream() override { close(); }

    tls_stream& native() noexcept { return tls_; }

    asio::awaitable<std::tuple<std::error_code, std::size_t>> async_read_some(
        asio::mutable_buffer buffer) override {
        auto token = as_tuple(asio::use_awaitable);
        co_return co_await tls_.async_read_some(buffer, token);
    }

    asio::awaitable<std::tuple<std::error_code, std::size_t>> async_write(
        std::span<const asio::const_buffer> buffers) override {
        auto token = as_tuple(asio::use_awaitable);
        co_return co_await asio::async_write(tls_, buffers, token);
    }

    asio::awaitable<void> async_shutdown() override {
        SSL_set_quiet_shutdown(tls_.native_handle(), 1);
        std::error_code ignored;
        tls_.next_layer().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
        co_return;
    }

    void close() noexcept override {
        std::error_code ignored;
        tls_.next_layer().close(ignored);
    }

    bool is_open() const noexcept override { return tls_.next_layer().is_open(); }

  private:
    tls_stream tls_;
};

// Closes the stream when the handshake's deadline passes, unless the handshake ended first.
struct handshake_watchdog {
    tls_server_stream* stream;
    std::shared_ptr<bool> finished;
    std::shared_ptr<bool> fired;
    void operator()(const std::error_code& ec) const {
        if (ec || *finished) return;
        *fired = true;
        stream->close();
    }
};

asio::awaitable<result<std::unique_ptr<stream>>> tls_handshake(
    std::shared_ptr<asio::ssl::context> context, asio::ip::tcp::socket socket,
    std::chrono::steady_clock::time_point deadline) {
    const auto executor = socket.get_executor();
    auto made = std::make_unique<tls_server_stream>(std::move(socket), *context);
    auto finished = std::make_shared<bool>(false);
    auto fired = std::make_shared<bool>(false);
    asio::steady_timer timer(executor, deadline);
    timer.async_wait(handshake_watchdog{made.get(), finished, fired});
    auto token = as_tuple(asio::use_awaitable);
    auto outcome = co_await made->native().async_handshake(asio::ssl::stream_base::server, token);
    *finished = true;
    const auto ec = std::get<0>(outcome);
    if (*fired)
        co_return make_error(errc::deadline_exceeded, "the deadline passed in the TLS handshake");
    if (ec) {
        co_return make_error(errc::backend_failure,
                             "TLS handshake: " + describe_handshake_failure(made->native(), ec));
    }
    co_return std::unique_ptr<stream>(std::move(made));
}

}  // namespace

stream_factory make_tls_stream_factory(std::shared_ptr<asio::ssl::context> context) {
    return [context](asio::ip::tcp::socket socket, std::chrono::steady_clock::time_point deadline) {
        return tls_handshake(context, std::move(socket), deadline);
    };
}

}  // namespace moat::http
