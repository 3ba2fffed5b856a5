// cgroup v2: the subtree moat may use, the helper's move into a leaf, and one
// <parent>/<id>/{init,commands} tree per sandbox (see cgroups.hpp); on hybrid hosts the same tree
// in the unified hierarchy, for per-command tracking only.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "sandboxd/cgroups.hpp"
#include "wire/protocol.hpp"

namespace moat::sandboxd {
namespace {

constexpr std::array<std::uint32_t, controller_count> layer_bits = {
    wire::layer_cgroup_memory, wire::layer_cgroup_pids, wire::layer_cgroup_cpu};
constexpr std::string_view leaf_name = "moat-leaf";  // where the helper's cgroup's processes go
constexpr const char* first_command_cgroup = "c0";   // see agent.hpp
// The fix comes before the path in every reason: the hello record's detail field is 255 bytes.
constexpr const char* delegate_fix =
    "run moat in a systemd unit with Delegate=yes, or in a container with its own cgroup "
    "namespace and a writable /sys/fs/cgroup (docs/embedding.md, Hosts)";

const char* errno_name(int err) {
    const char* name = ::strerrorname_np(err);
    return name != nullptr ? name : "E?";
}

std::string number_text(std::uint64_t value) {
    char text[24];
    const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
    (void)ec;
    return std::string(text, static_cast<std::size_t>(end - text));
}

bool exists(const std::string& path) {
    return ::access(path.c_str(), F_OK) == 0;
}

std::string parent_of(const std::string& dir) {
    return dir.substr(0, dir.rfind('/'));
}

// systemd marks a delegated cgroup with this extended attribute ("1").
bool has_delegate_mark(const std::string& dir) {
    for (const char* name : {"trusted.delegate", "user.delegate"}) {
        char value[4] = {};
        if (::getxattr(dir.c_str(), name, value, sizeof value) > 0 && value[0] == '1') return true;
    }
    return false;
}

// Moves every process of `from` into `to`, including this one.
int move_processes(const std::string& from, const std::string& to, std::string& detail) {
    // Processes may fork meanwhile: a few passes until `from` is empty.
    for (int pass = 0; pass < 8; ++pass) {
        const std::string procs = read_small_file(from + "/cgroup.procs");
        if (procs.empty()) return 0;
        std::string_view rest = procs;
        while (!rest.empty()) {
            const auto newline = rest.find('\n');
            const std::string_view pid = rest.substr(0, newline);
            rest.remove_prefix(newline == std::string_view::npos ? rest.size() : newline + 1);
            if (pid.empty()) continue;
            const int err = write_small_file(to + "/cgroup.procs", pid);
            // ESRCH: it exited in between.
            if (err != 0 && err != ESRCH) {
                detail = "move process " + std::string(pid) + " from " + from + " to " + to +
                         "/cgroup.procs: " + errno_name(err);
                return err;
            }
        }
    }
    detail = "move the processes of " + from + ": it keeps gaining new ones";
    return EBUSY;
}

// Removes the cgroups directly below `dir` (the per-command ones pid 1 made: a bounded number,
// since the agent reuses them and holds at most one per running command).
int remove_children(const std::string& dir) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return errno == ENOENT || errno == ENOTDIR ? 0 : errno;
    int err = 0;
    for (int seen = 0; seen < 4096; ++seen) {
        const dirent* e = ::readdir(d);
        if (e == nullptr) break;
        if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
        if (::unlinkat(::dirfd(d), e->d_name, AT_REMOVEDIR) != 0 && errno != ENOENT && err == 0)
            err = errno;
    }
    ::closedir(d);
    return err;
}

// Removes a sandbox's directories (children first) once its cgroup reports no process. Only a
// sandbox of this helper is killed again while populated, never a directory found in the way.
int remove_tree(sandbox_cgroups& group, bool is_ours) {
    const std::string& top = group.dirs.back();
    const std::string events = read_small_file(top + "/cgroup.events");
    if (keyed_value(events, "populated") == 1) {
        if (is_ours) (void)write_small_file(top + "/cgroup.kill", "1");
        return EBUSY;
    }
    for (const auto& dir : group.dirs) {
        // pid 1 makes (and reuses) per-command cgroups in `commands`; it may have died with some.
        if (const int err = remove_children(dir)) return err;
        if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) continue;
        return errno;
    }
    group = {};
    return 0;
}

