#include "support/host_inspect.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace moat::test {

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<pid_t> descendants(pid_t root) {
    std::vector<pid_t> out;
    std::vector<pid_t> todo{root};
    while (!todo.empty()) {
        const pid_t p = todo.back();
        todo.pop_back();
        const std::string tasks = "/proc/" + std::to_string(p) + "/task";
        DIR* d = ::opendir(tasks.c_str());
        if (d == nullptr) continue;
        while (dirent* e = ::readdir(d)) {
            if (e->d_name[0] == '.') continue;
            std::istringstream children(read_file(tasks + "/" + e->d_name + "/children"));
            pid_t child;
            while (children >> child) {
                out.push_back(child);
                todo.push_back(child);
            }
        }
        ::closedir(d);
    }
    return out;
}

bool is_running(pid_t pid) {
    const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    const auto close = stat.rfind(')');
    if (stat.empty() || close == std::string::npos || close + 2 >= stat.size()) return false;
    return stat[close + 2] != 'Z' && stat[close + 2] != 'X';
}

bool is_gone(pid_t pid) {
    struct stat st {};
    return ::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0;
}

std::string command_line(pid_t pid) {
    std::string s = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    for (auto& c : s) {
        if (c == '\0') c = ' ';
    }
    return s;
}

std::string cgroup_dir(pid_t pid, const std::string& controller) {
    std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/cgroup"));
    std::string line;
    while (std::getline(in, line)) {
        const auto first = line.find(':');
        const auto second = line.find(':', first + 1);
        if (first == std::string::npos || second == std::string::npos) continue;
        const std::string controllers = line.substr(first + 1, second - first - 1);
        std::istringstream names(controllers);
        std::string name;
        while (std::getline(names, name, ',')) {
            if (name == controller) {
                return "/sys/fs/cgroup/" + controllers + line.substr(second + 1);
            }
        }
    }
    // cgroup v2 (no v1 hierarchy carries the controller; /sys/fs/cgroup is the cgroup2 mount):
    // a sandbox's processes sit in the leaves init/ and commands/ of the sandbox's cgroup, whose
    // files are the controller's.
    in.clear();
    in.str(read_file("/proc/" + std::to_string(pid) + "/cgroup"));
    while (std::getline(in, line)) {
        if (!line.starts_with("0::")) continue;
        std::string path = line.substr(3);
        for (const std::string leaf : {"/init", "/commands"}) {
            if (path.ends_with(leaf)) path.erase(path.size() - leaf.size());
        }
        if (::access("/sys/fs/cgroup/cgroup.controllers", F_OK) != 0) return "";
        return "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
    }
    return "";
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
    const auto limit = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        if (condition()) return true;
        if (std::chrono::steady_clock::now() > limit) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

pid_t parent_of(pid_t pid) {
    const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    pid_t parent = -1;
    rest >> state >> parent;
    return parent;
}

pid_t find_descendant(pid_t root, const std::string& needle) {
    for (const pid_t p : descendants(root)) {
        const std::string line = command_line(p);
        if (line.find(needle) == std::string::npos) continue;
        // A fork that has not exec'd yet still shows its parent's command line (`moat run --
        // sleep 1000` itself): it is not the program looked for.
        if (line == command_line(parent_of(p))) continue;
        return p;
    }
    return -1;
}

long resident_bytes(pid_t pid) {
    const std::string statm =
        pid == 0 ? "/proc/self/statm" : "/proc/" + std::to_string(pid) + "/statm";
    std::istringstream in(read_file(statm));
    long size = 0, resident = 0;
    in >> size >> resident;
    return resident * ::sysconf(_SC_PAGESIZE);
}

std::size_t open_descriptors() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& entry :
         std::filesystem::directory_iterator("/proc/self/fd")) {
        ++n;
    }
    return n - 1;  // the iterator's own descriptor
}

}  // namespace moat::test
