#include "templates/layer_tree.hpp"

#include "core/ascii.hpp"
#include "core/unique_fd.hpp"
#include "templates/sha256.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

namespace moat::templates {
namespace {

// Deeper trees are refused: every level costs two descriptors and a stack frame.
constexpr int max_depth = 256;
constexpr std::size_t copy_chunk = 64 * 1024;

std::string sys_error(const std::string& what, int err) {
    return what + ": " + std::strerror(err);
}

error refused(const std::string& path, const std::string& why) {
    return make_error(errc::invalid_argument, path + ": " + why);
}

error failed(const std::string& path, const std::string& what, int err) {
    return make_error(errc::backend_failure, sys_error(path + ": " + what, err));
}

// A directory's entry names (without "." and ".."), sorted bytewise.
result<std::vector<std::string>> entry_names(int dir_fd, const std::string& path) {
    const int copy = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) return failed(path, "dup", errno);
    std::unique_ptr<DIR, int (*)(DIR*)> dir(::fdopendir(copy), ::closedir);
    if (!dir) {
        const int err = errno;
        ::close(copy);
        return failed(path, "fdopendir", err);
    }
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* entry = ::readdir(dir.get())) {
        const std::string_view name = entry->d_name;
        if (name != "." && name != "..") names.emplace_back(name);
        errno = 0;
    }
    if (errno != 0) return failed(path, "readdir", errno);
    std::sort(names.begin(), names.end());
    return names;
}

std::string child_path(const std::string& parent, const std::string& name) {
    return parent == "/" ? "/" + name : parent + "/" + name;
}

class copier {
  public:
    explicit copier(std::uint64_t max_bytes) : max_bytes_(max_bytes) {}

    result<void> copy_contents(int source, int target, const std::string& path, int depth) {
        if (depth > max_depth)
            return refused(path, "deeper than " + std::to_string(max_depth) + " levels");
        auto names = entry_names(source, path);
        if (!names) return names.error();
        for (const auto& name : *names) {
            if (auto copied = copy_entry(source, target, name, child_path(path, name), depth);
                !copied)
                return copied;
        }
        return {};
    }

    copied_tree take() { return std::move(out_); }

