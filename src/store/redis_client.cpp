#include "store/redis_client.hpp"

#include "core/asio_compat.hpp"

#include <moat/log.hpp>

#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <functional>
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

// Gives a connection back to the client when the exchange ends, whatever way it ends (an
// exception included): a connection that failed is closed and its slot freed.
struct connection_guard {
    std::function<void(std::shared_ptr<redis_connection>)> give_back;
    std::shared_ptr<redis_connection> connection;
    ~connection_guard() {
        if (connection) give_back(std::move(connection));
    }
};

}  // namespace

redis_client::redis_client(asio::any_io_executor executor, redis_config config,
                           std::shared_ptr<asio::ssl::context> tls)
    : executor_(std::move(executor)), config_(std::move(config)), tls_(std::move(tls)) {}

redis_client::~redis_client() {
    for (auto& connection : idle_) connection->close();
}

void redis_client::give_back(connection_ptr connection) {
    if (connection->is_reusable() && idle_.size() < config_.max_connections) {
        idle_.push_back(std::move(connection));
    } else {
        connection->close();
        --open_;
    }
    if (!waiters_.empty()) {
        waiters_.front()->cancel();
        waiters_.erase(waiters_.begin());
    }
}

asio::awaitable<result<redis_client::connection_ptr>> redis_client::async_open_new(deadline limit) {
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
        auto connection = std::make_shared<redis_connection>(executor_, config_, tls_);
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
            co_return connection;
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
    for (;;) {
        while (!idle_.empty()) {
            auto candidate = std::move(idle_.back());
            idle_.pop_back();
            if (candidate->is_reusable()) co_return candidate;
            candidate->close();
            --open_;
        }
        if (open_ < config_.max_connections) {
            ++open_;
            auto opened = co_await async_open_new(limit);
            if (!opened) {
                --open_;
                // Another caller may be waiting for a slot: this one is free again.
                if (!waiters_.empty()) {
                    waiters_.front()->cancel();
                    waiters_.erase(waiters_.begin());
                }
            }
            co_return opened;
        }
        if (limit.has_expired()) {
            co_return make_error(errc::deadline_exceeded,
                                 "the deadline passed waiting for a Redis connection");
        }
        asio::steady_timer wake(executor_, limit.when());
        waiters_.push_back(&wake);
        auto waited = co_await wake.async_wait(use_tuple);
        // give_back() removes the waiter it wakes: one still listed was woken by something else.
        const bool was_listed = std::erase(waiters_, &wake) != 0;
        if (was_listed && std::get<0>(waited) == asio::error::operation_aborted) {
            co_return make_error(errc::cancelled, "cancelled waiting for a Redis connection");
        }
    }
}

asio::awaitable<result<std::vector<redis_reply>>> redis_client::async_run(
    std::vector<redis_command> commands, deadline limit) {
    auto taken = co_await async_take(limit);
    if (!taken) co_return std::move(taken).error();
    connection_guard guard{[this](connection_ptr c) { give_back(std::move(c)); },
                           std::move(*taken)};
    const auto bounded = bound(limit, config_.command_timeout);
    const std::span<const redis_command> batch(commands);
    auto replies =
        co_await guard.connection->async_exchange(batch, bounded.limit, bounded.is_callers);
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
