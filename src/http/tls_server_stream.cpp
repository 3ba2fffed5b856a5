#include "http/tls_server_stream.hpp"

#include "http/socket_stream.hpp"
#include "http/tls.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <utility>

namespace moat::http {

namespace {

class tls_server_stream final : public socket_stream<tls_server_stream> {
  public:
    tls_server_stream(asio::ip::tcp::socket socket, std::shared_ptr<asio::ssl::context> context)
        : context_(std::move(context)), stream_(std::move(socket), *context_) {
        set_no_delay();
    }
    ~tls_server_stream() override { close(); }

    tls_stream& next() noexcept { return stream_; }
    const tls_stream& next() const noexcept { return stream_; }

    asio::awaitable<void> async_shutdown() override {
        auto token = as_tuple(asio::use_awaitable);
        auto [ec] =
            co_await stream_.async_shutdown(token);  // close_notify; the peer's reply or not
        (void)ec;
    }

  private:
    std::shared_ptr<asio::ssl::context> context_;  // outlives the SSL object made from it
    tls_stream stream_;
};

// Closes the stream whose handshake is late. The handler may run after the handshake ended: it
// then finds no target.
struct handshake_expiry {
    std::shared_ptr<tls_server_stream*> target;
    void operator()(const std::error_code& ec) const {
        if (!ec && *target != nullptr) (*target)->close();
    }
};

asio::awaitable<result<std::unique_ptr<stream>>> async_tls_handshake(
    std::shared_ptr<asio::ssl::context> context, asio::ip::tcp::socket socket,
    std::chrono::steady_clock::time_point deadline) {
    auto executor = socket.get_executor();
    auto s = std::make_unique<tls_server_stream>(std::move(socket), std::move(context));
    auto target = std::make_shared<tls_server_stream*>(s.get());
    asio::steady_timer timer(executor);
    timer.expires_at(deadline);
    timer.async_wait(handshake_expiry{target});
    auto token = as_tuple(asio::use_awaitable);
    auto [ec] = co_await s->next().async_handshake(asio::ssl::stream_base::server, token);
    const bool late = std::chrono::steady_clock::now() >= deadline;
    *target = nullptr;
    timer.cancel();
    if (ec) {
        std::string why = "TLS handshake failed: " + describe_handshake_failure(s->next(), ec);
        if (late) why = "TLS handshake not complete within the head timeout";
        co_return make_error(errc::backend_failure, std::move(why));
    }
    std::unique_ptr<stream> out = std::move(s);
    co_return out;
}

}  // namespace

stream_factory make_tls_stream_factory(std::shared_ptr<asio::ssl::context> context) {
    return [context](asio::ip::tcp::socket socket, std::chrono::steady_clock::time_point deadline) {
        return async_tls_handshake(context, std::move(socket), deadline);
    };
}

result<stream_factory> make_tls_stream_factory(const std::string& certificate_file,
                                               const std::string& key_file) {
    auto context = make_server_context(certificate_file, key_file);
    if (!context) return context.error();
    return make_tls_stream_factory(std::move(*context));
}

}  // namespace moat::http
