#include "sandboxd/state_dir.hpp"

#include <sys/stat.h>
#include <cerrno>

namespace moat::sandboxd {
namespace {

int make_directories(const std::string& path) {
    for (std::size_t slash = 1; slash <= path.size(); ++slash) {
        if (slash != path.size() && path[slash] != '/') continue;
        const std::string prefix = path.substr(0, slash);
        if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) return errno;
    }
    return 0;
}

// The first proper ancestor of `path` that others cannot search, or "".
std::string first_unsearchable_ancestor(const std::string& path) {
    for (std::size_t slash = path.find('/', 1); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
        const std::string prefix = path.substr(0, slash);
        struct stat st {};
        if (::stat(prefix.c_str(), &st) != 0 || (st.st_mode & S_IXOTH) == 0) return prefix;
    }
    return "";
}

}  // namespace

int prepare_state_dir(const std::string& path, std::string& detail) {
    if (const int err = make_directories(path)) {
        detail = "mkdir " + path;
        return err;
    }
    if (::chmod(path.c_str(), 0711) != 0) {
        const int err = errno;
        detail = "chmod " + path;
        return err;
    }
    if (const std::string closed = first_unsearchable_ancestor(path); !closed.empty()) {
        detail = "state directory " + path + " is unreachable for sandbox uids: " + closed +
                 " is not searchable by others (chmod o+x)";
        return EACCES;
    }
    return 0;
}

}  // namespace moat::sandboxd
