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

}  // namespace moat
