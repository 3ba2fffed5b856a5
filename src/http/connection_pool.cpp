#include "http/connection_pool.hpp"

#include "core/asio_compat.hpp"

#include <asio/connect.hpp>
#include <asio/ip/address.hpp>
#include <asio/read.hpp>
#include <asio/ssl/error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace moat::http {
namespace {

constexpr auto use_tuple = as_tuple(asio::use_awaitable);

std::string describe_socket_error(const std::error_code& ec) {
    if (ec == asio::error::connection_refused) return "connection refused";
    if (ec == asio::error::connection_reset) return "connection reset";
    if (ec == asio::error::eof) return "the peer closed the connection";
    if (ec == asio::error::host_unreachable || ec == asio::error::network_unreachable) {
        return "unreachable";
    }
    return ec.message();
}

}  // namespace

std::string origin::to_string() const {
    std::string out = is_tls ? "https://" : "http://";
    if (host.find(':') != std::string::npos) {
        out += '[' + host + ']';
    } else {
        out += host;
    }
    out += ':' + std::to_string(port);
    return out;
}

bool is_loopback_host(std::string_view host) {
    if (host == "localhost") return true;
    std::error_code ec;
    const auto address = asio::ip::make_address(std::string(host), ec);
    return !ec && address.is_loopback();
}

client_connection::client_connection(asio::any_io_executor executor, origin where,
                                     std::shared_ptr<asio::ssl::context> tls)
    : executor_(executor),
      origin_(std::move(where)),
      tls_context_(std::move(tls)),
      resolver_(executor),
      plain_(executor),
      watchdog_(executor) {
    if (tls_context_) tls_ = std::make_unique<tls_stream>(executor, *tls_context_);
}

client_connection::~client_connection() {
    close();
}

asio::ip::tcp::socket& client_connection::socket() noexcept {
    if (tls_) return tls_->next_layer();
    return plain_;
}

bool client_connection::is_open() const noexcept {
    if (tls_) return tls_->next_layer().is_open();
    return plain_.is_open();
}

void client_connection::close() noexcept {
    std::error_code ignored;
    resolver_.cancel();
    socket().shutdown(asio::socket_base::shutdown_both, ignored);
    socket().close(ignored);
}

void client_connection::arm(deadline limit) {
    ++generation_;
    timed_out_ = false;
    if (limit.is_never()) {
        watchdog_.cancel();
        return;
    }
    watchdog_.expires_at(limit.when());
    // A completion handler, not a coroutine: it holds the connection weakly and ignores a wait
    // that was replaced (re-armed) or cancelled.
    watchdog_.async_wait(
        [weak = weak_from_this(), generation = generation_](const std::error_code& ec) {
            if (ec) return;
            const auto self = weak.lock();
            if (!self || self->generation_ != generation) return;
            self->timed_out_ = true;
            self->close();
        });
}

void client_connection::disarm() {
    ++generation_;
    watchdog_.cancel();
}

