#include "local/cgroup_stats.hpp"

#include <dirent.h>
#include <unistd.h>
#include <cerrno>
#include <fstream>

namespace moat {
namespace {

// The number after `key` in a flat keyed file ("oom_kill 3"), or nullopt.
std::optional<std::uint64_t> keyed_number(const std::string& path, const std::string& key) {
    std::ifstream in(path);
    std::string name;
    std::uint64_t value = 0;
    while (in >> name >> value) {
        if (name == key) return value;
    }
    return std::nullopt;
}

}  // namespace

std::optional<std::uint64_t> read_oom_kill_count(const std::string& memory_cgroup) {
    if (memory_cgroup.empty()) return std::nullopt;
    if (auto v1 = keyed_number(memory_cgroup + "/memory.oom_control", "oom_kill")) return v1;
    return keyed_number(memory_cgroup + "/memory.events", "oom_kill");
}

bool oom_watch::counted_new_kill() {
    const auto now = read_oom_kill_count(memory_cgroup);
    const bool grew = now && seen && *now > *seen;
    if (now) seen = now;
    return grew;
}

std::optional<std::uint64_t> read_cgroup_number(const std::vector<std::string>& dirs,
                                                const char* file) {
    for (const auto& dir : dirs) {
        std::ifstream in(dir + "/" + file);
        std::uint64_t value = 0;
        if (in >> value) return value;
    }
    return std::nullopt;
}

std::optional<std::uint64_t> read_memory_used(const std::vector<std::string>& dirs) {
    for (const auto& dir : dirs) {
        for (const char* file : {"memory.usage_in_bytes", "memory.current"}) {
            std::ifstream in(dir + "/" + file);
            std::uint64_t value = 0;
            if (in >> value) return value;
        }
    }
    return std::nullopt;
}

std::optional<std::uint64_t> read_cpu_time_us(const std::vector<std::string>& dirs) {
    for (const auto& dir : dirs) {
        if (auto v2 = keyed_number(dir + "/cpu.stat", "usage_usec")) return v2;
    }
    for (const auto& dir : dirs) {
        std::ifstream in(dir + "/cpuacct.usage");
        std::uint64_t ns = 0;
        if (in >> ns) return ns / 1000;
    }
    return std::nullopt;
}

std::optional<std::uint64_t> read_memory_cache(const std::vector<std::string>& dirs) {
    for (const auto& dir : dirs) {
        if (auto v1 = keyed_number(dir + "/memory.stat", "cache")) return v1;
        if (auto v2 = keyed_number(dir + "/memory.stat", "file")) return v2;
    }
    return std::nullopt;
}

int remove_cgroup_tree(const std::string& dir) {
    // Never killed from here: an "orphan" under a shared parent may be a live sandbox of another
    // state directory, which only its own helper or a destroy through its record may end.
    if (keyed_number(dir + "/cgroup.events", "populated") == 1u) return EBUSY;
    if (DIR* d = ::opendir(dir.c_str())) {
        std::vector<std::string> children;
        while (dirent* entry = ::readdir(d)) {
            const std::string name = entry->d_name;
            if (entry->d_type == DT_DIR && name != "." && name != "..") children.push_back(name);
        }
        ::closedir(d);
        for (const auto& child : children) {
            if (const int err = remove_cgroup_tree(dir + "/" + child)) return err;
        }
    }
    if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return 0;
    return errno;
}

}  // namespace moat
