// What the local janitor decides from the state directory and the cgroup tree: pure functions,
// so the rules are testable without a crash to clean up after.
#pragma once

#include "local/sandbox_records.hpp"

#include <chrono>
#include <set>
#include <string>
#include <vector>

namespace moat {

// Why a recorded sandbox must go, or "" if the janitor must leave it alone (alive, unexpired,
// and its owner alive or it survives its owner).
std::string janitor_reason(const sandbox_record& record, std::chrono::system_clock::time_point now);

// Whether any moat process may remove the record's sandbox (cgroups, socket, record) at once,
// without the janitor: its pid 1 is proven gone (init_is_gone), and it survived its owner or its
// owner process is gone too (a live owner cleans up its own sandboxes).
bool is_sweepable(const sandbox_record& record);

// The `moat` cgroup directories sandbox cgroups live in: the parents of the recorded ones, and
// this process's own (<own cgroup>/moat in each v1 hierarchy and in the v2 one).
std::set<std::string> moat_cgroup_parents(const std::vector<sandbox_record>& records);

// How old an unrecorded cgroup, attach socket or temporary record must be before the janitor
// calls it orphaned. A create makes the cgroups and the socket before it writes the record, and
// the cgroup parents are shared by every state directory on the host (a sandbox recorded in
// another one has no record here): the age and the emptiness checks keep the janitor away from
// both.
inline constexpr std::chrono::seconds orphan_min_age{60};

// Sandbox cgroup directories (moat/sb-...) under `parents` whose id has no record, that are older
// than orphan_min_age and hold no process anywhere in their tree.
std::vector<std::string> orphaned_cgroups(const std::set<std::string>& parents,
                                          const std::set<std::string>& recorded_ids,
                                          std::chrono::system_clock::time_point now);

// Files in the sandboxes directory that belong to no record and are older than orphan_min_age:
// attach sockets of sandboxes without a record, and temporary record files.
std::vector<std::string> orphaned_files(const std::string& sandboxes_dir,
                                        const std::set<std::string>& recorded_ids,
                                        std::chrono::system_clock::time_point now);

}  // namespace moat
