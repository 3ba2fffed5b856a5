// Reading a sandbox's cgroup v1 counters from the host (cgroupfs reads take microseconds).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moat {

// The `oom_kill` counter of <memory_cgroup>/memory.oom_control, or nullopt if unreadable.
std::optional<std::uint64_t> read_oom_kill_count(const std::string& memory_cgroup);

// A sandbox's OOM kills as the library last saw them. The counter is read only when a command
// ends by SIGKILL (the OOM killer's signal), never on the exec path: a kill is the OOM killer's
// when the counter moved since the last look. Shared by the sandbox and its running commands.
struct oom_watch {
    std::string memory_cgroup;          // "" when the sandbox has no memory cgroup
    std::optional<std::uint64_t> seen;  // nullopt: unknown (unreadable)

    // Reads the counter; true if it grew since the last look (which it then becomes).
    bool counted_new_kill();
};

// A file of a single number in one of `dirs` (the first that has it): memory.usage_in_bytes,
// pids.current. nullopt if none does.
std::optional<std::uint64_t> read_cgroup_number(const std::vector<std::string>& dirs,
                                                const char* file);

}  // namespace moat
