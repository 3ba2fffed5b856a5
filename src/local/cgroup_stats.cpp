#include "local/cgroup_stats.hpp"

#include <fstream>

namespace moat {

std::optional<std::uint64_t> read_oom_kill_count(const std::string& memory_cgroup) {
    if (memory_cgroup.empty()) return std::nullopt;
    std::ifstream in(memory_cgroup + "/memory.oom_control");
    std::string key;
    std::uint64_t value = 0;
    while (in >> key >> value) {
        if (key == "oom_kill") return value;
    }
    return std::nullopt;
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

}  // namespace moat
