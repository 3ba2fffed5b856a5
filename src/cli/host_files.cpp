#include "cli/host_files.hpp"

#include "cli/cli_runtime.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace moat::cli {
namespace {

error from_errno(const std::string& what, int err) {
    errc code = errc::backend_failure;
    if (err == ENOENT || err == ENOTDIR) code = errc::file_not_found;
    if (err == EACCES || err == EPERM) code = errc::permission_denied;
    if (err == EISDIR) code = errc::is_directory;
    return make_error(code, what + ": " + std::strerror(err));
}

}  // namespace

result<std::string> read_host_input(const std::string& path, std::uint64_t limit,
                                    std::uint32_t& mode) {
    const bool is_stdin = path == "-";
    const int fd = is_stdin ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return from_errno(path, errno);
    struct closer {
        int fd;
        bool owned;
        ~closer() {
            if (owned) ::close(fd);
        }
    } close_on_return{fd, !is_stdin};
    mode = 0644;
    if (!is_stdin) {
        struct stat st {};
        if (::fstat(fd, &st) != 0) return from_errno(path, errno);
        if (!S_ISREG(st.st_mode)) {
            return make_error(errc::invalid_path,
                              path + ": not a regular file (directories are not copied)");
        }
        mode = st.st_mode & 0777;
    }
    std::string data;
    char buffer[65536];
    for (;;) {
        const ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return from_errno("read " + path, errno);
        if (n == 0) break;
        if (data.size() + static_cast<std::size_t>(n) > limit) {
            return make_error(errc::too_large, (is_stdin ? std::string("stdin") : path) +
                                                   ": larger than " + std::to_string(limit >> 20) +
                                                   " MiB");
        }
        data.append(buffer, static_cast<std::size_t>(n));
    }
    return data;
}

result<void> write_host_file_atomically(const std::string& path, std::string_view data) {
    const auto slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    std::string temporary = dir + "." + name + ".moat-XXXXXX";
    const int fd = ::mkostemp(temporary.data(), O_CLOEXEC);
    if (fd < 0) return from_errno(path, errno);
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
    const bool written = write_all(fd, data);
    int err = written ? 0 : errno;
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err == 0 && ::rename(temporary.c_str(), path.c_str()) != 0) err = errno;
    if (err != 0) {
        ::unlink(temporary.c_str());
        return from_errno(path, err);
    }
    return {};
}

}  // namespace moat::cli
