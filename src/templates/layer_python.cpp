#include "templates/layer_python.hpp"

#include "core/unique_fd.hpp"
#include "wire/protocol.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <climits>
#include <string_view>

namespace moat::templates {

std::string find_python(const std::string& root) {
    unique_fd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.is_open()) return {};
    // The tree's own real path, which the kernel reports as the prefix of everything in it.
    const std::string own = "/proc/self/fd/" + std::to_string(dir.get());
    char real_root[PATH_MAX];
    const ssize_t root_length = ::readlink(own.c_str(), real_root, sizeof real_root);
    if (root_length <= 0 || root_length == sizeof real_root) return {};
    const std::string_view prefix(real_root, static_cast<std::size_t>(root_length));
    for (const char* candidate : {"usr/local/bin/python3", "usr/bin/python3", "bin/python3"}) {
        open_how how{};
        how.flags = O_PATH | O_CLOEXEC;
        how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
        unique_fd found(
            static_cast<int>(::syscall(SYS_openat2, dir.get(), candidate, &how, sizeof how)));
        struct stat st {};
        if (!found.is_open() || ::fstat(found.get(), &st) != 0) continue;
        // The first one PATH finds is the one `python3` runs: it decides.
        if (!S_ISREG(st.st_mode) || (st.st_mode & 0111) == 0) return {};
        const std::string link = "/proc/self/fd/" + std::to_string(found.get());
        char real[PATH_MAX];
        const ssize_t n = ::readlink(link.c_str(), real, sizeof real);
        if (n <= 0 || n == sizeof real) return {};
        const std::string_view path(real, static_cast<std::size_t>(n));
        if (!path.starts_with(prefix) || path.size() <= prefix.size() || path[prefix.size()] != '/')
            return {};
        const std::string inside(path.substr(prefix.size()));
        return wire::python_version(inside).empty() ? std::string() : inside;
    }
    return {};
}

}  // namespace moat::templates
