#include "store/redis_client.hpp"

#include "core/asio_compat.hpp"

#include <moat/log.hpp>

#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <span>

namespace moat::store {
namespace {

constexpr auto use_tuple = as_tuple(asio::use_awaitable);

// The earlier of the caller's deadline and `timeout` from now, and whether it is the caller's.
struct bounded_limit {
    deadline limit;
    bool is_callers = false;
};

bounded_limit bound(deadline callers, std::chrono::milliseconds timeout) {
    const auto own = deadline::after(timeout);
    if (callers.when() <= own.when()) return {callers, true};
    return {own, false};
}

// Gives a leased connection back to the pool whatever way the exchange ends (an exception, or
// the frame destroyed, included): kept when `reusable` and still usable, else closed and its slot
// freed.
struct lease_guard {
    http::connection_pool& pool;
    std::shared_ptr<redis_connection>& connection;
    bool reusable = false;
    ~lease_guard() {
        if (connection) pool.release(std::move(connection), reusable);
    }
};

http::pool_options pool_options_for(const redis_config& config) {
    http::pool_options o;
    o.max_per_origin = config.max_connections;
    o.idle_timeout = std::chrono::milliseconds(0);  // checked before reuse only, as ever
    return o;
}

}  // namespace

redis_client::redis_client(asio::any_io_executor executor, redis_config config,
                           std::shared_ptr<asio::ssl::context> tls)
    : executor_(executor),
      config_(std::move(config)),
      tls_(std::move(tls)),
      pool_(executor, pool_options_for(config_)) {}

redis_client::~redis_client() = default;

asio::awaitable<result<void>> redis_client::async_open_new(connection_ptr& connection,
                                                           deadline limit) {
    for (int attempt = 1;; ++attempt) {
        const auto now = std::chrono::steady_clock::now();
        if (now < next_connect_at_) {
            if (limit.when() < next_connect_at_) {
                co_return make_error(
                    unavailable_code,
                    last_failure_ + " (next connect attempt in " +
                        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           next_connect_at_ - now)
                                           .count()) +
                        " ms, after the deadline)");
            }
            asio::steady_timer pause(executor_, next_connect_at_);
            auto paused = co_await pause.async_wait(use_tuple);
            if (std::get<0>(paused) == asio::error::operation_aborted) {
                co_return make_error(errc::cancelled, "cancelled waiting to reconnect to Redis");
            }
        }
        if (attempt > 1) {
            auto fresh = std::make_shared<redis_connection>(executor_, config_, tls_);
            http::connection_pool::hand_over(*connection, *fresh);
            connection = std::move(fresh);
        }
        const auto bounded = bound(limit, config_.connect_timeout);
        auto opened = co_await connection->async_open(bounded.limit, bounded.is_callers);
        if (opened) {
            ++opened_;
            if (!last_failure_.empty() && detail::log_enabled()) {
                detail::log(log_level::info, "redis",
                            "Redis at " + config_.to_string() + " is reachable again");
            }
            backoff_ = std::chrono::milliseconds(0);
            next_connect_at_ = {};
            last_failure_.clear();
            co_return result<void>{};
        }
        const auto code = opened.error().code;
        if (code != unavailable_code) co_return std::move(opened).error();
        last_failure_ = opened.error().detail;
        backoff_ = backoff_.count() == 0 ? config_.reconnect_backoff_initial
                                         : std::min(backoff_ * 2, config_.reconnect_backoff_max);
        next_connect_at_ = std::chrono::steady_clock::now() + backoff_;
        if (detail::log_enabled()) {
            detail::log(
                log_level::warning, "redis",
                last_failure_ + "; next attempt in " + std::to_string(backoff_.count()) + " ms");
        }
        if (attempt >= connect_attempts || limit.has_expired()) {
            co_return std::move(opened).error();
        }
    }
}

asio::awaitable<result<redis_client::connection_ptr>> redis_client::async_take(deadline limit) {
    http::connection_pool::acquire_request wanted;
    wanted.key = "redis";
    wanted.make = [this] { return std::make_shared<redis_connection>(executor_, config_, tls_); };
    wanted.limit = limit;
    wanted.what = "a Redis connection";
    auto leased = co_await pool_.async_acquire(std::move(wanted));
    if (!leased) co_return std::move(leased).error();
    auto connection = std::static_pointer_cast<redis_connection>(std::move(leased->connection));
    if (leased->is_reused) co_return connection;
    // A failed (or abandoned) open frees the slot for the next caller.
    lease_guard guard{pool_, connection};
    auto opened = co_await async_open_new(connection, limit);
    if (!opened) co_return std::move(opened).error();
    co_return std::move(connection);
}

asio::awaitable<result<std::vector<redis_reply>>> redis_client::async_run(
    std::vector<redis_command> commands, deadline limit) {
    auto taken = co_await async_take(limit);
    if (!taken) co_return std::move(taken).error();
    auto connection = std::move(*taken);
    lease_guard guard{pool_, connection, true};
    const auto bounded = bound(limit, config_.command_timeout);
    const std::span<const redis_command> batch(commands);
    auto replies = co_await connection->async_exchange(batch, bounded.limit, bounded.is_callers);
    co_return replies;
}

asio::awaitable<result<redis_reply>> redis_client::async_command(redis_command command,
                                                                 deadline limit) {
    std::vector<redis_command> commands;
    commands.push_back(std::move(command));
    auto replies = co_await async_run(std::move(commands), limit);
    if (!replies) co_return std::move(replies).error();
    co_return std::move(replies->front());
}

}  // namespace moat::store
