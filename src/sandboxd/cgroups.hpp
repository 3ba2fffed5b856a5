// cgroup v1 limits for sandboxes (memory, pids, cpu). At start the helper finds each controller's
// hierarchy and its own cgroup in it, and creates one parent `<mount><own cgroup>/moat` shared by
// every sandbox (left unlimited, so an operator can cap all sandboxes together). Each sandbox then
// gets `<parent>/<sandbox id>` in every hierarchy that exists, limits written before its pid 1 is
// attached. cgroup v2 controllers are not supported yet: on a pure v2 host every limit reports
// itself unavailable.
#pragma once

#include <sys/types.h>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace moat::sandboxd {

enum class controller { memory, pids, cpu };
inline constexpr std::size_t controller_count = 3;

struct cgroup_limits {
    std::uint64_t memory_bytes = 0;    // 0 = no limit
    std::uint32_t pids_max = 0;        // 0 = no limit
    std::uint32_t cpu_millicores = 0;  // 0 = no limit
    bool best_effort = false;          // skip a limit that cannot be set instead of failing
};

// One sandbox's cgroups; an empty path means the sandbox is not in that hierarchy.
struct sandbox_cgroups {
    std::array<std::string, controller_count> paths;
    std::uint32_t applied_layers = 0;  // wire::layer_cgroup_* whose limit is in force
};

class cgroups {
  public:
    // Finds the hierarchies and creates the parent cgroups. Never fails: a missing controller is
    // reported by available() and unavailable_reason().
    void discover();

    bool available(controller c) const { return !parents_[index(c)].empty(); }
    // "memory cgroup: no v1 hierarchy mounted", or "" when available.
    const std::string& unavailable_reason(controller c) const { return why_[index(c)]; }
    // wire::layer_cgroup_* bits of the available controllers.
    std::uint32_t host_layers() const;

    // Creates the sandbox's cgroups and writes its limits. A requested limit that cannot be set
    // fails the call (unless best effort) with an errno and a detail naming the controller; on
    // failure nothing is left behind.
    int create(std::string_view sandbox_id, const cgroup_limits& limits, sandbox_cgroups& out,
               std::string& detail) const;

    // Opens (as the helper, root) the `tasks` file of each of the sandbox's cgroups, for the
    // sandbox's first process to move itself in by writing "0". A task moving itself skips the
    // cgroup v1 threadgroup lock, whose write side waits for an RCU grace period (about 5 ms per
    // hierarchy on this kind of host once it has been idle); writing a pid to cgroup.procs, as
    // attach() does, pays that every time. Unused slots are -1; the caller closes the rest. A
    // best-effort controller whose file cannot be opened is removed and its bit cleared.
    int open_self_attach(sandbox_cgroups& group, std::array<int, controller_count>& fds,
                         bool best_effort, std::string& detail) const;

    // Removes the sandbox's cgroups (retrying briefly while the kernel still counts exiting
    // tasks). Returns the first errno, or 0. Paths are cleared.
    static int remove(sandbox_cgroups& group);

  private:
    static std::size_t index(controller c) { return static_cast<std::size_t>(c); }

    std::array<std::string, controller_count> parents_;
    std::array<std::string, controller_count> why_;
};

}  // namespace moat::sandboxd
