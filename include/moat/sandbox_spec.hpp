// What a sandbox is asked to be (sandbox_spec) and what a backend reports about one (sandbox_info).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace moat {

// Resource limits of one sandbox. Each limit is explicit or unset: unset means the backend's
// default (the local backend's are the default_* constants below; a remote backend may leave an
// unset limit to its template), so a backend can tell "asked for" from "default". No limit can be
// switched off: an explicit 0, which the kernel would read as "unlimited" (a tmpfs of size 0, a
// cgroup without a memory limit), fails the create with errc::invalid_argument naming the field,
// as does a value outside the range given per field. A limit the backend cannot enforce fails the
// create with errc::layer_unavailable naming it, unless sandbox_spec::best_effort.
//
// In sandbox_info::limits (what a backend reports) the same struct carries the effective values:
// the local backend sets every field (defaults resolved, /workspace after its clamp to half the
// memory limit); a remote backend leaves unset only what it cannot know.
struct resource_limits {
    // cgroup memory, tmpfs pages included; TCP socket buffers count on cgroup v2, and on v1 have
    // a limit of their own, a quarter of this one. At least 16 MiB.
    std::optional<std::uint64_t> memory_bytes;
    // cgroup pids (processes + threads) and RLIMIT_NPROC; 1 to 1000000.
    std::optional<std::uint32_t> pids;
    // cgroup cpu quota, 1000 = one core; 1 to 1000000.
    std::optional<std::uint32_t> cpu_millicores;
    // /workspace tmpfs size (at least 1 MiB; clamped to half the memory limit).
    std::optional<std::uint64_t> workspace_bytes;
    // /tmp and /dev/shm tmpfs size, each; at least 1 MiB.
    std::optional<std::uint64_t> tmp_bytes;
    // RLIMIT_NOFILE, soft and hard, of every process in the sandbox (pid 1 included), so that no
    // sandbox inherits the embedding process's hard limit; 64 to 65536 and at most the
    // application's own hard limit.
    std::optional<std::uint32_t> open_files;

    static constexpr std::uint64_t default_memory_bytes = std::uint64_t{1} << 30;
    static constexpr std::uint32_t default_pids = 256;
    static constexpr std::uint32_t default_cpu_millicores = 1000;
    static constexpr std::uint64_t default_workspace_bytes = std::uint64_t{512} << 20;
    static constexpr std::uint64_t default_tmp_bytes = std::uint64_t{64} << 20;
    // A shell, Python, gcc and git stay far below it; 256 processes x 1024 files bound one
    // sandbox to 262144 open files (see `moat doctor` for the host's fs.file-max).
    static constexpr std::uint32_t default_open_files = 1024;

    // These limits with every unset field replaced by its default_* constant.
    resource_limits with_defaults() const {
        resource_limits out = *this;
        if (!out.memory_bytes) out.memory_bytes = default_memory_bytes;
        if (!out.pids) out.pids = default_pids;
        if (!out.cpu_millicores) out.cpu_millicores = default_cpu_millicores;
        if (!out.workspace_bytes) out.workspace_bytes = default_workspace_bytes;
        if (!out.tmp_bytes) out.tmp_bytes = default_tmp_bytes;
        if (!out.open_files) out.open_files = default_open_files;
        return out;
    }
};

