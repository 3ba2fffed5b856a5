#include "store/redis_connection.hpp"

#include "core/asio_compat.hpp"

#include <asio/connect.hpp>
#include <asio/ssl/error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <sys/socket.h>

#include <cerrno>

namespace moat::store {
namespace {

constexpr auto use_tuple = as_tuple(asio::use_awaitable);

// The HTTP client's words, but for Redis's own close and a missing unix socket.
std::string describe_socket_error(const std::error_code& ec) {
    if (ec == asio::error::eof) return "Redis closed the connection";
    if (ec == asio::error::not_found || ec == std::errc::no_such_file_or_directory) {
        return "no such socket";
    }
    return http::describe_socket_error(ec);
}

// The first word of an error reply ("WRONGPASS", "NOAUTH", "ERR"): what AUTH failures report, so
// that nothing Redis echoes back can carry a credential.
std::string error_word(const redis_reply& reply) {
    const auto end = reply.text.find_first_of(" \r\n");
    auto word = reply.text.substr(0, std::min<std::size_t>(end, 32));
    for (auto& c : word) {
        if (static_cast<unsigned char>(c) < 0x21 || c == 0x7f) c = '?';
    }
    return word;
}

bool is_auth_refusal(const redis_reply& reply) {
    if (!reply.is_error()) return false;
    const auto word = error_word(reply);
    return word == "NOAUTH" || word == "WRONGPASS" || word == "NOPERM" ||
           reply.text.starts_with("ERR invalid password") || reply.text.starts_with("ERR AUTH");
}

}  // namespace

redis_connection::redis_connection(asio::any_io_executor executor, const redis_config& config,
                                   std::shared_ptr<asio::ssl::context> tls)
    : executor_(executor),
      config_(config),
      where_(config.to_string()),
      tls_context_(std::move(tls)),
      resolver_(executor),
      plain_(executor),
      unix_(executor),
      reader_(
          reply_limits{config.max_reply_bytes, config.max_reply_elements, config.max_reply_depth}),
      buffer_(16 * 1024),
      watchdog_(executor_) {
    if (tls_context_) tls_ = std::make_unique<http::tls_stream>(executor, *tls_context_);
}

redis_connection::~redis_connection() {
    close();
}

void redis_connection::arm(deadline limit) {
    watchdog_.arm(limit, weak_from_this());
}

void redis_connection::disarm() {
    watchdog_.disarm();
}

void redis_connection::close() noexcept {
    std::error_code ignored;
    if (tls_) {
        tls_->next_layer().close(ignored);
    }
    plain_.close(ignored);
    unix_.close(ignored);
}

int redis_connection::native_handle() const noexcept {
    auto* self = const_cast<redis_connection*>(this);
    if (config_.kind == redis_config::transport::unix_socket) {
        return self->unix_.is_open() ? self->unix_.native_handle() : -1;
    }
    auto& socket = tls_ ? self->tls_->next_layer() : self->plain_;
    return socket.is_open() ? socket.native_handle() : -1;
}

bool redis_connection::is_reusable() const noexcept {
    if (failed_ || watchdog_.timed_out()) return false;
    const int fd = native_handle();
    if (fd < 0) return false;
    char byte = 0;
    const auto n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    // 0: Redis closed it (a restart, its idle timeout); > 0: bytes nobody asked for.
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

error redis_connection::failure(const std::string& step, const std::error_code& ec,
                                bool limit_is_callers) {
    failed_ = true;
    close();
    if (watchdog_.timed_out()) {
        if (limit_is_callers) {
            return make_error(errc::deadline_exceeded,
                              "the deadline passed " + step + " Redis at " + where_);
        }
        return make_error(unavailable_code,
                          "Redis at " + where_ + ": no answer " + step + " within its timeout");
    }
    if (ec == asio::error::operation_aborted) {
        return make_error(errc::cancelled, "cancelled " + step + " Redis at " + where_);
    }
    return make_error(unavailable_code,
                      "Redis at " + where_ + ": " + step + ": " + describe_socket_error(ec));
}

asio::awaitable<std::error_code> redis_connection::async_write_all(const std::string& bytes) {
    std::tuple<std::error_code, std::size_t> outcome;
    const auto buffer = asio::buffer(bytes);
    if (config_.kind == redis_config::transport::unix_socket) {
        outcome = co_await asio::async_write(unix_, buffer, use_tuple);
    } else if (tls_) {
        outcome = co_await asio::async_write(*tls_, buffer, use_tuple);
    } else {
        outcome = co_await asio::async_write(plain_, buffer, use_tuple);
    }
    co_return std::get<0>(outcome);
}

asio::awaitable<std::tuple<std::error_code, std::size_t>> redis_connection::async_read_some(
    asio::mutable_buffer into) {
    if (config_.kind == redis_config::transport::unix_socket) {
        co_return co_await unix_.async_read_some(into, use_tuple);
    }
    if (tls_) co_return co_await tls_->async_read_some(into, use_tuple);
    co_return co_await plain_.async_read_some(into, use_tuple);
}

asio::awaitable<result<void>> redis_connection::async_open(deadline limit, bool limit_is_callers) {
    arm(limit);
    if (config_.kind == redis_config::transport::unix_socket) {
        const asio::local::stream_protocol::endpoint endpoint(config_.socket_path);
        auto connected = co_await unix_.async_connect(endpoint, use_tuple);
        if (const auto ec = std::get<0>(connected); ec || watchdog_.timed_out()) {
            co_return failure("connecting to", ec, limit_is_callers);
        }
    } else {
        const auto port = std::to_string(config_.port);
        auto resolved = co_await resolver_.async_resolve(config_.host, port, use_tuple);
        auto& [resolve_error, endpoints] = resolved;
        if (resolve_error || watchdog_.timed_out()) {
            co_return failure("resolving the host of", resolve_error, limit_is_callers);
        }
        auto& socket = tls_ ? tls_->next_layer() : plain_;
        auto connected = co_await asio::async_connect(socket, endpoints, use_tuple);
        if (const auto ec = std::get<0>(connected); ec || watchdog_.timed_out()) {
            co_return failure("connecting to", ec, limit_is_callers);
        }
        std::error_code ignored;
        socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        if (tls_) {
            if (auto prepared = http::prepare_client_stream(*tls_, config_.host); !prepared) {
                failed_ = true;
                close();
                co_return prepared.error();
            }
            auto shaken = co_await tls_->async_handshake(asio::ssl::stream_base::client, use_tuple);
            const auto ec = std::get<0>(shaken);
            if (watchdog_.timed_out())
                co_return failure("in the TLS handshake with", ec, limit_is_callers);
            if (ec) {
                const auto why = http::describe_handshake_failure(*tls_, ec);
                failed_ = true;
                close();
                co_return make_error(unavailable_code,
                                     "Redis at " + where_ + ": TLS handshake: " + why);
            }
        }
    }
    disarm();

    std::vector<redis_command> setup;
    if (!config_.password.empty()) {
        if (config_.username.empty()) {
            setup.push_back({"AUTH", config_.password});
        } else {
            setup.push_back({"AUTH", config_.username, config_.password});
        }
    }
    if (config_.database != 0) setup.push_back({"SELECT", std::to_string(config_.database)});
    if (setup.empty()) co_return result<void>{};
    auto replies = co_await async_exchange(setup, limit, limit_is_callers);
    if (!replies) co_return std::move(replies).error();
    std::size_t index = 0;
    if (!config_.password.empty()) {
        const auto& auth = (*replies)[index++];
        if (auth.is_error()) {
            failed_ = true;
            close();
            co_return make_error(
                errc::unauthorized,
                "Redis at " + where_ + " refused the credentials (" + error_word(auth) + ")");
        }
    }
    if (config_.database != 0) {
        const auto& selected = (*replies)[index];
        if (selected.is_error()) {
            failed_ = true;
            close();
            co_return make_error(errc::invalid_argument, "Redis at " + where_ + ": SELECT " +
                                                             std::to_string(config_.database) +
                                                             ": " + describe_reply(selected));
        }
    }
    co_return result<void>{};
}

asio::awaitable<result<std::vector<redis_reply>>> redis_connection::async_exchange(
    std::span<const redis_command> commands, deadline limit, bool limit_is_callers) {
    if (failed_ || watchdog_.timed_out()) {
        co_return make_error(unavailable_code, "Redis at " + where_ + ": the connection is closed");
    }
    std::string out;
    for (const auto& command : commands) append_command(out, command);
    arm(limit);
    const auto write_error = co_await async_write_all(out);
    if (write_error || watchdog_.timed_out())
        co_return failure("writing to", write_error, limit_is_callers);
    std::vector<redis_reply> replies;
    replies.reserve(commands.size());
    while (replies.size() < commands.size()) {
        auto parsed = reader_.next();
        if (!parsed) {
            failed_ = true;
            close();
            co_return make_error(errc::protocol_error,
                                 "Redis at " + where_ + ": " + parsed.error().detail);
        }
        if (*parsed) {
            if (is_auth_refusal(**parsed) && error_word(**parsed) == "NOAUTH") {
                failed_ = true;
                close();
                co_return make_error(errc::unauthorized,
                                     "Redis at " + where_ + " wants a password (NOAUTH)");
            }
            replies.push_back(std::move(**parsed));
            continue;
        }
        auto read = co_await async_read_some(asio::buffer(buffer_));
        auto& [read_error, n] = read;
        if (read_error || watchdog_.timed_out())
            co_return failure("reading from", read_error, limit_is_callers);
        auto fed = reader_.feed(std::string_view(buffer_.data(), n));
        if (!fed) {
            failed_ = true;
            close();
            co_return make_error(errc::protocol_error,
                                 "Redis at " + where_ + ": " + fed.error().detail);
        }
    }
    disarm();
    co_return replies;
}

}  // namespace moat::store
