// Reading a sandbox's cgroup counters from the host (cgroupfs reads take microseconds), and
// removing its cgroup directories, on cgroup v1 and v2 alike: each function looks for the v1 file
// first, then the v2 one.
#pragma once

#include <moat/usage.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moat {

// OOM kills counted by <memory_cgroup>: `oom_kill` of memory.oom_control (v1) or of
// memory.events (v2, which counts the sandbox's child cgroups too); nullopt if unreadable.
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

// A file of a single number in one of `dirs` (the first that has it), e.g. pids.current. nullopt
// if none does.
std::optional<std::uint64_t> read_cgroup_number(const std::vector<std::string>& dirs,
                                                const char* file);

// Memory in use: memory.usage_in_bytes (v1) or memory.current (v2) of the first of `dirs` that
// has either.
std::optional<std::uint64_t> read_memory_used(const std::vector<std::string>& dirs);

// CPU time used, in microseconds: `usage_usec` of cpu.stat in the first of `dirs` that is a
// cgroup v2 directory (a hybrid host's unified tree has one for every sandbox), else
// cpuacct.usage (nanoseconds) of a v1 cpuacct directory among them. nullopt if none has either.
std::optional<std::uint64_t> read_cpu_time_us(const std::vector<std::string>& dirs);

// The page cache the memory cgroup among `dirs` holds: `cache` of memory.stat (v1) or `file`
// (v2). nullopt if none has it.
std::optional<std::uint64_t> read_memory_cache(const std::vector<std::string>& dirs);

// Used and total bytes of a sandbox's writable filesystems (its workspace, /tmp and home, each
// counted once), through `root`, a descriptor of its "/" (local_backend_usage.cpp); unset when
// none can be read.
void read_disk_usage(int root, sandbox_usage& usage);

// Removes a sandbox cgroup directory and the cgroups below it (v2: init/, commands/), children
// first. A v2 cgroup that still reports `populated 1` in cgroup.events is left alone (nothing is
// killed here). 0 (also when it is already gone), EBUSY while a process is still counted, or
// another errno.
int remove_cgroup_tree(const std::string& dir);

}  // namespace moat