// Where things are inside a sandbox, for the layers above (the tool layer, `moat serve`) to ask
// for instead of assuming. Every path is absolute and normal (no "." or ".." component, no "//",
// no trailing '/', no NUL), at most max_path_bytes; `user` is empty or a plain POSIX user name
// ([a-z_][a-z0-9_-]*, at most max_user_bytes). A bad field fails the create with
// errc::invalid_argument naming it ("layout.home: ...").
//
// In sandbox_info::layout the same struct carries the effective layout, `user` resolved to the
// name commands run as. The local backend (see docs/architecture.md, "Sandbox layout"):
// - commands run as the sandbox's unprivileged uid 1000 (gid 1000), unless they ask for the
//   sandbox's root (exec_request::as_root, or sudo with allow_sudo); `user` names it in the
//   sandbox's /etc/passwd and /etc/group ("" keeps the template's name, "user"), whose entry has
//   `home` as its home directory. Files written through the file API are owned by the same uid.
// - `home` is /workspace or a directory under /tmp or /home; /home is then a tmpfs of its own, of
//   the /workspace size and charged to the same memory cgroup, writable and kept for the
//   sandbox's life. Other places fail the create (invalid_argument).
// - HOME is `home`; commands that name no cwd start in `workdir`; `artifacts_dir` must be under
//   /workspace, /tmp or /home. /workspace starts empty (as before layouts existed): each of
//   `home`, `workdir` and `artifacts_dir` under /tmp or /home is created at create time, with its
//   parents, owned by the sandbox user; under /workspace, whoever writes there first makes it.
struct sandbox_layout {
    // Who commands run as: "" is the backend's default; "user" under moat serve.
    std::string user;
    // HOME: writable, and persistent for the sandbox's life.
    std::string home = "/workspace";
    // The working directory of commands that do not set one.
    std::string workdir = "/workspace";
    // Where a model leaves files for the user (the tool layer's artifacts).
    std::string artifacts_dir = "/workspace/out";

    static constexpr std::size_t max_path_bytes = 255;
    static constexpr std::size_t max_user_bytes = 32;

    bool operator==(const sandbox_layout&) const = default;
};

// What a sandbox may reach on the network (see docs/network.md). Every sandbox has its own network
// namespace with loopback only, and no route out ever exists; a mode other than `none` adds one
// way out: a forward proxy at 127.0.0.1:proxy_port inside the sandbox, served on the host, which
// lets through only what the policy allows, and HTTP_PROXY / HTTPS_PROXY / http_proxy /
// https_proxy (http://127.0.0.1:3128) and NO_PROXY / no_proxy (localhost,127.0.0.1,::1) in every
// command's environment. Those variables are forced: a spec or exec env entry of the same name is
// replaced. A backend that cannot enforce a policy other than `none` refuses the create
// (errc::not_supported naming it), so nothing silently runs open.
//
// Validated at create: a bad pattern, address or range is errc::invalid_argument naming it (the
// rules are docs/network.md's): `allow_list` needs at least one host, `all` takes no host,
// `none` takes no entry at all. In sandbox_info::network the same struct carries what the
// sandbox was created with (the local backend keeps it in the record, so attach, inspect and
// list from another process report it too).
enum class network_mode {
    none,        // loopback only (the default)
    allow_list,  // only hosts matching allow_hosts, through the proxy
    all,         // any host through the proxy, asked for by name (the address checks still apply)
};

struct sandbox_network {
    network_mode mode = network_mode::none;
    // "pypi.org", "*.pythonhosted.org" (subdomains only), optionally ":PORT"; without a port,
    // 80 and 443.
    std::vector<std::string> allow_hosts;
    // "NAME=ADDR": the proxy resolves NAME to ADDR (repeat for several addresses), never by DNS.
    std::vector<std::string> resolve;
    // CIDRs ("10.20.0.0/16", "fd12::/16", "127.0.0.1/32") the proxy may connect to although they
    // are refused by default (loopback, private, link-local, ...; never the metadata addresses).
    std::vector<std::string> allow_addresses;

    // The proxy's port inside every sandbox whose mode is not none.
    static constexpr std::uint16_t proxy_port = 3128;

    bool operator==(const sandbox_network&) const = default;
};

const char* to_string(network_mode mode) noexcept;  // "none", "allow-list", "all"

