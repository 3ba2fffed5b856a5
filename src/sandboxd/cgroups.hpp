// Sandbox cgroups: memory, pids and cpu limits, on cgroup v1 or v2 behind one small interface.
// Nothing outside this interface (and its two implementations) knows which version is in use.
//
// At start, discover() reads the layout (cgroup_layout.hpp) and picks an implementation:
//  - v1 (cgroup_v1.cpp), on v1 and hybrid hosts whenever a v1 hierarchy carries memory, pids or
//    cpu. Each controller's parent is `<mount><own cgroup>/moat`; a sandbox gets `<parent>/<id>` in
//    every hierarchy that exists. Its commands share pid 1's cgroups.
//  - v2 (cgroup_v2.cpp), on unified hosts. The subtree moat may use is $MOAT_CGROUP_PARENT when
//    set (an existing cgroup2 directory), else its own cgroup when that is the root, or delegated
//    (a systemd unit with Delegate=yes, a container's cgroup namespace, or a cgroup owned by the
//    helper's uid). Because a cgroup with controllers enabled for its children may hold no
//    processes, the helper first moves the processes of its own cgroup into the leaf
//    `<own>/moat-leaf`, then enables the controllers for `<own>/moat`, the sandboxes' parent.
//    Each sandbox gets
//        <parent>/<id>            memory.max, memory.swap.max = 0, pids.max, cpu.max
//        <parent>/<id>/init       pid 1 (the agent) only
//        <parent>/<id>/commands   spawned processes; memory.oom.group = 1 (an OOM kill takes the
//                                 whole command tree, never pid 1)
//        <parent>/<id>/commands/c<n>  one per exec, made and reused by pid 1 (see agent.hpp)
//    pid 1 joins <id> before it makes its cgroup namespace (so that, under nsdelegate, the
//    namespace's root is the sandbox's cgroup and pid 1 may move processes below it) and init
//    right after; once it runs the agent, delegate() enables the memory controller for <id>'s
//    children and hands `commands` (and <id>/cgroup.procs, the common ancestor every move into a
//    command's cgroup is checked against) to the sandbox's root uid, so that pid 1 makes
//    per-command cgroups and clones commands straight into them (clone3 CLONE_INTO_CGROUP).
//  - On hybrid hosts the same <id>/{init,commands} tree is also made in the unified hierarchy,
//    which has no controllers there: it only tracks processes, so that each exec's whole tree is
//    known and killed (cgroup.kill) when its main process ends. Without a usable cgroup2 mount
//    (v1-only hosts) there are no per-command cgroups: the agent kills strays only when no other
//    command runs.
//  - On v1-only hosts with a freezer hierarchy, each sandbox also gets
//        <freezer mount><own>/moat/<id>           pid 1 stays out of it (it keeps running)
//        <freezer mount><own>/moat/<id>/commands  every command, which joins it before it execs
//    (the agent's fd 11, commands/tasks opened by the helper): pause (local_backend_pause.cpp)
//    writes FROZEN to its freezer.state. A freezer that cannot be made only leaves the sandbox
//    without pause, never fails it. Its processes die of SIGKILL only once thawed, so kill() and
//    try_remove() thaw it, and so does pid 1 before it exits (fd 12, its freezer.state).
//  - Where neither works, every controller reports why (and on v2, the exact fix) and a sandbox
//    that asks for a limit fails to be created unless the spec says best effort.
//
// Parents are left unlimited, so an operator can cap all sandboxes together.
#pragma once

#include <sys/types.h>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sandboxd/cgroup_layout.hpp"

namespace moat::sandboxd {

struct cgroup_limits {
    std::uint64_t memory_bytes = 0;    // 0 = no limit
    std::uint32_t pids_max = 0;        // 0 = no limit
    std::uint32_t cpu_millicores = 0;  // 0 = no limit
    bool best_effort = false;          // skip a limit that cannot be set instead of failing
};

// cgroup v1: the limit of a sandbox's TCP socket buffers (memory.kmem.tcp.limit_in_bytes), a
// quarter of its memory limit, charged besides it.
constexpr std::uint64_t tcp_buffer_bytes(std::uint64_t memory_bytes) {
    return memory_bytes / 4;
}

// One sandbox's cgroups.
struct sandbox_cgroups {
    // Per controller, the directory whose counters describe the sandbox ("" = not in that
    // hierarchy). On v2 all three are the sandbox's one directory.
    std::array<std::string, controller_count> paths;
    std::vector<std::string> dirs;     // every directory made, children first (removal order)
    std::uint32_t applied_layers = 0;  // wire::layer_cgroup_* whose limit is in force
    bool unified = false;              // v2: dirs is {init, commands, top}
    // Hybrid hosts: the sandbox's {init, commands, top} in the unified hierarchy (no limits, only
    // per-command tracking); empty elsewhere.
    std::vector<std::string> tracking_dirs;
    // v1-only hosts with a freezer: the sandbox's {commands, top} in the v1 freezer hierarchy
    // (pause), or empty.
    std::vector<std::string> freezer_dirs;

