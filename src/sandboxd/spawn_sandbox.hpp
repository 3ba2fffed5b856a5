// Creates one sandbox: clone(CLONE_VM | CLONE_PIDFD | namespaces) on a stack reused across
// creates, so no page tables are copied. While the child waits on a pipe, the parent writes its
// uid/gid maps, attaches its cgroups and protects it from the OOM killer; then it releases the
// child and waits for a close-on-exec pipe to reach EOF before touching the stack again.
//
// The child shares the helper's memory and TLS (errno included), so it makes raw system calls
// only and reads nothing but what the parent prepared before clone. It enters a cgroup namespace
// rooted at its own (already attached) cgroups, becomes root of its user namespace, builds its root
// (an overlay of the template root or of a template's layer, else the template root itself),
// mounts /proc, /tmp, /dev/shm and /workspace (and /home, for a layout with a home
// there; another user or home gets its own /etc/passwd and /etc/group bound over the template's,
// and the layout's directories outside /workspace are made), pivots into it, sets the hostname,
// brings up loopback, sets PR_SET_PDEATHSIG (unless the sandbox survives its owner), arranges its
// descriptors and, with no_new_privs and the seccomp filter in force, execs the agent from the
// helper's own executable:
//
//   fd 0, 1, 2  /dev/null
//   fd 3        the agent end of the control socket
//   fd 4        the uid slot lock (held for the sandbox's lifetime)
//   fd 7        survivors only: the bound attach socket the agent listens on
//   fd 8, 9     cgroup v2 (or a hybrid host's tracking tree): the commands' cgroup directory and
//               cgroup.kill (see cgroups.hpp)
//   fd 10       template sandboxes: their layer's lock file, locked shared for the sandbox's life
//               (template_store::lock_path_of)
//   fd 11, 12   v1-only hosts with a freezer: the commands' tasks and freezer.state in the v1
//               freezer (see cgroups.hpp)
//
// A failing step is reported precisely ("pivot_root: EINVAL") and leaves nothing running.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>
#include <cstdint>
#include <moat/errc.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "sandboxd/cgroups.hpp"
#include "sandboxd/python_env.hpp"
#include "sandboxd/uid_slots.hpp"

namespace moat::sandboxd {

struct spawn_request {
    std::string_view sandbox_id;
    std::uint64_t workspace_bytes = 0;  // 0 = tmpfs default (half of RAM; still charged to memcg)
    std::uint64_t tmp_bytes = 0;        // /tmp and /dev/shm, same rule
    std::uint64_t ttl_ms = 0;
    std::uint32_t max_processes = 0;  // RLIMIT_NPROC of commands (0 = none); see agent.hpp
    std::uint32_t open_files = 0;     // RLIMIT_NOFILE in the sandbox (0 = inherited)
    bool survive_owner = false;
    bool allow_sudo = false;        // pid 1 gets --allow-sudo (see agent.hpp)
    std::uint16_t egress_port = 0;  // non-zero: pid 1 gets --egress-port (see agent.hpp)
    int listen_socket = -1;    // survivors: the bound attach socket, passed to the agent as fd 7
    bool best_effort = false;  // for the cgroup attach
    // The layout (sandbox_layout, validated by the library); "" keeps a field's default (the
    // template's user name, /workspace, /workspace, /workspace/out).
    std::string_view user_name;
    std::string_view home;
    std::string_view workdir;
    std::string_view artifacts_dir;
    // "" or a template's layer (absolute): the sandbox's root is then an overlay of that layer,
    // mounted read-only and idmapped onto the sandbox's uid range, with a tmpfs upper of
    // workspace_bytes (docs/architecture.md, "Layers and ownership").
    std::string_view template_layer;
    // With a template_layer: its python3 interpreter (create_message::template_python), or "".
    std::string_view template_python;
};

struct spawned_sandbox {
    int pidfd = -1;           // close-on-exec
    int library_socket = -1;  // the library's end of the agent control socket, close-on-exec
    pid_t host_pid = 0;
    std::uint64_t start_time_ticks = 0;
};

struct spawn_failure {
    moat::errc code = moat::errc::backend_failure;
    int sys_errno = 0;
    std::string detail;
};

class sandbox_spawner {
  public:
    sandbox_spawner() = default;
    sandbox_spawner(const sandbox_spawner&) = delete;
    sandbox_spawner& operator=(const sandbox_spawner&) = delete;
    ~sandbox_spawner();

    // Once per helper. `template_bound` is what build_template_root bound below the template
    // root; `agent_exe_fd` is an O_RDONLY descriptor of this executable. Tries an idmapped mount of
    // the template root: where it works, a sandbox of no template gets a writable root (an
    // overlay of the template root), else the template root itself, read-only. Returns 0 or an
    // errno with `detail`.
    int init(std::string template_path, const std::vector<std::string>& template_bound,
             std::vector<sock_filter> filter, int agent_exe_fd, std::string& detail);

    // Whether a sandbox of no template gets a writable root (init's probe); "" or why not.
    bool writable_base() const noexcept { return writable_base_; }
    const std::string& writable_base_detail() const noexcept { return writable_base_detail_; }

    // Creates one sandbox whose cgroups (already created, limits written) are `group`. On
    // failure the child is killed and reaped; the caller still owns `slot` and `group`.
    bool spawn(const spawn_request& request, const uid_slot& slot, const cgroups& hierarchy,
               sandbox_cgroups& group, spawned_sandbox& out, spawn_failure& failure);

  private:
    std::string template_path_;
    // The template root's host binds, each NUL-terminated (child_args::base_binds).
    std::string base_binds_;
    int base_bind_count_ = 0;
    bool writable_base_ = false;
    std::string writable_base_detail_;
    std::vector<sock_filter> filter_;
    int agent_exe_fd_ = -1;
    void* stack_ = nullptr;
    python_envs python_envs_;
};

}  // namespace moat::sandboxd
