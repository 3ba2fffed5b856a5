// Reading a sandbox's cgroup v1 counters from the host (cgroupfs reads take microseconds).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moat {

// The `oom_kill` counter of <memory_cgroup>/memory.oom_control, or nullopt if unreadable.
std::optional<std::uint64_t> read_oom_kill_count(const std::string& memory_cgroup);

// A file of a single number in one of `dirs` (the first that has it): memory.usage_in_bytes,
// pids.current. nullopt if none does.
std::optional<std::uint64_t> read_cgroup_number(const std::vector<std::string>& dirs,
                                                const char* file);

}  // namespace moat
