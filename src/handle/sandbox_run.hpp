// The handle's way of running one backend operation in its lane (sandbox.hpp is the contract):
// the templates that sandbox.cpp and the files beside it (sandbox_pause.cpp) share.
#pragma once

#include "core/async_event.hpp"
#include "core/cancellation.hpp"
#include "core/exception_boundary.hpp"
#include "handle/sandbox_impl.hpp"

#include <asio/this_coro.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>

namespace moat {

// The failures after which a handle can no longer vouch for its sandbox.
inline bool is_quarantine_cause(const error& e) {
    return e.code == errc::backend_failure || e.code == errc::protocol_error ||
           e.code == errc::sandbox_unavailable || e.code == errc::sandbox_not_found;
}

inline std::optional<errc> failure_of(const error& e) {
    return static_cast<errc>(e.code.value());
}

template <class T>
struct operation_state {
    explicit operation_state(const asio::any_io_executor& ex) : done(ex) {}
    async_event done;
    std::optional<result<T>> outcome;
};

template <class T>
asio::awaitable<void> run_backend_operation(std::shared_ptr<operation_state<T>> op,
                                            asio::awaitable<result<T>> operation) {
    try {
        op->outcome = co_await std::move(operation);
    } catch (...) {
        op->outcome = error_from_exception(std::current_exception());
    }
    op->done.set();
}

template <class T>
asio::awaitable<result<T>> sandbox::impl::run_in_turn(
    std::shared_ptr<impl> self, const char* what, deadline limit,
    std::function<asio::awaitable<result<T>>()> start) {
    auto op = std::make_shared<operation_state<T>>(self->executor);
    auto operation = start();
    const std::uint64_t task =
        self->tasks.spawn(run_backend_operation<T>(op, std::move(operation)));
    self->running_tasks.insert(task);
    // A cancellation already pending would make the wait's co_await throw with the operation
    // still running: take it here instead (nothing suspends between the check and the wait).
    auto waited = async_event::wait_outcome::cancelled;
    if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
        co_await asio::this_coro::reset_cancellation_state();
    } else {
        waited = co_await op->done.async_wait(limit);
    }
    std::optional<errc> stopped_by;
    if (waited == async_event::wait_outcome::cancelled) stopped_by = errc::cancelled;
    if (waited == async_event::wait_outcome::deadline_passed) stopped_by = errc::deadline_exceeded;
    if (stopped_by && !op->done.is_set()) {
        // Stop it and wait (not cancellable: async_wait consumes every cancellation) for the stop
        // to be confirmed, within the backend's own stop grace plus the handle's margin.
        self->tasks.cancel(task);
        const auto grace = deadline::after(self->stop_bound());
        while (!op->done.is_set() && !grace.has_expired()) {
            co_await op->done.async_wait(grace);
        }
    }
    self->running_tasks.erase(task);
    const char* stop_name = stopped_by == errc::cancelled ? "cancellation" : "deadline";
    if (!op->done.is_set()) {
        self->quarantine(
            make_error(errc::backend_failure, std::string(what) + " did not stop within " +
                                                  std::to_string(self->stop_bound().count()) +
                                                  " ms of its " + stop_name));
        co_return make_error(*stopped_by, std::string(what) + " was stopped (unconfirmed)");
    }
    result<T> outcome = std::move(*op->outcome);
    if (!outcome && is_quarantine_cause(outcome.error())) self->quarantine(outcome.error());
    if constexpr (std::is_same_v<T, file_read_stream>) {
        // Opened just as the caller's cancellation or deadline arrived: close it.
        if (stopped_by && outcome) {
            outcome = result<T>{};
            co_return make_error(*stopped_by, std::string(what) + " was stopped by its " +
                                                  stop_name + " as the file was opened");
        }
    }
    if constexpr (std::is_same_v<T, asio::ip::tcp::socket>) {
        // Connected just as the caller's cancellation or deadline arrived: drop the connection.
        if (stopped_by && outcome) {
            outcome = result<T>{make_error(errc::cancelled, "")};
            co_return make_error(*stopped_by, std::string(what) + " was stopped by its " +
                                                  stop_name + " as the connection was made");
        }
    }
    if constexpr (std::is_same_v<T, exec_stream>) {
        // The command started just as the caller's cancellation or deadline arrived: the wait
        // above consumed it, so a stream handed back now would run on unobserved (until its wall
        // limit). Dropping it kills the command, as a stop during the start would have.
        if (stopped_by && outcome) {
            outcome = result<T>{};
            co_return make_error(*stopped_by, std::string(what) + " was stopped by its " +
                                                  stop_name + " as the command started; " +
                                                  "the command was killed");
        }
    }
    if (stopped_by && !outcome && outcome.error().code == errc::cancelled) {
        co_return make_error(*stopped_by, std::string(what) + " was stopped by its " + stop_name +
                                              "; " + outcome.error().detail);
    }
    co_return outcome;
}

template <class T>
asio::awaitable<result<T>> sandbox::impl::run(std::shared_ptr<impl> self, const char* what,
                                              deadline limit, moat::lane in,
                                              std::function<asio::awaitable<result<T>>()> start) {
    const auto called = std::chrono::steady_clock::now();
    auto turn = co_await acquire_turn(self, what, limit, in);
    const auto granted = std::chrono::steady_clock::now();
    if (!turn) {
        self->report(what, failure_of(turn.error()), called, granted);
        co_return std::move(turn).error();
    }
    auto outcome = co_await run_in_turn<T>(self, what, limit, start);
    turn->release();
    std::optional<errc> failure;
    if (!outcome) failure = failure_of(outcome.error());
    self->report(what, failure, called, granted);
    co_return outcome;
}

// impl::run of one backend call under the exception boundary: `call` is the backend's member
// function, called (at most once) with the sandbox's id and `args`, which the call owns.
template <class T, class... Params, class... Args>
asio::awaitable<result<T>> run_call(
    std::shared_ptr<sandbox::impl> state, const char* what, deadline limit, lane in,
    asio::awaitable<result<T>> (backend::*call)(std::string, Params...), Args&&... args) {
    std::function<asio::awaitable<result<T>>()> start =
        [state, call, owned = std::make_tuple(std::forward<Args>(args)...)]() mutable {
            return std::apply(
                [&](auto&... a) {
                    return (state->sandboxes.*call)(state->info.id, std::move(a)...);
                },
                owned);
        };
    return guarded(sandbox::impl::run<T>(std::move(state), what, limit, in, std::move(start)));
}

}  // namespace moat
