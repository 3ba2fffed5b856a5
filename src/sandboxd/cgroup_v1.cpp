// cgroup v1: one parent `<mount><own cgroup>/moat` per controller's hierarchy, one
// `<parent>/<sandbox id>` per sandbox in each (co-mounted hierarchies share a directory).
#include <fcntl.h>
#include <sys/stat.h>
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

const char* errno_name(int err) {
    const char* name = ::strerrorname_np(err);
    return name != nullptr ? name : "E?";
}

int write_number(const std::string& dir, const char* file, std::uint64_t value) {
    char text[24];
    const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
    (void)ec;
    return write_small_file(dir + "/" + file,
                            std::string_view(text, static_cast<std::size_t>(end - text)));
}

int write_limit(controller c, const std::string& dir, const cgroup_limits& limits,
                const char*& file) {
    switch (c) {
        case controller::memory: {
            file = "memory.limit_in_bytes";
            if (const int err = write_number(dir, file, limits.memory_bytes)) return err;
            // Memory + swap gets the same limit, so swap cannot extend a sandbox's memory. Without
            // swap accounting (no memsw files) the sandbox is told not to swap at all.
            file = "memory.memsw.limit_in_bytes";
            if (const int err = write_number(dir, file, limits.memory_bytes); err == ENOENT) {
                file = "memory.swappiness";
                if (const int none = write_number(dir, file, 0)) return none;
            } else if (err != 0) {
                return err;
            }
            // v1 charges TCP socket buffers only once this limit is written (v2 charges them to
            // memory.max by default), and to a counter of their own: without it a sandbox could
            // queue gigabytes in loopback connections and push the host past net.ipv4.tcp_mem.
            // A kernel without the file (v1 TCP accounting is deprecated) is left as it is.
            file = "memory.kmem.tcp.limit_in_bytes";
            const int err = write_number(dir, file, tcp_buffer_bytes(limits.memory_bytes));
            return err == ENOENT ? 0 : err;
        }
        case controller::pids:
            file = "pids.max";
            return write_number(dir, file, limits.pids_max);
        case controller::cpu: {
            file = "cpu.cfs_period_us";
            if (const int err = write_number(dir, file, 100000)) return err;
            // The kernel refuses quotas below 1 ms per period.
            file = "cpu.cfs_quota_us";
            return write_number(dir, file,
                                std::max<std::uint64_t>(1000, limits.cpu_millicores * 100ull));
        }
    }
    return EINVAL;
}

bool is_requested(controller c, const cgroup_limits& limits) {
    switch (c) {
        case controller::memory:
            return limits.memory_bytes != 0;
        case controller::pids:
            return limits.pids_max != 0;
        case controller::cpu:
            return limits.cpu_millicores != 0;
    }
    return false;
}

// True if an earlier controller shares this path (co-mounted hierarchies).
bool is_duplicate(const sandbox_cgroups& group, std::size_t i) {
    for (std::size_t j = 0; j < i; ++j) {
        if (!group.paths[i].empty() && group.paths[j] == group.paths[i]) return true;
    }
    return false;
}

int remove_dirs(sandbox_cgroups& group) {
    int first = 0;
    for (const auto& dir : group.dirs) {
        if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) continue;
        if (first == 0) first = errno;
    }
    if (first == 0) group = {};
    return first;
}

class v1_hierarchy_impl final : public controller_hierarchy {
  public:
    explicit v1_hierarchy_impl(const cgroup_layout& layout) : controller_hierarchy(layout.kind) {
        for (std::size_t i = 0; i < controller_count; ++i) {
            const std::string label = std::string(controller_names[i]) + " cgroup: ";
            const v1_hierarchy& h = layout.v1[i];
            if (h.mount_point.empty()) {
                why_[i] = label + "no v1 hierarchy mounted";
                if (layout.kind == cgroup_layout_kind::hybrid)
                    why_[i] += " (hybrid host: limits use v1 where it has any controller)";
                continue;
            }
            if (!h.listed) {
                why_[i] = label + "not listed in /proc/self/cgroup";
                continue;
            }
            std::string parent = h.mount_point + h.own + "/moat";
            if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
                why_[i] = label + "mkdir " + parent + ": " + errno_name(errno);
                continue;
            }
            parents_[i] = std::move(parent);
        }
    }

    int create(std::string_view sandbox_id, const cgroup_limits& limits, sandbox_cgroups& out,
               std::string& detail) const override {
        out = {};
        for (std::size_t i = 0; i < controller_count; ++i) {
            const auto c = static_cast<controller>(i);
            const bool strict = is_requested(c, limits) && !limits.best_effort;
            const std::string label = std::string(controller_names[i]) + " cgroup: ";
            if (parents_[i].empty()) {
                if (!strict) continue;
                detail = why_[i];
                remove_dirs(out);
                return ENOENT;
            }
            std::string path = parents_[i] + "/" + std::string(sandbox_id);
            out.paths[i] = path;
            if (!is_duplicate(out, i)) {
                int err = ::mkdir(path.c_str(), 0755) == 0 ? 0 : errno;
                if (err == EEXIST) {
                    // Left behind by a crashed helper: an empty one can be reused after removal.
                    err =
                        ::rmdir(path.c_str()) == 0 && ::mkdir(path.c_str(), 0755) == 0 ? 0 : errno;
                }
                if (err != 0) {
                    out.paths[i].clear();
                    if (!strict) continue;
                    detail = label + "mkdir " + path + ": " + errno_name(err);
                    remove_dirs(out);
                    return err;
                }
                out.dirs.push_back(path);
            }
            if (is_requested(c, limits)) {
                const char* file = "";
                if (const int err = write_limit(c, path, limits, file)) {
                    if (!is_duplicate(out, i)) {
                        ::rmdir(path.c_str());
                        out.dirs.pop_back();
                    }
                    out.paths[i].clear();
                    if (!strict) continue;
                    detail = label + "write " + file + ": " + errno_name(err);
                    remove_dirs(out);
                    return err;
                }
            }
            out.applied_layers |= layer_bits[i];
        }
        return 0;
    }

    int open_join(sandbox_cgroups& group, cgroup_join_fds& fds, bool best_effort,
                  std::string& detail) const override {
        for (std::size_t i = 0; i < controller_count; ++i) {
            if (group.paths[i].empty() || is_duplicate(group, i)) continue;
            const std::string tasks = group.paths[i] + "/tasks";
            fds.init[i] = ::open(tasks.c_str(), O_WRONLY | O_CLOEXEC);
            if (fds.init[i] >= 0) continue;
            const int err = errno;
            if (!best_effort) {
                fds.close_all();
                detail =
                    std::string(controller_names[i]) + " cgroup: open tasks: " + errno_name(err);
                return err;
            }
            const std::string dropped = group.paths[i];
            ::rmdir(dropped.c_str());
            std::erase(group.dirs, dropped);
            for (std::size_t j = i; j < controller_count; ++j) {
                if (group.paths[j] == dropped) {
                    group.paths[j].clear();
                    group.applied_layers &= ~layer_bits[j];
                }
            }
        }
        return 0;
    }

    int delegate(sandbox_cgroups&, uid_t, std::string&) const override { return 0; }
    void kill(const sandbox_cgroups&) const override {}  // v1 has no cgroup.kill

    int try_remove(sandbox_cgroups& group) const override { return remove_dirs(group); }

  private:
    std::array<std::string, controller_count> parents_;
};

}  // namespace

std::unique_ptr<cgroup_hierarchy> make_v1_hierarchy(const cgroup_layout& layout) {
    return std::make_unique<v1_hierarchy_impl>(layout);
}

}  // namespace moat::sandboxd
