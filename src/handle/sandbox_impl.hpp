// The shared state behind a moat::sandbox handle (see sandbox.hpp for the contract). Background
// work (the destroy after a quarantine, running backend operations) holds it alive.
#pragma once

#include <moat/sandbox.hpp>
#include <moat/task_group.hpp>

#include "core/async_event.hpp"
#include "handle/operation_queue.hpp"
#include "handle/telemetry.hpp"

#include <cstdint>
#include <functional>
#include <optional>

namespace moat {

struct sandbox::impl : std::enable_shared_from_this<sandbox::impl> {
    impl(backend& b, sandbox_info i, handle_options o, std::function<void()> ended_hook,
         std::shared_ptr<moat::telemetry> t);

    // sandbox_unavailable with the cause if no operation may start; nullopt if one may.
    std::optional<error> refusal() const;
    // ready/busy -> quarantined, then a background destroy.
    void quarantine(const error& why);
    // Waits for this caller's turn (FIFO). nullopt: the caller holds the turn and must call
    // end_turn(); otherwise the error (cancelled, deadline_exceeded, sandbox_unavailable).
    asio::awaitable<std::optional<error>> acquire_turn(const char* what, deadline limit);
    // Gives the turn to the next operation.
    void end_turn();
    // Runs one backend operation while holding the turn, under the caller's deadline and
    // cancellation (stopped and confirmed within the kill grace, or quarantine). `start` makes
    // the backend's awaitable (a plain lambda, not a coroutine).
    template <class T>
    asio::awaitable<result<T>> run_in_turn(const char* what, deadline limit,
                                           std::function<asio::awaitable<result<T>>()> start);
    // acquire_turn + run_in_turn + end_turn.
    template <class T>
    asio::awaitable<result<T>> run(const char* what, deadline limit,
                                   std::function<asio::awaitable<result<T>>()> start);
    // Destroys the sandbox (or waits for the destroy under way) and returns its outcome.
    asio::awaitable<result<void>> destroy_now();

    backend& sandboxes;
    asio::any_io_executor executor;
    sandbox_info info;
    handle_options options;
    handle_state state = handle_state::ready;
    std::optional<error> cause;
    operation_queue queue;
    task_group tasks;
    async_event ended;  // destroyed or destroy_failed
    std::optional<result<void>> destroy_outcome;
    std::optional<std::uint64_t> running_task;
    std::function<void()> on_end;  // the runtime's live count
    // Dropping the last reference detaches instead of destroying: the sandbox was attached, or
    // created to survive its owner.
    bool detach_on_drop = false;
    // The runtime (and with it, by contract, the backend) is being destroyed: nothing may call
    // the backend any more. Background work left on the executor finds this and stops.
    bool backend_gone = false;
    std::shared_ptr<moat::telemetry> telemetry;

    // Reports one finished operation (metrics and the runtime's on_operation).
    void report(const char* what, std::optional<errc> failure,
                std::chrono::steady_clock::time_point called,
                std::chrono::steady_clock::time_point granted);
};

}  // namespace moat
