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
#include <utility>
#include <vector>

namespace moat {

class admission {
  public:
    // One admitted create, counted in flight until finish() or until the ticket goes (however:
    // an exception, a frame destroyed while suspended), which counts as a failed create. The
    // admission must outlive its tickets.
    class ticket {
      public:
        explicit ticket(admission* gate) : gate_(gate) {}
        ticket(ticket&& other) noexcept : gate_(std::exchange(other.gate_, nullptr)) {}
        ticket& operator=(ticket&&) = delete;
        ticket(const ticket&) = delete;
        ticket& operator=(const ticket&) = delete;
        ~ticket() { finish(false); }
        // The create is over (`created`: it made a live sandbox); later calls do nothing.
        void finish(bool created) {
            if (auto* gate = std::exchange(gate_, nullptr)) gate->create_finished(created);
        }

      private:
        admission* gate_;
    };

    admission(asio::any_io_executor executor, admission_limits limits);

    // Waits until a create may start, then counts it in flight for as long as the ticket lives.
    // limit_exceeded naming the limit at `limit`; cancelled if the caller cancels (a cancellation
    // that arrives just as room appears wins: nothing is taken).
    asio::awaitable<result<ticket>> async_admit(deadline limit);
    // A live sandbox (created or attached) was destroyed or given up.
    void sandbox_ended();
    // An attached sandbox counts as live.
    void sandbox_attached();

    const admission_stats& stats() const noexcept { return stats_; }

  private:
    // The admitted create finished; `created` counts a live sandbox.
    void create_finished(bool created);
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
