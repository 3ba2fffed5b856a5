// Reading a sandbox's cgroup v1 counters from the host (cgroupfs reads take microseconds).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace moat {

// The `oom_kill` counter of <memory_cgroup>/memory.oom_control, or nullopt if unreadable.
std::optional<std::uint64_t> read_oom_kill_count(const std::string& memory_cgroup);

}  // namespace moat
