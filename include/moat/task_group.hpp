// moat::task_group: the owner of every coroutine moat spawns.
//
// A spawned task runs on the group's executor until it completes or the group cancels it. An
// exception that escapes a task is caught and logged (never swallowed silently, never fatal).
// Shutdown is `cancel_all()` then `co_await async_wait_all()`: the group tells every task to stop
// and waits until the last one has finished, so nothing outlives the objects it uses.
//
// Confined to its executor: call every member from a coroutine or handler running on it.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_type.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace moat {

class task_group {
  public:
    task_group(asio::any_io_executor executor, std::string name);
    task_group(const task_group&) = delete;
    task_group& operator=(const task_group&) = delete;
    // Emits terminal cancellation to tasks still running; they finish on their own afterwards.
    ~task_group();

    // Starts `task` and returns its id (for cancel()). Pass a named coroutine function's
    // awaitable, not a capturing lambda (g++ 12 miscompiles those; see docs/development.md).
    // Tasks spawned after cancel_all() are cancelled at once.
    std::uint64_t spawn(asio::awaitable<void> task);

    // Asks one task to stop; false if it has already finished.
    bool cancel(std::uint64_t task_id,
                asio::cancellation_type type = asio::cancellation_type::terminal);

    // Asks every running task to stop (Asio per-operation cancellation of the given type).
    void cancel_all(asio::cancellation_type type = asio::cancellation_type::terminal);

    // Completes when no task is running. Cancellation: none; cancel the tasks instead.
    asio::awaitable<void> async_wait_all();

    std::size_t size() const noexcept;
    const asio::any_io_executor& get_executor() const noexcept;

    struct state;  // implementation detail

  private:
    std::shared_ptr<state> state_;
};

}  // namespace moat
