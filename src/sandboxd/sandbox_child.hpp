// The sandbox's clone child, as the parent (spawn_sandbox.cpp) prepares and starts it: what it
// reads (child_args, filled before clone) and what it runs (child_main, sandbox_child.cpp). The
// child shares the helper's memory, so it makes raw system calls only and writes nothing but its
// failure record, which the parent reads once the exec pipe reaches EOF.
#pragma once

#include <linux/filter.h>
#include <cstddef>

#include "sandboxd/cgroups.hpp"
#include "sandboxd/python_env.hpp"

namespace moat::sandboxd {

// Everything the child needs, prepared by the parent before clone; the child only reads it,
// except for the failure record, which the parent reads after the exec pipe reaches EOF.
struct child_args {
    int attach_fds[controller_count];  // v1 cgroup files pid 1 joins through, or -1
    int unified_before_namespace;      // v2 cgroup.procs pid 1 joins before / after it makes its
    int unified_after_namespace;       // cgroup namespace, or -1 (see cgroup_join_fds); the first
                                       // is -1 when pid 1 was cloned into that cgroup
    int command_cgroup;                // v2: the commands' directory (fd 8), or -1
    int command_cgroup_kill;           // v2: the commands' cgroup.kill (fd 9), or -1
    int freezer_commands;              // v1 freezer: the commands' tasks (fd 11), or -1
    int freezer_state;                 // v1 freezer: the commands' freezer.state (fd 12), or -1
    int release_read;
    int release_write;
    int exec_pipe_write;
    int control;
    int slot_lock;
    int agent_exe;
    int listen_socket;  // survivors: the attach socket, else -1
    // A template sandbox, or one of no template with a writable root: the socket the parent
    // sends the idmapped layer (or template root) on, else -1.
    int layer_socket;
    char layer_options[64];  // its upper's tmpfs options
    // The layer is the template root: its /etc is moat's already, and the template root's host
    // binds (base_binds: `base_bind_count` paths relative to it, each NUL-terminated, the
    // spawner's, read-only) are bound again over the overlay.
    // A template sandbox: its layer's lock file, locked shared (template_store::lock_path_of),
    // which pid 1 keeps at fd 10 for the sandbox's life; else -1.
    int layer_lock;
    bool layer_is_base;
    const char* base_binds;
    int base_bind_count;
    bool survive_owner;
    const char* template_path;
    // The sandbox's Python environment (python_env.hpp; its tmpfs takes workspace_options), or
    // null: a root without python3, or a template root whose /opt is not a directory.
    const python_env_files* python;
    char tmp_options[64];
    char workspace_options[96];
    // The layout: /etc/passwd and /etc/group texts to bind over the template's (when
    // has_layout_etc), whether /home gets a tmpfs (home_options), and the directories to make
    // (relative to the template root, parents first), each NUL-terminated, `layout_dir_count`.
    bool has_layout_etc;
    bool mount_home;
    char home_options[96];
    char root_options[96];  // /root: root's home, root's own
    char passwd_text[512];
    char group_text[128];
    std::size_t passwd_length;
    std::size_t group_length;
    char layout_dirs[4096];
    int layout_dir_count;
    sock_fprog filter;
    char ttl_text[24];
    char max_processes_text[24];
    char open_files_text[24];
    char egress_port_text[8];
    const char* argv[13];
    const char* envp[2];
    int failed_step;
    int failed_errno;
};

// The child's entry point (`opaque` is its child_args): it never returns. Its steps are listed in
// the opening comment of spawn_sandbox.hpp.
int child_main(void* opaque);

// The name of a failed step (child_args::failed_step), as a create's error detail gives it.
const char* step_name(int failed_step);

}  // namespace moat::sandboxd