class v2_hierarchy_impl final : public controller_hierarchy {
  public:
    v2_hierarchy_impl(const cgroup_layout& layout, bool tracking_only)
        : controller_hierarchy(layout.kind),
          tracking_only_(tracking_only),
          nsdelegate_(layout.v2_nsdelegate) {
        std::string detail;
        const int err =
            tracking_only ? find_tracking_parent(layout, detail) : find_parent(layout, detail);
        if (err != 0 || !detail.empty()) {
            // One reason for all three (the helper reports it once).
            for (auto& why : why_) why = "memory, pids and cpu cgroups: v2: " + detail;
            parent_.clear();
        }
    }

    int create(std::string_view sandbox_id, const cgroup_limits& limits, sandbox_cgroups& out,
               std::string& detail) const override {
        out = {};
        const std::array<bool, controller_count> requested = {
            limits.memory_bytes != 0, limits.pids_max != 0, limits.cpu_millicores != 0};
        for (std::size_t i = 0; i < controller_count; ++i) {
            if (requested[i] && !limits.best_effort && !why_[i].empty()) {
                detail = why_[i];
                return ENOENT;
            }
        }
        if (parent_.empty()) return 0;  // best effort, or nothing asked for, or no tracking
        const std::string dir = parent_ + "/" + std::string(sandbox_id);
        out.unified = true;
        out.dirs = {dir + "/init", dir + "/commands", dir};
        int err = ::mkdir(dir.c_str(), 0755) == 0 ? 0 : errno;
        if (err == EEXIST) {
            // Left behind by a crashed helper: an empty one can be reused after removal.
            err = remove_tree(out, false);
            out.unified = true;
            out.dirs = {dir + "/init", dir + "/commands", dir};
            if (err == 0) err = ::mkdir(dir.c_str(), 0755) == 0 ? 0 : errno;
        }
        if (err != 0) {
            out = {};
            if (limits.best_effort) return 0;
            detail = "cgroup v2: mkdir " + dir + ": " + errno_name(err);
            return err;
        }
        for (std::size_t i = 0; i < controller_count; ++i) {
            if (!why_[i].empty()) continue;
            if (requested[i]) {
                const char* file = "";
                if (const int write_err =
                        write_limit(static_cast<controller>(i), dir, limits, file)) {
                    if (limits.best_effort) continue;
                    detail = std::string(controller_names[i]) + " cgroup: write " + file + ": " +
                             errno_name(write_err);
                    discard(out);
                    return write_err;
                }
            }
            out.paths[i] = dir;
            out.applied_layers |= layer_bits[i];
        }
        // init and commands now; the memory controller for the children (and with it the
        // commands' memory.oom.group) only once pid 1 has left <id> for init (delegate()).
        err = 0;
        const char* step = "";
        if (::mkdir(out.dirs[0].c_str(), 0755) != 0) {
            err = errno;
            step = "mkdir init";
        }
        if (err == 0 && ::mkdir(out.dirs[1].c_str(), 0755) != 0) {
            err = errno;
            step = "mkdir commands";
        }
        // The first exec's own cgroup, made here so that no exec pays for a mkdir until several
        // run at once (the agent makes the rest; removal takes it with the other children).
        if (err == 0 && ::mkdir((out.dirs[1] + "/" + first_command_cgroup).c_str(), 0755) != 0) {
            err = errno;
            step = "mkdir commands/c0";
        }
        if (err != 0) {
            detail = "cgroup v2: " + dir + ": " + step + ": " + errno_name(err);
            discard(out);
            return err;
        }
        return 0;
    }

    int delegate(sandbox_cgroups& group, uid_t owner, std::string& detail) const override {
        if (group.dirs.size() != 3) return 0;
        const std::string& top = group.dirs[2];
        const std::string& commands = group.dirs[1];
        const bool memory = !tracking_only_ && why_[0].empty();
        const char* step = "write cgroup.subtree_control";
        int err = memory ? write_small_file(top + "/cgroup.subtree_control", "+memory") : 0;
        if (err == 0 && memory) {
            // An OOM kill takes the whole command tree, never pid 1.
            step = "write commands/memory.oom.group";
            err = write_small_file(commands + "/memory.oom.group", "1");
        }
        // pid 1 (the sandbox's root, `owner` on the host) makes per-command cgroups in
        // `commands` and clones commands into them; every such move is also checked against the
        // common ancestor's cgroup.procs, <id>'s. Commands run as another uid and can do neither.
        const std::string first = commands + "/" + first_command_cgroup;
        for (const std::string& path : {commands, commands + "/cgroup.procs", first,
                                        first + "/cgroup.procs", top + "/cgroup.procs"}) {
            if (err != 0) break;
            step = "chown";
            if (::chown(path.c_str(), owner, static_cast<gid_t>(-1)) != 0) err = errno;
        }
        if (err != 0) detail = "cgroup v2: " + top + ": " + step + ": " + errno_name(err);
        return err;
    }

