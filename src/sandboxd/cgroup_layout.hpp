// Which cgroup layout this host has, read from /proc/self/mountinfo and /proc/self/cgroup: pure
// parsing, shared by the helper (which picks v1 or v2 from it) and `moat doctor` (which reports
// it). No I/O here besides the two reads in read_cgroup_layout(); the parser is unit-tested.
//
//   v1      only cgroup v1 hierarchies are mounted
//   hybrid  v1 hierarchies and a cgroup2 mount (systemd's "hybrid", e.g. /sys/fs/cgroup/unified):
//           limits use v1 whenever a v1 hierarchy carries memory, pids or cpu
//   v2      only the unified cgroup2 hierarchy (stock Debian 12, Ubuntu 22.04+, RHEL 9, ...)
//   none    no cgroup filesystem mounted at all
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace moat::sandboxd {

enum class controller { memory, pids, cpu };
inline constexpr std::size_t controller_count = 3;
inline constexpr std::array<const char*, controller_count> controller_names = {"memory", "pids",
                                                                               "cpu"};

enum class cgroup_layout_kind { none, v1, hybrid, v2 };
const char* to_string(cgroup_layout_kind kind);

struct v1_hierarchy {
    std::string mount_point;  // "" when no v1 hierarchy carries the controller
    std::string own;          // this process's cgroup in it, relative to the mount ("" = its root)
    bool listed = false;      // /proc/self/cgroup names this controller
};

struct cgroup_layout {
    cgroup_layout_kind kind = cgroup_layout_kind::none;
    std::array<v1_hierarchy, controller_count> v1;  // per controller
    // The v1 freezer hierarchy, where one is mounted: on hosts without a cgroup2 mount, pause
    // freezes a sandbox's commands there (cgroups.hpp).
    v1_hierarchy freezer;
    std::string v2_mount;  // the cgroup2 mount point, "" when none is mounted
    std::string v2_own;    // this process's cgroup from the "0::" line ("/" = the mount's root)
    bool v2_nsdelegate = false;  // mounted with nsdelegate: cgroup namespaces bound moves

    bool has_v1(controller c) const { return !v1[static_cast<std::size_t>(c)].mount_point.empty(); }
    // True when v1 carries any of memory, pids, cpu: then v1 is used for every limit.
    bool limits_use_v1() const;
    // <v2 mount><v2 own>: the cgroup2 directory this process is in, or "".
    std::string v2_own_dir() const;
};

// Parses the two files' text. A hierarchy mounted from a sub-cgroup shows paths relative to it.
cgroup_layout parse_cgroup_layout(std::string_view mountinfo, std::string_view self_cgroup);
// Reads /proc/self/mountinfo and /proc/self/cgroup.
cgroup_layout read_cgroup_layout();

// Small file helpers shared by the v1 and v2 code (no exceptions: the helper is built without).
std::string read_small_file(const std::string& path);
// Writes `text` in one write(2); 0 or the errno.
int write_small_file(const std::string& path, std::string_view text);
// True if the whitespace-separated `list` (cgroup.controllers, subtree_control) has `word`.
bool has_word(std::string_view list, std::string_view word);
// The value of `key` in a flat keyed file ("populated 1\nfrozen 0\n"), or -1.
long long keyed_value(std::string_view text, std::string_view key);

}  // namespace moat::sandboxd
