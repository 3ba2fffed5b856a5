// What a sandbox is asked to be (sandbox_spec) and what a backend reports about one (sandbox_info).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace moat {

// Resource limits of one sandbox, with their defaults. A limit the backend cannot enforce fails
// the create with errc::layer_unavailable naming it, unless sandbox_spec::best_effort.
struct resource_limits {
    std::uint64_t memory_bytes = std::uint64_t{1} << 30;       // cgroup memory, tmpfs included
    std::uint32_t pids = 256;                                  // cgroup pids (processes + threads)
    std::uint32_t cpu_millicores = 1000;                       // cgroup cpu quota; 1000 = one core
    std::uint64_t workspace_bytes = std::uint64_t{512} << 20;  // /workspace tmpfs size
    std::uint64_t tmp_bytes = std::uint64_t{64} << 20;         // /tmp and /dev/shm tmpfs size
};

struct sandbox_spec {
    // Root filesystem: "" is the backend's default (local: the host's /usr read-only plus a
    // curated /etc; e2b: the provider's default template).
    std::string template_name;
    // Environment every command sees, on top of PATH, HOME and LANG. Per-exec env overrides it.
    std::map<std::string, std::string> env;
    // Working directory of commands that do not set one. Absolute.
    std::string workdir = "/workspace";
    resource_limits limits;
    // Caller metadata, filterable in list(). Keys and values are printable ASCII.
    std::map<std::string, std::string> labels;
    // The sandbox ends itself this long after creation, even if no host process is alive (its
    // pid 1 enforces it). backend::async_extend_ttl moves it. At most max_ttl.
    std::chrono::milliseconds ttl = std::chrono::hours(1);
    static constexpr std::chrono::hours max_ttl{24 * 30};
    // Keep running after the creating process exits (until the TTL or an explicit destroy).
    bool survive_owner = false;
    // Skip isolation layers and limits this host cannot enforce instead of failing the create.
    bool best_effort = false;
};

enum class sandbox_state {
    running,  // pid 1 is alive and answering
    exited,   // pid 1 is gone (destroyed, TTL, crashed)
};

struct sandbox_info {
    std::string id;  // chosen by moat, never by a tenant
    sandbox_state state = sandbox_state::running;
    std::map<std::string, std::string> labels;
    std::chrono::system_clock::time_point created_at;
    std::chrono::system_clock::time_point expires_at;
    // Local backend: pid 1 as the host sees it, and the isolation layers applied ("user_ns",
    // "seccomp", "cgroup_memory", ...). Empty for remote backends.
    std::optional<int> host_pid;
    std::vector<std::string> layers;
    resource_limits limits;
    // The backend instance that created it (local: local_options::owner_instance) and whether it
    // outlives that instance's process.
    std::string owner_instance;
    bool survive_owner = false;
    // This backend created it (false: it was attached, or it is only known from the host's state).
    bool owned = true;
    // Current usage where the backend can see it (local: the sandbox's cgroups), filled by
    // backend::async_list (not by inspect, which stays cheap), as of the call.
    std::optional<std::uint64_t> memory_used_bytes;
    std::optional<std::uint64_t> pids_current;
};

// "running" or "exited".
const char* to_string(sandbox_state state) noexcept;

}  // namespace moat