    int open_join(sandbox_cgroups& group, cgroup_join_fds& fds, bool best_effort,
                  std::string& detail) const override {
        if (group.dirs.size() != 3) return 0;
        // Under nsdelegate a cgroup namespace bounds every move its processes make: pid 1 makes
        // its namespace in <id>, so that commands/c<n> is inside it, then moves on to init.
        const std::string init = group.dirs[0] + "/cgroup.procs";
        const std::string top = group.dirs[2] + "/cgroup.procs";
        const std::string& before = nsdelegate_ ? top : init;
        fds.unified_before_namespace = ::open(before.c_str(), O_WRONLY | O_CLOEXEC);
        int err = fds.unified_before_namespace < 0 ? errno : 0;
        const std::string* failed = &before;
        if (err == 0 && nsdelegate_) {
            fds.unified_after_namespace = ::open(init.c_str(), O_WRONLY | O_CLOEXEC);
            if (fds.unified_after_namespace < 0) {
                err = errno;
                failed = &init;
            }
        }
        if (err == 0) {
            const std::string& dir = nsdelegate_ ? group.dirs[2] : group.dirs[0];
            fds.unified_dir = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
            fds.commands_dir = ::open(group.dirs[1].c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (fds.commands_dir < 0) {
                err = errno;
                failed = &group.dirs[1];
            }
        }
        if (err != 0) {
            detail = "cgroup v2: open " + *failed + ": " + errno_name(err);
            for (int* fd : {&fds.unified_before_namespace, &fds.unified_after_namespace,
                            &fds.unified_dir, &fds.commands_dir}) {
                if (*fd >= 0) ::close(*fd);
                *fd = -1;
            }
            if (!best_effort && !tracking_only_) return err;
            detail.clear();
            discard(group);
            return 0;
        }
        // cgroup.kill came with Linux 5.14; without it the agent kills by signal alone.
        const std::string kill_file = group.dirs[1] + "/cgroup.kill";
        fds.commands_kill = ::open(kill_file.c_str(), O_WRONLY | O_CLOEXEC);
        return 0;
    }

    void kill(const sandbox_cgroups& group) const override {
        if (!group.dirs.empty()) (void)write_small_file(group.dirs.back() + "/cgroup.kill", "1");
    }

    int try_remove(sandbox_cgroups& group) const override { return remove_tree(group, true); }

  private:
    // Sets parent_ (and the reasons of unavailable controllers). A non-empty `detail` makes every
    // controller unavailable.
    int find_parent(const cgroup_layout& layout, std::string& detail) {
        if (layout.v2_mount.empty()) {
            detail = "no cgroup2 hierarchy mounted";
            return ENOENT;
        }
        std::string base = layout.v2_own_dir();
        bool in_leaf = false;
        if (base.size() > leaf_name.size() && base.ends_with(leaf_name) &&
            base[base.size() - leaf_name.size() - 1] == '/') {
            // An earlier helper of this process already made the leaf and moved us into it.
            base = parent_of(base);
            in_leaf = true;
        }
        // The root cgroup has no cgroup.type, and may hold processes beside enabled controllers.
        const bool is_root = !exists(base + "/cgroup.type");
        const bool delegated = is_root || layout.v2_own == "/" || has_delegate_mark(base) ||
                               (::geteuid() != 0 && owned_by_us(base));
        if (!delegated) {
            detail =
                std::string("moat's cgroup is not delegated to it: ") + delegate_fix + ": " + base;
            return EPERM;
        }
        const std::string controllers = read_small_file(base + "/cgroup.controllers");
        for (std::size_t i = 0; i < controller_count; ++i) {
            if (has_word(controllers, controller_names[i])) continue;
            why_[i] = std::string(controller_names[i]) + " cgroup: v2: controller not delegated (" +
                      (is_root ? "this kernel or mount lacks it"
                               : "Delegate=yes delegates every controller") +
                      "): cgroup.controllers of " + base + " is '" + trimmed(controllers) + "'";
        }
        if (!is_root && !in_leaf) {
            // No internal processes: everything in `base` moves to a leaf before controllers are
            // enabled for its children.
            const std::string leaf = base + "/" + std::string(leaf_name);
            if (::mkdir(leaf.c_str(), 0755) != 0 && errno != EEXIST) {
                detail = "mkdir " + leaf + ": " + errno_name(errno);
                return errno;
            }
            if (const int err = move_processes(base, leaf, detail)) return err;
        }
        if (const int err = enable_controllers(base, detail)) return err;
        parent_ = base + "/moat";
        if (::mkdir(parent_.c_str(), 0755) != 0 && errno != EEXIST) {
            detail = "mkdir " + parent_ + ": " + errno_name(errno);
            return errno;
        }
        return enable_controllers(parent_, detail);
    }

    // Hybrid hosts: `<own>/moat` in the unified hierarchy, which carries no controllers, so no
    // process has to move and nothing is enabled. Only where moat may write there: its own
    // cgroup is the root, or delegated to it.
    int find_tracking_parent(const cgroup_layout& layout, std::string& detail) {
        if (layout.v2_mount.empty()) {
            detail = "no cgroup2 hierarchy mounted";
            return ENOENT;
        }
        const std::string base = layout.v2_own_dir();
        const bool is_root = !exists(base + "/cgroup.type");
        if (!is_root && !has_delegate_mark(base) && !owned_by_us(base)) {
            detail = "moat's unified cgroup is not delegated to it: " + base;
            return EPERM;
        }
        parent_ = base + "/moat";
        if (::mkdir(parent_.c_str(), 0755) != 0 && errno != EEXIST) {
            detail = "mkdir " + parent_ + ": " + errno_name(errno);
            return errno;
        }
        for (std::size_t i = 0; i < controller_count; ++i) {
            why_[i] =
                std::string(controller_names[i]) + " cgroup: the unified hierarchy only tracks";
        }
        return 0;
    }

    int enable_controllers(const std::string& dir, std::string& detail) {
        const std::string file = dir + "/cgroup.subtree_control";
        const std::string enabled = read_small_file(file);
        for (std::size_t i = 0; i < controller_count; ++i) {
            if (!why_[i].empty() || has_word(enabled, controller_names[i])) continue;
            const std::string text = std::string("+") + controller_names[i];
            if (const int err = write_small_file(file, text)) {
                if (err == EBUSY) {
                    detail = "write " + file + ": EBUSY (" + dir +
                             " holds processes, and a cgroup with controllers for its children "
                             "may not: start moat in its own cgroup)";
                    return err;
                }
                why_[i] = std::string(controller_names[i]) + " cgroup: v2: write '" + text +
                          "' to " + file + ": " + errno_name(err);
            }
        }
        return 0;
    }

    static bool owned_by_us(const std::string& dir) {
        struct stat st {};
        return ::stat((dir + "/cgroup.procs").c_str(), &st) == 0 && st.st_uid == ::geteuid();
    }

    static std::string trimmed(std::string text) {
        while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
        return text;
    }

    static int write_limit(controller c, const std::string& dir, const cgroup_limits& limits,
                           const char*& file) {
        switch (c) {
            case controller::memory: {
                file = "memory.max";
                if (const int err =
                        write_small_file(dir + "/" + file, number_text(limits.memory_bytes)))
                    return err;
                // No swap beyond the memory limit; a kernel without swap accounting has no file.
                file = "memory.swap.max";
                const int err = write_small_file(dir + "/" + file, "0");
                return err == ENOENT ? 0 : err;
            }
            case controller::pids:
                file = "pids.max";
                return write_small_file(dir + "/" + file, number_text(limits.pids_max));
            case controller::cpu: {
                // The kernel refuses quotas below 1 ms per period.
                file = "cpu.max";
                const std::uint64_t quota =
                    std::max<std::uint64_t>(1000, limits.cpu_millicores * 100ull);
                return write_small_file(dir + "/" + file, number_text(quota) + " 100000");
            }
        }
        return EINVAL;
    }

    static void discard(sandbox_cgroups& group) {
        for (const auto& dir : group.dirs) ::rmdir(dir.c_str());
        group = {};
    }

    bool tracking_only_;
    bool nsdelegate_;
    std::string parent_;
};

}  // namespace

std::unique_ptr<cgroup_hierarchy> make_v2_hierarchy(const cgroup_layout& layout) {
    return std::make_unique<v2_hierarchy_impl>(layout, false);
}

std::unique_ptr<cgroup_hierarchy> make_v2_tracker(const cgroup_layout& layout) {
    return std::make_unique<v2_hierarchy_impl>(layout, true);
}

}  // namespace moat::sandboxd
