#include "sandboxd/cgroups.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <vector>

#include "wire/protocol.hpp"

namespace moat::sandboxd {
namespace {

constexpr std::array<const char*, controller_count> names = {"memory", "pids", "cpu"};
constexpr std::array<std::uint32_t, controller_count> layer_bits = {
    wire::layer_cgroup_memory, wire::layer_cgroup_pids, wire::layer_cgroup_cpu};

const char* errno_name(int err) {
    const char* name = ::strerrorname_np(err);
    return name != nullptr ? name : "E?";
}

std::string read_file(const char* path) {
    std::string text;
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return text;
    char buffer[4096];
    for (;;) {
        const ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n <= 0) break;
        text.append(buffer, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return text;
}

bool has_token(std::string_view list, std::string_view token) {
    while (!list.empty()) {
        const auto comma = list.find(',');
        if (list.substr(0, comma) == token) return true;
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
    }
    return false;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(std::string_view s) {
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 3 < s.size()) {
            const int value = (s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0');
            out.push_back(static_cast<char>(value));
            i += 3;
        } else {
            out.push_back(s[i]);
        }
    }
    return out;
}

std::vector<std::string_view> split(std::string_view line, char separator) {
    std::vector<std::string_view> fields;
    while (true) {
        const auto at = line.find(separator);
        fields.push_back(line.substr(0, at));
        if (at == std::string_view::npos) break;
        line.remove_prefix(at + 1);
    }
    return fields;
}

struct hierarchy {
    std::string mount_point;
    std::string root;  // the cgroup the mount shows as its root, usually "/"
};

// The v1 hierarchy that carries `name`, from /proc/self/mountinfo.
bool find_hierarchy(std::string_view mountinfo, std::string_view name, hierarchy& out) {
    for (std::string_view line : split(mountinfo, '\n')) {
        const auto dash = line.find(" - ");
        if (dash == std::string_view::npos) continue;
        const auto left = split(line.substr(0, dash), ' ');
        const auto right = split(line.substr(dash + 3), ' ');
        if (left.size() < 5 || right.size() < 3 || right[0] != "cgroup") continue;
        if (!has_token(right[2], name)) continue;
        out.mount_point = unescape(left[4]);
        out.root = unescape(left[3]);
        return true;
    }
    return false;
}

// This process's cgroup in the v1 hierarchy that carries `name`, from /proc/self/cgroup.
bool find_own_cgroup(std::string_view self_cgroup, std::string_view name, std::string& out) {
    for (std::string_view line : split(self_cgroup, '\n')) {
        const auto first = line.find(':');
        const auto second = line.find(':', first + 1);
        if (first == std::string_view::npos || second == std::string_view::npos) continue;
        if (!has_token(line.substr(first + 1, second - first - 1), name)) continue;
        out = std::string(line.substr(second + 1));
        return true;
    }
    return false;
}

int write_file(const std::string& dir, const char* file, std::uint64_t value) {
    const std::string path = dir + "/" + file;
    char text[24];
    const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
    (void)ec;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    const auto length = static_cast<std::size_t>(end - text);
    const int err = ::write(fd, text, length) == static_cast<ssize_t>(length) ? 0 : errno;
    ::close(fd);
    return err;
}

int write_limit(controller c, const std::string& dir, const cgroup_limits& limits,
                const char*& file) {
    switch (c) {
        case controller::memory: {
            file = "memory.limit_in_bytes";
            if (const int err = write_file(dir, file, limits.memory_bytes)) return err;
            // Memory + swap gets the same limit, so swap cannot extend a sandbox's memory. Without
            // swap accounting (no memsw files) the sandbox is told not to swap at all.
            file = "memory.memsw.limit_in_bytes";
            const int err = write_file(dir, file, limits.memory_bytes);
            if (err != ENOENT) return err;
            file = "memory.swappiness";
            return write_file(dir, file, 0);
        }
        case controller::pids:
            file = "pids.max";
            return write_file(dir, file, limits.pids_max);
        case controller::cpu: {
            file = "cpu.cfs_period_us";
            if (const int err = write_file(dir, file, 100000)) return err;
            // The kernel refuses quotas below 1 ms per period.
            file = "cpu.cfs_quota_us";
            return write_file(dir, file,
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

int remove_one(const std::string& path) {
    // A task that has been reaped can still be counted for a moment; wait up to ~100 ms.
    for (int attempt = 0;; ++attempt) {
        if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return 0;
        if (errno != EBUSY || attempt == 10) return errno;
        const timespec pause{0, 10'000'000};
        ::nanosleep(&pause, nullptr);
    }
}

}  // namespace

void cgroups::discover() {
    const std::string mountinfo = read_file("/proc/self/mountinfo");
    const std::string self_cgroup = read_file("/proc/self/cgroup");
    for (std::size_t i = 0; i < controller_count; ++i) {
        const std::string label = std::string(names[i]) + " cgroup: ";
        hierarchy h;
        std::string own;
        if (!find_hierarchy(mountinfo, names[i], h)) {
            why_[i] = label + "no v1 hierarchy mounted";
            continue;
        }
        if (!find_own_cgroup(self_cgroup, names[i], own)) {
            why_[i] = label + "not listed in /proc/self/cgroup";
            continue;
        }
        // A hierarchy mounted from a sub-cgroup shows paths relative to that cgroup.
        if (h.root != "/" && own.starts_with(h.root)) own.erase(0, h.root.size());
        if (own == "/") own.clear();
        std::string parent = h.mount_point + own + "/moat";
        if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
            why_[i] = label + "mkdir " + parent + ": " + errno_name(errno);
            continue;
        }
        parents_[i] = std::move(parent);
    }
}

std::uint32_t cgroups::host_layers() const {
    std::uint32_t layers = 0;
    for (std::size_t i = 0; i < controller_count; ++i) {
        if (!parents_[i].empty()) layers |= layer_bits[i];
    }
    return layers;
}

int cgroups::create(std::string_view sandbox_id, const cgroup_limits& limits, sandbox_cgroups& out,
                    std::string& detail) const {
    out = {};
    for (std::size_t i = 0; i < controller_count; ++i) {
        const auto c = static_cast<controller>(i);
        const bool strict = is_requested(c, limits) && !limits.best_effort;
        const std::string label = std::string(names[i]) + " cgroup: ";
        if (parents_[i].empty()) {
            if (!strict) continue;
            detail = why_[i];
            remove(out);
            return ENOENT;
        }
        std::string path = parents_[i] + "/" + std::string(sandbox_id);
        out.paths[i] = path;
        if (!is_duplicate(out, i)) {
            int err = ::mkdir(path.c_str(), 0755) == 0 ? 0 : errno;
            if (err == EEXIST) {
                // Left behind by a crashed helper: an empty one can be reused after removal.
                err = ::rmdir(path.c_str()) == 0 && ::mkdir(path.c_str(), 0755) == 0 ? 0 : errno;
            }
            if (err != 0) {
                out.paths[i].clear();
                if (!strict) continue;
                detail = label + "mkdir " + path + ": " + errno_name(err);
                remove(out);
                return err;
            }
        }
        if (is_requested(c, limits)) {
            const char* file = "";
            if (const int err = write_limit(c, path, limits, file)) {
                if (!is_duplicate(out, i)) ::rmdir(path.c_str());
                out.paths[i].clear();
                if (!strict) continue;
                detail = label + "write " + file + ": " + errno_name(err);
                remove(out);
                return err;
            }
        }
        out.applied_layers |= layer_bits[i];
    }
    return 0;
}

int cgroups::open_self_attach(sandbox_cgroups& group, std::array<int, controller_count>& fds,
                              bool best_effort, std::string& detail) const {
    fds.fill(-1);
    for (std::size_t i = 0; i < controller_count; ++i) {
        if (group.paths[i].empty() || is_duplicate(group, i)) continue;
        const std::string tasks = group.paths[i] + "/tasks";
        fds[i] = ::open(tasks.c_str(), O_WRONLY | O_CLOEXEC);
        if (fds[i] >= 0) continue;
        const int err = errno;
        if (!best_effort) {
            for (int& fd : fds) {
                if (fd >= 0) ::close(fd);
                fd = -1;
            }
            detail = std::string(names[i]) + " cgroup: open tasks: " + errno_name(err);
            return err;
        }
        ::rmdir(group.paths[i].c_str());
        for (std::size_t j = i + 1; j < controller_count; ++j) {
            if (group.paths[j] == group.paths[i]) {
                group.paths[j].clear();
                group.applied_layers &= ~layer_bits[j];
            }
        }
        group.paths[i].clear();
        group.applied_layers &= ~layer_bits[i];
    }
    return 0;
}

int cgroups::remove(sandbox_cgroups& group) {
    int first = 0;
    for (std::size_t i = controller_count; i-- > 0;) {
        if (group.paths[i].empty() || is_duplicate(group, i)) continue;
        const int err = remove_one(group.paths[i]);
        if (first == 0) first = err;
    }
    group.paths = {};
    group.applied_layers = 0;
    return first;
}

}  // namespace moat::sandboxd