    bool empty() const { return dirs.empty() && tracking_dirs.empty() && freezer_dirs.empty(); }
};

// Descriptors, opened by the helper, through which a sandbox's processes join their cgroups by
// writing "0" (the kernel checks the opener's credentials and cgroup namespace, not the writer's).
// -1 = not used. close_all() closes the rest.
struct cgroup_join_fds {
    std::array<int, controller_count> init{-1, -1, -1};  // v1: pid 1, before its cgroup namespace
    // v2 (or the hybrid tracking tree): what pid 1 joins before it makes its cgroup namespace
    // (<id>/cgroup.procs under nsdelegate, else init/cgroup.procs) and after (init/cgroup.procs,
    // or -1).
    int unified_before_namespace = -1;
    int unified_after_namespace = -1;
    // The directory of the "before" cgroup (O_PATH): the helper clones pid 1 straight into it
    // (clone3 CLONE_INTO_CGROUP), so that pid 1 need not write the file above, which waits for an
    // RCU grace period on a global lock. The write is the fallback.
    int unified_dir = -1;
    int commands_dir = -1;   // v2: the commands' directory (O_PATH), handed to the agent as fd 8
    int commands_kill = -1;  // v2: commands/cgroup.kill (5.14+), fd 9
    // v1 freezer: commands/tasks, which each command writes "0" to before it execs (fd 11), and
    // commands/freezer.state, which pid 1 thaws before it exits (fd 12).
    int freezer_commands = -1;
    int freezer_state = -1;
    void close_all();
};

class cgroup_hierarchy;

class cgroups {
  public:
    cgroups();
    cgroups(const cgroups&) = delete;
    cgroups& operator=(const cgroups&) = delete;
    ~cgroups();

    // Finds the layout and prepares the parent. Never fails: a missing controller is reported by
    // available() and unavailable_reason().
    void discover();

    cgroup_layout_kind layout() const;
    bool available(controller c) const;
    // "memory cgroup: ...", with the fix where there is one, or "" when available.
    const std::string& unavailable_reason(controller c) const;
    // wire::layer_cgroup_* bits of the available controllers.
    std::uint32_t host_layers() const;

    // Creates the sandbox's cgroups and writes its limits. A requested limit that cannot be set
    // fails the call (unless best effort) with an errno and a detail naming the controller; on
    // failure nothing is left behind.
    int create(std::string_view sandbox_id, const cgroup_limits& limits, sandbox_cgroups& out,
               std::string& detail) const;

    // Opens the descriptors the sandbox's processes join through (see cgroup_join_fds). A task
    // moving itself into a v1 cgroup skips the threadgroup lock, whose write side waits for an
    // RCU grace period (about 5 ms per hierarchy on this kind of host once idle); writing a pid,
    // as another process would, pays that every time. A best-effort controller whose file cannot
    // be opened is removed and its bit cleared.
    int open_join(sandbox_cgroups& group, cgroup_join_fds& fds, bool best_effort,
                  std::string& detail) const;

    // Once pid 1 runs the agent (it has left <id> for init): enables the memory controller for
    // the sandbox's children, sets commands/memory.oom.group, and hands `commands` to `owner`
    // (the host uid of the sandbox's root) so that pid 1 can make per-command cgroups. A failure
    // on the tracking tree of a hybrid host drops the tracking (per-command cgroups are then
    // unavailable), never the sandbox; on v2 it fails the create.
    int delegate(sandbox_cgroups& group, uid_t owner, std::string& detail) const;

    // Kills every process in the sandbox's cgroups at once where the kernel can (v2
    // cgroup.kill); a no-op on v1.
    void kill(const sandbox_cgroups& group) const;

    // One non-blocking removal attempt: 0 when every directory is gone (then `group` is cleared),
    // EBUSY while a cgroup still counts a process (on v2: cgroup.events says populated 1, and
    // the group is killed again), or another errno. Never sleeps: the caller retries later.
    int try_remove(sandbox_cgroups& group) const;

  private:
    std::unique_ptr<cgroup_hierarchy> impl_;
    std::unique_ptr<cgroup_hierarchy> tracker_;  // hybrid hosts: the unified hierarchy, or null
    std::string freezer_parent_;                 // v1-only hosts: <freezer mount><own>/moat, or ""
};

// The implementations' interface (cgroup_v1.cpp, cgroup_v2.cpp).
class cgroup_hierarchy {
  public:
    virtual ~cgroup_hierarchy() = default;
    virtual cgroup_layout_kind layout() const = 0;
    virtual const std::string& unavailable_reason(controller c) const = 0;
    virtual int create(std::string_view sandbox_id, const cgroup_limits& limits,
                       sandbox_cgroups& out, std::string& detail) const = 0;
    virtual int open_join(sandbox_cgroups& group, cgroup_join_fds& fds, bool best_effort,
                          std::string& detail) const = 0;
    virtual int delegate(sandbox_cgroups& group, uid_t owner, std::string& detail) const = 0;
    virtual void kill(const sandbox_cgroups& group) const = 0;
    virtual int try_remove(sandbox_cgroups& group) const = 0;
};

// What the v1 and v2 implementations keep alike: the host's layout, and per controller why it
// is unavailable ("" where it is available).
class controller_hierarchy : public cgroup_hierarchy {
  public:
    cgroup_layout_kind layout() const final { return kind_; }
    const std::string& unavailable_reason(controller c) const final {
        return why_[static_cast<std::size_t>(c)];
    }

  protected:
    explicit controller_hierarchy(cgroup_layout_kind kind) : kind_(kind) {}

    cgroup_layout_kind kind_;
    std::array<std::string, controller_count> why_;
};

std::unique_ptr<cgroup_hierarchy> make_v1_hierarchy(const cgroup_layout& layout);
std::unique_ptr<cgroup_hierarchy> make_v2_hierarchy(const cgroup_layout& layout);
// The unified hierarchy of a hybrid host, for per-command tracking only: no controllers, no
// processes moved; unavailable (every create makes nothing) unless moat may write there.
std::unique_ptr<cgroup_hierarchy> make_v2_tracker(const cgroup_layout& layout);

}  // namespace moat::sandboxd
