// Counters and latency histograms of a moat::runtime (create, each handle operation, destroy,
// time queued), readable as a struct and as Prometheus text, plus the structured event every
// operation produces.
#pragma once

#include <moat/errc.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace moat {

// A fixed-bucket latency histogram (milliseconds), cumulative like Prometheus's.
class latency_histogram {
  public:
    // Upper bounds of the buckets in milliseconds; a last, implicit bucket is +Inf.
    static constexpr std::array<double, 18> bounds_ms = {0.1,  0.25, 0.5,  1,     2.5,   5,
                                                         10,   25,   50,   100,   250,   500,
                                                         1000, 2500, 5000, 10000, 30000, 60000};

    void record(std::chrono::nanoseconds d) noexcept;
    std::uint64_t count() const noexcept { return count_; }
    double sum_ms() const noexcept { return sum_ms_; }
    // Observations at or below bounds_ms[i] (i < bounds_ms.size()), or all of them.
    std::uint64_t cumulative(std::size_t i) const noexcept;
    // The upper bound of the bucket holding quantile q (0..1): a conservative estimate; 0 when
    // empty, +Inf beyond the last bound.
    double quantile_ms(double q) const noexcept;

  private:
    std::array<std::uint64_t, bounds_ms.size() + 1> buckets_{};
    std::uint64_t count_ = 0;
    double sum_ms_ = 0;
};

// One handle operation (exec, exec_stream, spawn, write_files, ...) or a create or destroy.
struct operation_event {
    std::string sandbox_id;          // "" for a create that failed before it had one
    std::string operation;           // "create", "exec", "destroy", ...
    std::uint64_t operation_id = 0;  // unique per runtime
    std::optional<errc> error;       // nullopt: it succeeded
    std::chrono::nanoseconds queued{0};
    std::chrono::nanoseconds ran{0};
};

struct runtime_metrics {
    std::map<std::string, std::uint64_t> operations;   // by operation
    std::map<std::string, std::uint64_t> failures;     // by operation
    std::map<std::string, latency_histogram> latency;  // by operation, queue time excluded
    latency_histogram queue_wait;                      // every queued handle operation
    std::uint64_t quarantines = 0;
    std::uint64_t admission_refused = 0;
    std::uint64_t live_sandboxes = 0;
};

// Prometheus text exposition (version 0.0.4): moat_operations_total{operation=...},
// moat_operation_failures_total, moat_operation_duration_seconds (histogram),
// moat_queue_wait_seconds (histogram), moat_quarantines_total, moat_admission_refused_total,
// moat_live_sandboxes.
std::string to_prometheus(const runtime_metrics& metrics);

}  // namespace moat
