// Admission control for creates on one backend (see runtime.hpp): concurrent creates, a
// create-rate token bucket and live sandboxes. Confined to one executor.
#pragma once

#include <moat/deadline.hpp>
#include <moat/result.hpp>
#include <moat/runtime.hpp>

#include "core/async_event.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <vector>

namespace moat {

class admission {
  public:
    admission(asio::any_io_executor executor, admission_limits limits);

    // Waits until a create may start, then counts it in flight. limit_exceeded naming the limit
    // at `limit`; cancelled if the caller cancels.
    asio::awaitable<result<void>> async_admit(deadline limit);
    // The admitted create finished; `created` counts a live sandbox.
    void create_finished(bool created);
    // A live sandbox (created or attached) was destroyed or given up.
    void sandbox_ended();
    // An attached sandbox counts as live.
    void sandbox_attached();

    const admission_stats& stats() const noexcept { return stats_; }

  private:
    // Empty if a create may start now, else the limit that stops it.
    const char* blocking_limit();
    void refill();
    void wake_waiters();

    asio::any_io_executor executor_;
    admission_limits limits_;
    admission_stats stats_;
    double tokens_;
    std::chrono::steady_clock::time_point refilled_at_;
    std::vector<std::shared_ptr<async_event>> waiters_;
};

}  // namespace moat