  private:
    result<void> copy_entry(int source, int target, const std::string& name,
                            const std::string& path, int depth) {
        struct stat st {};
        if (::fstatat(source, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
            return failed(path, "stat", errno);
        if (st.st_uid > max_layer_id || st.st_gid > max_layer_id)
            return refused(path, "owned by " + std::to_string(st.st_uid) + ":" +
                                     std::to_string(st.st_gid) +
                                     ", outside a sandbox's ids (0-65535)");
        switch (st.st_mode & S_IFMT) {
            case S_IFREG:
                return copy_file(source, target, name, path, st);
            case S_IFDIR:
                return copy_directory(source, target, name, path, st, depth);
            case S_IFLNK:
                return copy_link(source, target, name, path, st);
            case S_IFIFO:
                if (::mknodat(target, name.c_str(), S_IFIFO | 0600, 0) != 0)
                    return failed(path, "mknod", errno);
                return set_owner_and_mode(target, name, path, st, st.st_mode & 0777);
            case S_IFCHR:
            case S_IFBLK:
                return refused(path,
                               "a device node (a template holds none; /dev is the "
                               "sandbox's own)");
            default:
                return refused(path, "a socket (a template holds none)");
        }
    }

    result<void> copy_file(int source, int target, const std::string& name, const std::string& path,
                           const struct stat& st) {
        out_.bytes += static_cast<std::uint64_t>(st.st_size);
        if (out_.bytes > max_bytes_)
            return make_error(errc::too_large, path + ": the tree is past the layer limit of " +
                                                   std::to_string(max_bytes_) + " bytes");
        unique_fd in(::openat(source, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
        if (!in.is_open()) return failed(path, "open", errno);
        unique_fd out(::openat(target, name.c_str(),
                               O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!out.is_open()) return failed(path, "create", errno);
        if (auto copied = copy_bytes(in.get(), out.get(), path); !copied) return copied;
        if (::fgetxattr(in.get(), "security.capability", nullptr, 0) >= 0)
            out_.cleared.push_back(path + ": file capabilities cleared");
        std::uint32_t mode = st.st_mode & 07777;
        if ((mode & S_ISUID) != 0) out_.cleared.push_back(path + ": setuid bit cleared");
        if ((mode & S_ISGID) != 0) out_.cleared.push_back(path + ": setgid bit cleared");
        mode &= ~static_cast<std::uint32_t>(S_ISUID | S_ISGID);
        if (::fchown(out.get(), st.st_uid, st.st_gid) != 0) return failed(path, "chown", errno);
        if (::fchmod(out.get(), mode) != 0) return failed(path, "chmod", errno);
        const timespec times[2] = {st.st_atim, st.st_mtim};
        if (::futimens(out.get(), times) != 0) return failed(path, "utimens", errno);
        return {};
    }

    static result<void> copy_bytes(int in, int out, const std::string& path) {
        for (;;) {
            const ssize_t n = ::copy_file_range(in, nullptr, out, nullptr, 1 << 30, 0);
            if (n == 0) return {};
            if (n > 0) continue;
            if (errno == EINTR) continue;
            if (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP)
                return failed(path, "copy", errno);
            break;  // a pair of file systems copy_file_range cannot serve: read and write
        }
        std::array<char, copy_chunk> buffer;
        for (;;) {
            const ssize_t n = ::read(in, buffer.data(), buffer.size());
            if (n == 0) return {};
            if (n < 0) {
                if (errno == EINTR) continue;
                return failed(path, "read", errno);
            }
            for (ssize_t done = 0; done < n;) {
                const ssize_t w = ::write(out, buffer.data() + done, static_cast<size_t>(n - done));
                if (w < 0 && errno == EINTR) continue;
                if (w < 0) return failed(path, "write", errno);
                done += w;
            }
        }
    }

    result<void> copy_directory(int source, int target, const std::string& name,
                                const std::string& path, const struct stat& st, int depth) {
        if (::mkdirat(target, name.c_str(), 0700) != 0) return failed(path, "mkdir", errno);
        unique_fd in(
            ::openat(source, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!in.is_open()) return failed(path, "open", errno);
        unique_fd out(
            ::openat(target, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!out.is_open()) return failed(path, "open", errno);
        if (auto copied = copy_contents(in.get(), out.get(), path, depth + 1); !copied)
            return copied;
        // A directory's setgid bit only makes new entries inherit its group: it is kept.
        if (::fchown(out.get(), st.st_uid, st.st_gid) != 0) return failed(path, "chown", errno);
        if (::fchmod(out.get(), st.st_mode & 07777) != 0) return failed(path, "chmod", errno);
        const timespec times[2] = {st.st_atim, st.st_mtim};
        if (::futimens(out.get(), times) != 0) return failed(path, "utimens", errno);
        return {};
    }

    static result<void> copy_link(int source, int target, const std::string& name,
                                  const std::string& path, const struct stat& st) {
        std::array<char, PATH_MAX> link{};
        const ssize_t n = ::readlinkat(source, name.c_str(), link.data(), link.size());
        if (n < 0) return failed(path, "readlink", errno);
        if (static_cast<std::size_t>(n) >= link.size())
            return refused(path, "link target too long");
        const std::string to(link.data(), static_cast<std::size_t>(n));
        if (::symlinkat(to.c_str(), target, name.c_str()) != 0)
            return failed(path, "symlink", errno);
        if (::fchownat(target, name.c_str(), st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) != 0)
            return failed(path, "chown", errno);
        const timespec times[2] = {st.st_atim, st.st_mtim};
        if (::utimensat(target, name.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0)
            return failed(path, "utimens", errno);
        return {};
    }

    static result<void> set_owner_and_mode(int target, const std::string& name,
                                           const std::string& path, const struct stat& st,
                                           std::uint32_t mode) {
        if (::fchownat(target, name.c_str(), st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) != 0)
            return failed(path, "chown", errno);
        if (::fchmodat(target, name.c_str(), mode, 0) != 0) return failed(path, "chmod", errno);
        return {};
    }

    std::uint64_t max_bytes_;
    copied_tree out_;
};

result<std::string> file_hash(int dir_fd, const std::string& name, const std::string& path) {
    unique_fd in(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!in.is_open()) return failed(path, "open", errno);
    sha256 hash;
    std::array<char, copy_chunk> buffer;
    for (;;) {
        const ssize_t n = ::read(in.get(), buffer.data(), buffer.size());
        if (n == 0) break;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return failed(path, "read", errno);
        hash.add(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
    }
    return hash.hex();
}

std::string octal(std::uint32_t mode) {
    char text[8];
    std::snprintf(text, sizeof text, "%04o", mode & 07777);
    return text;
}

// One line per entry: path NUL type mode uid gid [size hash | target] LF.
result<void> digest_contents(sha256& listing, int dir_fd, const std::string& path, int depth) {
    if (depth > max_depth) return refused(path, "deeper than " + std::to_string(max_depth));
    auto names = entry_names(dir_fd, path);
    if (!names) return names.error();
    for (const auto& name : *names) {
        const std::string entry = child_path(path, name);
        struct stat st {};
        if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
            return failed(entry, "stat", errno);
        std::string line = entry;
        line += '\0';
        const std::string owner = " " + octal(st.st_mode) + " " + std::to_string(st.st_uid) + " " +
                                  std::to_string(st.st_gid);
        switch (st.st_mode & S_IFMT) {
            case S_IFREG: {
                auto hash = file_hash(dir_fd, name, entry);
                if (!hash) return hash.error();
                line += "f" + owner + " " + std::to_string(st.st_size) + " " + *hash;
                break;
            }
            case S_IFDIR:
                line += "d" + owner;
                break;
            case S_IFLNK: {
                std::array<char, PATH_MAX> link{};
                const ssize_t n = ::readlinkat(dir_fd, name.c_str(), link.data(), link.size());
                if (n < 0) return failed(entry, "readlink", errno);
                line += "l" + owner + " " + std::string(link.data(), static_cast<std::size_t>(n));
                break;
            }
            case S_IFIFO:
                line += "p" + owner;
                break;
            default:
                line += "?" + owner;
                break;
        }
        line += '\n';
        listing.add(line);
        if (S_ISDIR(st.st_mode)) {
            unique_fd sub(
                ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
            if (!sub.is_open()) return failed(entry, "open", errno);
            if (auto done = digest_contents(listing, sub.get(), entry, depth + 1); !done)
                return done;
        }
    }
    return {};
}

void remove_at(int dir_fd, const std::string& name, int depth) {
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;
    if (S_ISDIR(st.st_mode) && depth <= max_depth) {
        unique_fd sub(
            ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (sub.is_open()) {
            if (auto names = entry_names(sub.get(), name)) {
                for (const auto& child : *names) remove_at(sub.get(), child, depth + 1);
            }
        }
        (void)::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR);
        return;
    }
    (void)::unlinkat(dir_fd, name.c_str(), 0);
}

// The sandbox's mount points and the files moat writes in /etc: each a directory or absent.
constexpr const char* mount_points[] = {"etc", "dev", "proc", "tmp", "workspace", "home", "root"};

}  // namespace

result<copied_tree> copy_tree(const std::string& source, const std::string& target,
                              std::uint64_t max_bytes) {
    unique_fd in(::open(source.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!in.is_open()) {
        const int err = errno;
        if (err == ENOENT) return make_error(errc::file_not_found, sys_error(source, err));
        return make_error(errc::invalid_argument, sys_error(source, err));
    }
    struct stat root {};
    if (::fstat(in.get(), &root) != 0) return failed(source, "stat", errno);
    if (root.st_uid > max_layer_id || root.st_gid > max_layer_id)
        return refused(
            "/", "owned by " + std::to_string(root.st_uid) + ", outside a sandbox's ids (0-65535)");
    if (::mkdir(target.c_str(), 0700) != 0) return failed(target, "mkdir", errno);
    unique_fd out(::open(target.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!out.is_open()) return failed(target, "open", errno);
    copier copy(max_bytes);
    if (auto copied = copy.copy_contents(in.get(), out.get(), "/", 0); !copied)
        return copied.error();
    if (::fchown(out.get(), root.st_uid, root.st_gid) != 0) return failed("/", "chown", errno);
    if (::fchmod(out.get(), root.st_mode & 0755) != 0) return failed("/", "chmod", errno);
    return copy.take();
}

result<void> check_root(const std::string& root) {
    unique_fd dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.is_open()) return failed(root, "open", errno);
    for (const char* name : mount_points) {
        struct stat st {};
        if (::fstatat(dir.get(), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT) return failed(std::string("/") + name, "stat", errno);
            if (::mkdirat(dir.get(), name, 0755) != 0)
                return failed(std::string("/") + name, "mkdir", errno);
            continue;
        }
        if (!S_ISDIR(st.st_mode))
            return refused(std::string("/") + name,
                           "not a directory (a sandbox mounts or writes its own there)");
    }
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT;
    unique_fd shell(
        static_cast<int>(::syscall(SYS_openat2, dir.get(), "bin/sh", &how, sizeof how)));
    struct stat st {};
    if (!shell.is_open() || ::fstat(shell.get(), &st) != 0)
        return refused("/bin/sh", "missing (nothing could run in this root)");
    if (!S_ISREG(st.st_mode) || (st.st_mode & 0111) == 0)
        return refused("/bin/sh", "not an executable file (nothing could run in this root)");
    return {};
}

result<std::string> tree_digest(const std::string& root) {
    unique_fd dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.is_open()) return failed(root, "open", errno);
    struct stat st {};
    if (::fstat(dir.get(), &st) != 0) return failed(root, "stat", errno);
    sha256 listing;
    listing.add("/" + std::string(1, '\0') + "d " + octal(st.st_mode) + " " +
                std::to_string(st.st_uid) + " " + std::to_string(st.st_gid) + "\n");
    if (auto done = digest_contents(listing, dir.get(), "/", 0); !done) return done.error();
    return "sha256:" + listing.hex();
}

void remove_tree(const std::string& path) {
    const auto slash = path.find_last_of('/');
    const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
    const std::string name = path.substr(slash + 1);
    if (slash == std::string::npos || name.empty()) return;
    unique_fd dir(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.is_open()) remove_at(dir.get(), name, 0);
}

result<std::string> read_small_file(const std::string& path, std::size_t max_bytes) {
    unique_fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.is_open()) {
        const int err = errno;
        return make_error(err == ENOENT ? errc::file_not_found : errc::backend_failure,
                          sys_error(path, err));
    }
    std::string text(max_bytes + 1, '\0');
    std::size_t have = 0;
    for (;;) {
        const ssize_t n = ::read(fd.get(), text.data() + have, text.size() - have);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return make_error(errc::backend_failure, sys_error(path, errno));
        if (n == 0) break;
        have += static_cast<std::size_t>(n);
        if (have == text.size())
            return make_error(errc::invalid_argument,
                              path + ": larger than " + std::to_string(max_bytes) + " bytes");
    }
    text.resize(have);
    return text;
}

}  // namespace moat::templates
