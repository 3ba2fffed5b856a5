// moat::runtime: makes sandbox handles (sandbox.hpp) on one backend, with admission control.
//
// Admission: at most max_concurrent_creates creates in flight, at most creates_per_second
// (a token bucket of create_burst tokens) and at most max_live_sandboxes handles that are not yet
// destroyed. A create over a limit waits for room until the caller's deadline (or max_wait when
// the caller gave none) and then fails with errc::limit_exceeded naming the limit.
//
// Confined to the backend's executor. Outlives every handle it made.
#pragma once

#include <moat/backend.hpp>
#include <moat/deadline.hpp>
#include <moat/metrics.hpp>
#include <moat/sandbox.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace moat {

struct admission_limits {
    std::size_t max_concurrent_creates = 16;
    double creates_per_second = 200;
    std::size_t create_burst = 50;
    std::size_t max_live_sandboxes = 1000;
    // How long a create without a deadline waits for admission.
    std::chrono::milliseconds max_wait = std::chrono::seconds(30);
};

struct runtime_options {
    admission_limits admission;
    handle_options handle;
    // Called (on the executor) when any create, handle operation or destroy finishes; must not
    // block. The event names the sandbox, the operation and its id, the error and the timings.
    std::function<void(const operation_event&)> on_operation;
};

// What admission has seen, for operators and tests.
struct admission_stats {
    std::size_t creates_in_flight = 0;
    std::size_t peak_creates_in_flight = 0;
    std::size_t live_sandboxes = 0;
    std::size_t refused = 0;  // creates that failed with limit_exceeded
};

class runtime {
  public:
    explicit runtime(backend& sandboxes, runtime_options options = {});
    // Handles still alive are cut off from the backend: their operations fail with
    // sandbox_unavailable and their background destroys stop (the backend ends its own sandboxes
    // when it is destroyed).
    ~runtime();
    runtime(const runtime&) = delete;
    runtime& operator=(const runtime&) = delete;

    // Creates a sandbox (admission first) and returns its handle once pid 1 is ready.
    // Cancellation or the deadline during the backend's create destroys the half-made sandbox.
    asio::awaitable<result<std::shared_ptr<sandbox>>> async_create(sandbox_spec spec,
                                                                   deadline limit = {});
    // A handle to a sandbox another process created with survive_owner (backend::async_attach).
    // Counts as live for admission.
    asio::awaitable<result<std::shared_ptr<sandbox>>> async_attach(std::string id,
                                                                   deadline limit = {});

    admission_stats stats() const noexcept;
    // Counters and latency histograms since the runtime was made (to_prometheus() for text).
    runtime_metrics metrics() const;
    backend& get_backend() const noexcept;

    struct state;

  private:
    std::shared_ptr<state> state_;
};

}  // namespace moat