bool client_connection::is_reusable_idle() const noexcept {
    if (!is_open() || timed_out_) return false;
    const int fd = const_cast<client_connection*>(this)->socket().native_handle();
    char byte = 0;
    const auto n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    // 0: the peer closed; > 0: bytes nobody asked for (a broken peer); EAGAIN: idle and open.
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

asio::awaitable<result<void>> client_connection::async_open(bool loopback_only) {
    const auto where = origin_.to_string();
    const auto port = std::to_string(origin_.port);
    auto resolved = co_await resolver_.async_resolve(origin_.host, port, use_tuple);
    auto& [resolve_error, results] = resolved;
    if (timed_out_) {
        co_return make_error(errc::deadline_exceeded,
                             "the deadline passed resolving " + origin_.host);
    }
    if (resolve_error) {
        co_return make_error(errc::invalid_argument,
                             "cannot resolve " + origin_.host + ": " + resolve_error.message());
    }
    std::vector<asio::ip::tcp::endpoint> endpoints;
    for (const auto& entry : results) {
        if (loopback_only && !entry.endpoint().address().is_loopback()) continue;
        endpoints.push_back(entry.endpoint());
    }
    if (endpoints.empty()) {
        co_return make_error(errc::invalid_argument,
                             origin_.host +
                                 " resolves to no loopback address (plain http:// is "
                                 "allowed only to loopback unless the host is opted in)");
    }
    auto connected = co_await asio::async_connect(socket(), endpoints, use_tuple);
    const auto connect_error = std::get<0>(connected);
    if (timed_out_)
        co_return make_error(errc::deadline_exceeded, "the deadline passed connecting to " + where);
    if (connect_error) {
        co_return make_error(errc::backend_failure,
                             "connect to " + where + ": " + describe_socket_error(connect_error));
    }
    std::error_code ignored;
    socket().set_option(asio::ip::tcp::no_delay(true), ignored);
    if (!tls_) co_return result<void>{};

    if (auto prepared = prepare_client_stream(*tls_, origin_.host); !prepared) {
        co_return prepared.error();
    }
    auto handshake = co_await tls_->async_handshake(asio::ssl::stream_base::client, use_tuple);
    const auto handshake_error = std::get<0>(handshake);
    if (timed_out_) {
        co_return make_error(errc::deadline_exceeded,
                             "the deadline passed in the TLS handshake with " + where);
    }
    if (handshake_error) {
        co_return make_error(errc::backend_failure,
                             "TLS handshake with " + where + ": " +
                                 describe_handshake_failure(*tls_, handshake_error));
    }
    co_return result<void>{};
}

asio::awaitable<std::tuple<std::error_code, std::size_t>> client_connection::async_read_some(
    asio::mutable_buffer into) {
    if (timed_out_) co_return std::tuple{asio::error::timed_out, std::size_t{0}};
    std::tuple<std::error_code, std::size_t> outcome;
    if (tls_) {
        outcome = co_await tls_->async_read_some(into, use_tuple);
    } else {
        outcome = co_await plain_.async_read_some(into, use_tuple);
    }
    if (timed_out_) std::get<0>(outcome) = asio::error::timed_out;
    co_return outcome;
}

asio::awaitable<std::error_code> client_connection::async_write(
    std::array<asio::const_buffer, 3> buffers) {
    if (timed_out_) co_return asio::error::timed_out;
    std::tuple<std::error_code, std::size_t> outcome;
    if (tls_) {
        outcome = co_await asio::async_write(*tls_, buffers, use_tuple);
    } else {
        outcome = co_await asio::async_write(plain_, buffers, use_tuple);
    }
    if (timed_out_) co_return asio::error::timed_out;
    co_return std::get<0>(outcome);
}

connection_pool::connection_pool(asio::any_io_executor executor, pool_options options)
    : executor_(std::move(executor)), options_(options) {
    if (options_.max_per_origin == 0) options_.max_per_origin = 1;
}

connection_pool::~connection_pool() {
    close_idle();
}

connection_pool::per_origin& connection_pool::slot(const origin& where) {
    return origins_[where.to_string()];
}

void connection_pool::wake_one(per_origin& slot) noexcept {
    for (auto* w : slot.waiters) {
        if (w->woken) continue;
        w->woken = true;
        w->timer->cancel();
        return;
    }
}

std::size_t connection_pool::idle_count() const noexcept {
    std::size_t n = 0;
    for (const auto& [key, s] : origins_) n += s.idle.size();
    return n;
}

void connection_pool::close_idle() noexcept {
    for (auto& [key, s] : origins_) {
        for (auto& c : s.idle) c->close();
        s.live -= std::min(s.live, s.idle.size());
        s.idle.clear();
        wake_one(s);
    }
}

asio::awaitable<result<connection_pool::lease>> connection_pool::async_acquire(
    const origin& where, std::shared_ptr<asio::ssl::context> tls, deadline limit) {
    for (;;) {
        auto& s = slot(where);
        const auto now = std::chrono::steady_clock::now();
        while (!s.idle.empty()) {
            auto candidate = std::move(s.idle.back());
            s.idle.pop_back();
            if (now - candidate->idle_since < options_.idle_timeout &&
                candidate->is_reusable_idle()) {
                co_return lease{std::move(candidate), true};
            }
            candidate->close();
            --s.live;
        }
        if (s.live < options_.max_per_origin) {
            ++s.live;
            ++opened_;
            auto fresh = std::make_shared<client_connection>(executor_, where, tls);
            co_return lease{std::move(fresh), false};
        }
        if (limit.has_expired()) {
            co_return make_error(errc::deadline_exceeded,
                                 "the deadline passed waiting for a connection to " +
                                     where.to_string() + " (the pool is at its cap of " +
                                     std::to_string(options_.max_per_origin) + ")");
        }
        // Wait for a release. The registration is undone by RAII whatever ends the wait (a
        // cancellation makes the co_await throw); a wake this waiter got but did not use is
        // passed on.
        asio::steady_timer timer(executor_, limit.when());
        waiter me{&timer};
        struct registration {
            per_origin& s;
            waiter& w;
            ~registration() {
                std::erase(s.waiters, &w);
                if (w.woken) wake_one(s);
            }
        };
        s.waiters.push_back(&me);
        {
            registration guard{s, me};
            (void)co_await timer.async_wait(use_tuple);
            if (!me.woken) continue;  // the deadline: reported by the check above
            me.woken = false;
        }
    }
}

void connection_pool::release(std::shared_ptr<client_connection> connection,
                              bool reusable) noexcept {
    if (!connection) return;
    connection->disarm();
    auto& s = slot(connection->where());
    if (reusable && connection->is_open() && !connection->timed_out()) {
        connection->idle_since = std::chrono::steady_clock::now();
        s.idle.push_back(std::move(connection));
    } else {
        connection->close();
        if (s.live > 0) --s.live;
    }
    wake_one(s);
}

}  // namespace moat::http
