// The state directory's record of each local sandbox (<state_dir>/sandboxes/<id>.json, see
// wire/state_layout.hpp): what another moat process needs to find, attach to, inspect, list or
// destroy a sandbox it did not create, and what a janitor needs after a crash.
//
// Records are written atomically (a temporary file in the same directory, renamed over the
// record), 0600 in a 0700 directory: the record holds the sandbox's environment, which may carry
// secrets. The creating backend writes a record before it asks the helper for the sandbox (init
// pid 0: "creating") and again once pid 1 exists, so no sandbox ever lacks one; whoever confirms
// the sandbox gone removes it. A change to a live sandbox's record (its end, its network) goes
// through update(), under a lock, so two processes' changes never undo each other; the network
// there is the one in force, which every process serving the sandbox's proxy follows
// (local_backend_network.cpp). Not fsync'd: records describe processes, which do not survive a
// power loss either.
//
// A record's pid is trusted only together with its start time (field 22 of /proc/<pid>/stat):
// open_live_init() returns a pidfd only if the process with that pid started at that time, so a
// reused pid is never mistaken for the sandbox.
#pragma once

#include <moat/local_backend.hpp>
#include <moat/result.hpp>
#include <moat/sandbox_spec.hpp>

#include "core/unique_fd.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat {

struct sandbox_record {
    std::string id;
    std::map<std::string, std::string> labels;
    std::string owner_instance;  // the creating backend (local_options::owner_instance)
    int owner_pid = 0;           // the creating process
    std::chrono::system_clock::time_point created_at;
    std::chrono::system_clock::time_point expires_at;
    bool survive_owner = false;
    int init_pid = 0;                    // pid 1 as the host sees it; 0 while the create runs
    std::uint64_t init_start_ticks = 0;  // its start time, for pid-reuse checks
    std::uint32_t uid_base = 0;          // host uid of sandbox uid 0
    std::vector<std::string> cgroups;    // absolute cgroup directories, removed once it is gone
    std::string memory_cgroup;           // the memory one (OOM accounting), or ""
    std::map<std::string, std::string> env;
    sandbox_layout layout;  // the effective one (user resolved)
    resource_limits limits;
    // In force: as asked for at create (validated), then as the last live update set it.
    sandbox_network network;
    // What a live update may widen it to (local_options::network_limit, else the create's).
    sandbox_network network_limit;
    // The template of the data directory it runs, and its layer's digest; "" for base.
    std::string template_name;
    std::string template_digest;
    std::vector<std::string> layers;
    local_egress_limits egress;  // its egress proxy's limits (records without them: defaults)
    // A destroy was asked for and not confirmed: the janitor finishes it.
    bool condemned = false;
    // Pause (local_backend_pause.cpp): how long it may stay paused (0: no limit); while paused,
    // when it was paused and the TTL it resumes with (expires_at is then the paused lifetime's
    // end). Records without them: never paused, the default lifetime.
    std::chrono::milliseconds paused_lifetime{std::chrono::hours(24)};
    std::optional<std::chrono::system_clock::time_point> paused_at;
    std::chrono::milliseconds ttl_left{0};
};

// Largest record file read (labels and environment are bounded by the spec's validation).
inline constexpr std::size_t max_record_bytes = 1024 * 1024;

std::string to_json(const sandbox_record& record);

// What a record says of its sandbox, without looking at the process (running, or paused as
// recorded; owned false).
sandbox_info describe_record(const sandbox_record& record);
// invalid_argument naming the first field that is missing or malformed.
result<sandbox_record> record_from_json(std::string_view json);

class sandbox_records {
  public:
    explicit sandbox_records(std::string state_dir) : state_dir_(std::move(state_dir)) {}

    const std::string& state_dir() const noexcept { return state_dir_; }
    std::string socket_path(std::string_view id) const;
    std::string egress_meter_path(std::string_view id) const;

    // Atomic replace. backend_failure naming the step if it cannot.
    result<void> write(const sandbox_record& record) const;
    // sandbox_not_found if there is no record; backend_failure if it is unreadable or corrupt.
    result<sandbox_record> read(std::string_view id) const;
    // Reads the record, lets `change` edit it (its error leaves the record as it was) and writes
    // it, under an exclusive lock (flock) on the sandboxes directory that every update() takes:
    // two processes' changes (a TTL, a network) never undo each other. Returns what was written.
    result<sandbox_record> update(std::string_view id,
                                  const std::function<result<void>(sandbox_record&)>& change) const;
    // Ids with a record, sorted; at most `limit`.
    std::vector<std::string> ids(std::size_t limit = 100'000) const;
    // Removes the record, the attach socket and the egress meter (missing files are fine).
    void remove(std::string_view id) const;

  private:
    std::string state_dir_;
};

// A pidfd of the record's pid 1 if it is alive and is the process the record names (same start
// time); sandbox_unavailable saying why not (still being created, exited, pid reused).
result<unique_fd> open_live_init(const sandbox_record& record);

// Whether the record's pid 1 is proven gone: no process has its pid, the process there started at
// another time (the pid was reused), or its pidfd reports it exited. False when it is alive or
// cannot be told (a record still being created, pidfd_open failing for another reason).
bool init_is_gone(const sandbox_record& record);

// Start time (field 22 of /proc/<pid>/stat) of a live process, or 0.
std::uint64_t process_start_ticks(int pid);

// One attempt to remove the record's cgroup directories (ENOENT counts as removed). Returns 0 or
// the first errno; EBUSY while the kernel still counts exiting tasks, so callers retry for a
// bounded time.
int remove_cgroups(const sandbox_record& record);
// Thaws the sandbox's commands where they are frozen in a v1 freezer (pause on a host without
// cgroup2): a process frozen there dies of SIGKILL only once thawed, and pid 1 cannot finish
// exiting before its processes have. A no-op elsewhere.
void thaw_v1_commands(const sandbox_record& record);

}  // namespace moat