struct sandbox_spec {
    // Root filesystem: "" is the backend's default (local: "base", the host's /usr read-only plus
    // a curated /etc; e2b: the provider's default template). Local: a template of the data
    // directory (templates.hpp), whose root the sandbox gets writable (an overlay with a tmpfs
    // upper, charged to its memory); an unknown name is invalid_argument.
    std::string template_name;
    // Environment every command sees, on top of PATH, HOME and LANG. Per-exec env overrides it.
    std::map<std::string, std::string> env;
    // Home, default working directory, artifacts directory and user (see sandbox_layout).
    sandbox_layout layout;
    resource_limits limits;
    // What the sandbox may reach on the network: nothing by default (see sandbox_network).
    sandbox_network network;
    // Caller metadata, filterable in list(). Keys and values are printable ASCII.
    std::map<std::string, std::string> labels;
    // The sandbox ends itself this long after creation, even if no host process is alive (its
    // pid 1 enforces it). backend::async_extend_ttl moves it. At most max_ttl.
    std::chrono::milliseconds ttl = std::chrono::hours(1);
    static constexpr std::chrono::hours max_ttl{24 * 30};
    // How long the sandbox may stay paused (backend::async_pause) before it ends: while it is
    // paused its TTL stands still and this limit counts instead (its pid 1 enforces it too).
    // Zero: no limit. At most max_ttl.
    std::chrono::milliseconds paused_lifetime = std::chrono::hours(24);
    // Keep running after the creating process exits (until the TTL or an explicit destroy).
    bool survive_owner = false;
    // Skip isolation layers and limits this host cannot enforce instead of failing the create.
    bool best_effort = false;
    // `sudo` inside the sandbox runs its command as the sandbox's root (as exec_request::as_root
    // does). Off: sudo says it is not allowed in this sandbox and exits 1. With it on, the
    // sandbox's user is no boundary inside the sandbox (docs/security.md). Local backend only;
    // moat serve turns it on, as E2B's sandboxes have it.
    bool allow_sudo = false;
};

enum class sandbox_state {
    running,  // pid 1 is alive and answering
    exited,   // pid 1 is gone (destroyed, TTL, crashed)
    paused,   // pid 1 is alive, its commands frozen (backend::async_pause); expires_at is the
              // end of its paused lifetime
};

struct sandbox_info {
    std::string id;  // chosen by moat, never by a tenant
    sandbox_state state = sandbox_state::running;
    std::map<std::string, std::string> labels;
    std::chrono::system_clock::time_point created_at;
    std::chrono::system_clock::time_point expires_at;
    // While paused: when it was paused, and the TTL it resumes with (what was left of it).
    std::optional<std::chrono::system_clock::time_point> paused_at;
    std::chrono::milliseconds ttl_left{0};
    // Local backend: pid 1 as the host sees it, and the isolation layers applied ("user_ns",
    // "seccomp", "cgroup_memory", ...). Empty for remote backends.
    std::optional<int> host_pid;
    std::vector<std::string> layers;
    // The effective limits (see resource_limits).
    resource_limits limits;
    // Local backend: the template it runs ("base" for the default root) and, for a template of
    // the data directory, its layer's digest ("sha256:...", templates.hpp).
    std::string template_name;
    std::string template_digest;
    // The effective layout (see sandbox_layout): kept in the local backend's record, so attach,
    // inspect and list from another process report it too.
    sandbox_layout layout;
    // What it was created with (see sandbox_network). e2b backend: create reports what was
    // asked; inspect and attach report what the provider's SandboxDetail says (an E2B host may
    // have narrowed it); a list entry reports what this backend holds, and none for a sandbox it
    // does not hold, as E2B's list carries no egress (inspect that one to know).
    sandbox_network network;
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
    // CPU time its processes used so far, and its writable filesystems' use (sandbox_usage).
    std::optional<std::uint64_t> cpu_time_us;
    std::optional<std::uint64_t> disk_used_bytes;
    std::optional<std::uint64_t> disk_total_bytes;
    // Local backend, a sandbox with a network: bytes its egress moved over its life, and the host
    // memory its proxied connections hold now (as last measured by the processes serving it).
    std::optional<std::uint64_t> egress_bytes_used;
    std::optional<std::uint64_t> egress_buffered_bytes;
};

// "running", "exited" or "paused".
const char* to_string(sandbox_state state) noexcept;

}  // namespace moat
