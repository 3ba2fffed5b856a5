// A sandbox's resource usage: one reading now (backend::async_usage, sandbox::async_usage), and a
// bounded history of readings turned into the series operators and E2B's getMetrics() show
// (usage_history). docs/lifecycle.md, "Usage and metrics".
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace moat {

// What a sandbox uses, as of `at`. A counter the backend cannot see is nullopt.
struct sandbox_usage {
    std::chrono::system_clock::time_point at;
    // CPU time its processes used since it started (local: its cgroup v2 tree's cpu.stat
    // usage_usec, present on hybrid hosts too), in microseconds.
    std::optional<std::uint64_t> cpu_time_us;
    // The CPUs it may use: its limit in whole CPUs, rounded up (at least 1).
    std::uint32_t cpu_count = 1;
    // Memory its processes hold without the page cache, the page cache, and its limit (0: none).
    std::optional<std::uint64_t> memory_used_bytes;
    std::optional<std::uint64_t> memory_cache_bytes;
    std::uint64_t memory_limit_bytes = 0;
    // Its writable filesystems (local: the workspace and /tmp), used and total.
    std::optional<std::uint64_t> disk_used_bytes;
    std::optional<std::uint64_t> disk_total_bytes;
};

// One point of a series: a reading, with the CPU it used since the reading before it as a share
// of its CPUs (0-100; nullopt for the first reading, or when CPU time is not known).
struct usage_sample {
    sandbox_usage usage;
    std::optional<double> cpu_used_percent;
};

// The last `capacity` readings of one sandbox, oldest first. Not thread-safe (one owner).
class usage_history {
  public:
    explicit usage_history(std::size_t capacity = 720) : capacity_(capacity ? capacity : 1) {}

    // Adds a reading (readings older than the last one are ignored: the series only moves on).
    void add(const sandbox_usage& reading);
    // The samples taken in [from, to], oldest first.
    std::vector<usage_sample> between(std::chrono::system_clock::time_point from,
                                      std::chrono::system_clock::time_point to) const;
    // The latest sample, if any.
    std::optional<usage_sample> latest() const;
    std::size_t size() const noexcept { return samples_.size(); }

  private:
    std::size_t capacity_;
    std::deque<usage_sample> samples_;
};

}  // namespace moat
