#include "local/janitor_rules.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <cerrno>
#include <fstream>
#include <sstream>

namespace moat {
namespace {

// A record's id shape (sandbox_id.hpp): "sb-" and 20 hex digits.
bool looks_like_id(std::string_view name) {
    if (name.size() != 23 || !name.starts_with("sb-")) return false;
    for (const char c : name.substr(3)) {
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
}

bool process_exists(int pid) {
    return pid > 0 && (::kill(pid, 0) == 0 || errno != ESRCH);
}

// Where the cgroup2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid
// hosts), or "".
std::string cgroup2_mount() {
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
        const auto dash = line.find(" - cgroup2 ");
        if (dash == std::string::npos) continue;
        std::istringstream fields(line.substr(0, dash));
        std::string field, mount_point;
        for (int i = 0; i < 5 && fields >> field; ++i) mount_point = field;
        return mount_point;
    }
    return "";
}

constexpr auto ttl_slack = std::chrono::seconds(30);
constexpr auto unfinished_create = std::chrono::minutes(10);

bool older_than(const std::string& path, std::chrono::system_clock::time_point now,
                std::chrono::seconds age) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 &&
           now - std::chrono::system_clock::from_time_t(st.st_mtime) > age;
}

// Whether any cgroup in the tree at `dir` holds a process (a cgroup.procs that is not empty). An
// unreadable one counts as populated: the janitor leaves what it cannot prove empty.
bool cgroup_tree_populated(const std::string& dir, int depth = 0) {
    if (depth > 8) return true;
    std::ifstream procs(dir + "/cgroup.procs");
    if (!procs) return true;
    if (procs.peek() != std::ifstream::traits_type::eof()) return true;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return true;
    bool populated = false;
    while (dirent* entry = ::readdir(d)) {
        const std::string_view name = entry->d_name;
        if (entry->d_type != DT_DIR || name == "." || name == "..") continue;
        if (cgroup_tree_populated(dir + "/" + std::string(name), depth + 1)) {
            populated = true;
            break;
        }
    }
    ::closedir(d);
    return populated;
}

}  // namespace

std::string janitor_reason(const sandbox_record& r, std::chrono::system_clock::time_point now) {
    if (r.init_pid == 0) {
        if (!process_exists(r.owner_pid))
            return "its creation never finished (its creator is gone)";
        if (now - r.created_at > unfinished_create) return "its creation never finished";
        return "";
    }
    if (!open_live_init(r)) return "its pid 1 is gone (stale record)";
    if (r.condemned) return "an earlier destroy was not confirmed";
    if (now > r.expires_at + ttl_slack) return "it is past its TTL";
    if (!r.survive_owner && !process_exists(r.owner_pid)) return "its owner process is gone";
    return "";
}

bool is_sweepable(const sandbox_record& r) {
    return init_is_gone(r) && (r.survive_owner || !process_exists(r.owner_pid));
}

std::set<std::string> moat_cgroup_parents(const std::vector<sandbox_record>& records) {
    std::set<std::string> parents;
    for (const auto& r : records) {
        for (const auto& dir : r.cgroups) {
            const auto slash = dir.rfind('/');
            if (slash != std::string::npos && slash > 0) parents.insert(dir.substr(0, slash));
        }
    }
    // This process's own cgroup in each v1 hierarchy (a helper started here puts its sandboxes
    // under <own>/moat) and in the v2 one (there the helper moves this process into
    // <own>/moat-leaf, and its sandboxes go under <own>/moat).
    std::ifstream self("/proc/self/cgroup");
    std::string line;
    while (std::getline(self, line)) {
        // "4:memory:/path" (v1) or "0::/path" (v2)
        const auto first = line.find(':');
        const auto second = line.find(':', first + 1);
        if (first == std::string::npos || second == std::string::npos) continue;
        const std::string controllers = line.substr(first + 1, second - first - 1);
        const std::string path = line.substr(second + 1);
        if (line.starts_with("0::")) {
            const std::string mount = cgroup2_mount();
            if (mount.empty()) continue;
            std::string own = path == "/" ? "" : path;
            parents.insert(mount + own + "/moat");
            if (own.ends_with("/moat-leaf"))
                parents.insert(mount + own.substr(0, own.size() - 10) + "/moat");
            continue;
        }
        std::stringstream list(controllers);
        std::string controller;
        while (std::getline(list, controller, ',')) {
            if (controller != "memory" && controller != "pids" && controller != "cpu") continue;
            std::string mount = "/sys/fs/cgroup/" + controllers;
            struct stat st {};
            if (::stat(mount.c_str(), &st) != 0) mount = "/sys/fs/cgroup/" + controller;
            parents.insert(mount + (path == "/" ? "" : path) + "/moat");
        }
    }
    return parents;
}

std::vector<std::string> orphaned_cgroups(const std::set<std::string>& parents,
                                          const std::set<std::string>& recorded_ids,
                                          std::chrono::system_clock::time_point now) {
    std::vector<std::string> out;
    for (const auto& parent : parents) {
        DIR* d = ::opendir(parent.c_str());
        if (d == nullptr) continue;
        while (dirent* entry = ::readdir(d)) {
            const std::string name = entry->d_name;
            if (!looks_like_id(name) || recorded_ids.contains(name)) continue;
            const std::string dir = parent + "/" + name;
            if (!older_than(dir, now, orphan_min_age) || cgroup_tree_populated(dir)) continue;
            out.push_back(dir);
        }
        ::closedir(d);
    }
    return out;
}

std::vector<std::string> orphaned_files(const std::string& sandboxes_dir,
                                        const std::set<std::string>& recorded_ids,
                                        std::chrono::system_clock::time_point now) {
    std::vector<std::string> out;
    DIR* d = ::opendir(sandboxes_dir.c_str());
    if (d == nullptr) return out;
    while (dirent* entry = ::readdir(d)) {
        const std::string_view name = entry->d_name;
        const std::string path = sandboxes_dir + "/" + std::string(name);
        if (name.ends_with(".sock")) {
            const auto id = name.substr(0, name.size() - 5);
            if (looks_like_id(id) && !recorded_ids.contains(std::string(id)) &&
                older_than(path, now, orphan_min_age))
                out.push_back(path);
        } else if (name.find(".json.tmp-") != std::string_view::npos) {
            if (older_than(path, now, orphan_min_age)) out.push_back(path);
        }
    }
    ::closedir(d);
    return out;
}

}  // namespace moat
