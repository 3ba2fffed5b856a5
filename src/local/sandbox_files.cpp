// Host-side file operations on a live sandbox (the contract is sandbox_files.hpp): paths resolved
// under the sandbox's root and the errors they give, the batch calls, the streamed writer and
// reader, the metadata attributes and directory listings. The thread's switch to the sandbox
// user's identity around each of them is sandbox_identity.cpp.
#include "local/sandbox_files.hpp"

#include "core/ascii.hpp"
#include "core/file_metadata.hpp"
#include "local/sandbox_identity.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/limits.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace moat {
namespace {

// A path as it may appear in a one-line detail: control bytes become '?'.
std::string printable(std::string_view path) {
    std::string out(path);
    for (char& c : out) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    return out;
}

error path_error(errc code, std::string_view path, std::string_view what) {
    std::string detail = printable(path);
    detail += ": ";
    detail += what;
    return make_error(code, std::move(detail));
}

// The normalized error for a failed system call on `path` (the sandbox's path, never a host one).
error errno_error(int err, std::string_view path) {
    switch (err) {
        case ENOENT:
        case ENOTDIR:
            return path_error(errc::file_not_found, path, "no such file or directory");
        case EISDIR:
            return path_error(errc::is_directory, path, "is a directory");
        case EACCES:
        case EPERM:
            return path_error(errc::permission_denied, path, "permission denied");
        case EROFS:
            return path_error(errc::permission_denied, path, "read-only file system");
        case ELOOP:
            return path_error(errc::invalid_path, path,
                              "refused: a /proc magic link, a symlink where none is allowed, or "
                              "too many levels of symlinks");
        case EXDEV:
            return path_error(errc::invalid_path, path, "refused: resolution left the sandbox");
        case ENAMETOOLONG:
            return path_error(errc::invalid_path, path, "name too long");
        case EFBIG:
        case ENOSPC:
        case EDQUOT:
            return path_error(errc::too_large, path, "no space left in the sandbox");
        case EMFILE:
        case ENFILE:
            return path_error(errc::limit_exceeded, path,
                              "the application is out of file descriptors (RLIMIT_NOFILE)");
        default: {
            const char* name = ::strerrorname_np(err);
            return path_error(errc::backend_failure, path, name != nullptr ? name : "E?");
        }
    }
}

// openat2 under the sandbox's root; -1 with errno on failure. EAGAIN means a concurrent rename
// raced a ".." step: the kernel asks us to retry.
int resolve(int root_fd, const std::string& path, std::uint64_t flags) {
    open_how how{};
    how.flags = flags | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    for (int attempt = 0;; ++attempt) {
        const long fd = ::syscall(SYS_openat2, root_fd, path.c_str(), &how, sizeof how);
        if (fd >= 0) return static_cast<int>(fd);
        if ((errno != EAGAIN && errno != EINTR) || attempt == 16) return -1;
    }
}

file_type type_of(mode_t mode) noexcept {
    if (S_ISREG(mode)) return file_type::regular;
    if (S_ISDIR(mode)) return file_type::directory;
    if (S_ISLNK(mode)) return file_type::symlink;
    return file_type::other;
}

std::string random_temp_name() {
    // Uniqueness matters, not secrecy: O_EXCL refuses a name the sandbox took first, and the
    // caller tries again. One call, no loop; if getrandom fails, the time and a process-wide
    // counter still give each attempt of this process a name of its own.
    unsigned char bytes[8];
    if (::getrandom(bytes, sizeof bytes, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof bytes)) {
        static std::atomic<std::uint64_t> counter{0};
        const std::uint64_t fallback = static_cast<std::uint64_t>(::time(nullptr)) * 1000003u +
                                       counter.fetch_add(1, std::memory_order_relaxed) + 1;
        std::memcpy(bytes, &fallback, sizeof bytes);
    }
    std::string name = ".moat-";
    detail::append_hex(name, bytes);
    return name + ".tmp";
}

}  // namespace

bool is_temporary_name(std::string_view name) noexcept {
    constexpr std::string_view prefix = ".moat-";
    constexpr std::string_view suffix = ".tmp";
    if (name.size() != prefix.size() + 16 + suffix.size() || !name.starts_with(prefix) ||
        !name.ends_with(suffix)) {
        return false;
    }
    const auto digits = name.substr(prefix.size(), 16);
    return std::all_of(digits.begin(), digits.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

namespace {

result<void> write_all(int fd, std::string_view data, std::string_view path) {
    while (!data.empty()) {
        const ssize_t n = ::write(fd, data.data(), data.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno_error(errno, path);
        }
        if (n == 0) return errno_error(ENOSPC, path);
        data.remove_prefix(static_cast<std::size_t>(n));
    }
    return {};
}

// A regular file under the root, opened for reading, and its stat. Looked at before it is opened:
// opening a device (the sandbox's /dev nodes are the host's) or a FIFO can have effects of its
// own. The O_PATH descriptor is then reopened through /proc/self/fd, which names that same inode,
// so nothing can be swapped in between.
result<unique_fd> open_regular_file(int root_fd, const std::string& path, struct stat& st) {
    const unique_fd located(resolve(root_fd, path, O_PATH));
    if (!located.is_open()) return errno_error(errno, path);
    if (::fstat(located.get(), &st) != 0) return errno_error(errno, path);
    if (S_ISDIR(st.st_mode)) return path_error(errc::is_directory, path, "is a directory");
    if (!S_ISREG(st.st_mode)) return path_error(errc::invalid_path, path, "not a regular file");
    const std::string reopen = "/proc/self/fd/" + std::to_string(located.get());
    unique_fd in(::open(reopen.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!in.is_open()) return errno_error(errno, path);
    return in;
}

// A directory (not a link to one) named `name` in `dir`.
bool is_directory_at(int dir, const std::string& name) {
    struct stat existing {};
    return ::fstatat(dir, name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0 &&
           S_ISDIR(existing.st_mode);
}

// A new temporary file (mode 0600) in `dir`, its name in `temp`; -1 with errno on failure.
int create_temp_file(int dir, std::string& temp) {
    for (int attempt = 0; attempt < 4; ++attempt) {
        std::string name = random_temp_name();
        const int fd =
            ::openat(dir, name.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd >= 0) {
            temp = std::move(name);
            return fd;
        }
        if (errno != EEXIST) break;
    }
    return -1;
}

// Renames the temporary file over the target, both in `dir`.
result<void> rename_over(int dir, const std::string& temp, const std::string& target,
                         std::string_view path) {
    if (::renameat(dir, temp.c_str(), dir, target.c_str()) == 0) return {};
    // A directory appeared at the target since it was looked at.
    const int err = errno;
    return (err == ENOTEMPTY || err == EEXIST) ? errno_error(EISDIR, path) : errno_error(err, path);
}

result<void> write_one(int root_fd, const file_write& file, const file_limits& limits) {
    const std::string& path = file.path;
    if (auto invalid = validate_path(path); !invalid) return invalid;
    if (file.content.size() > limits.max_file_bytes) {
        return path_error(errc::too_large, path,
                          "content exceeds the per-file limit of " +
                              std::to_string(limits.max_file_bytes) + " bytes");
    }
    const auto [parent, name] = split_path(path);
    if (name.empty() || name == "." || name == "..") {
        return path_error(errc::is_directory, path, "names a directory");
    }
    const unique_fd dir(resolve(root_fd, std::string(parent), O_PATH | O_DIRECTORY));
    if (!dir.is_open()) return errno_error(errno, path);
    const std::string target(name);
    if (is_directory_at(dir.get(), target)) {
        return path_error(errc::is_directory, path, "is a directory");
    }

    std::string temp;
    unique_fd out(create_temp_file(dir.get(), temp));
    if (!out.is_open()) return errno_error(errno, path);

    result<void> done = write_all(out.get(), file.content, path);
    if (done && ::fchmod(out.get(), file.mode & 0777) != 0) done = errno_error(errno, path);
    if (done && ::close(out.release()) != 0) done = errno_error(errno, path);
    if (done) done = rename_over(dir.get(), temp, target, path);
    if (!done) ::unlinkat(dir.get(), temp.c_str(), 0);
    return done;
}

// Reads at most limits.max_file_bytes; the file may grow while it is read.
result<std::string> read_one(int root_fd, const std::string& path, const file_limits& limits) {
    if (auto invalid = validate_path(path); !invalid) return std::move(invalid).error();
    struct stat st {};
    auto opened = open_regular_file(root_fd, path, st);
    if (!opened) return std::move(opened).error();
    const unique_fd in = std::move(*opened);
    const std::uint64_t limit = limits.max_file_bytes;
    const auto too_large = [&] {
        return path_error(errc::too_large, path,
                          "file exceeds the per-file limit of " + std::to_string(limit) + " bytes");
    };
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size > limit) return too_large();

    // One byte past the reported size, so the usual read ends at EOF without growing.
    std::string data(static_cast<std::size_t>(std::min<std::uint64_t>(size + 1, limit + 1)), '\0');
    std::size_t used = 0;
    for (;;) {
        if (used == data.size()) {
            if (used > limit) return too_large();
            data.resize(static_cast<std::size_t>(
                std::min<std::uint64_t>(std::max<std::uint64_t>(used * 2, 64 * 1024), limit + 1)));
        }
        const ssize_t n = ::read(in.get(), data.data() + used, data.size() - used);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno_error(errno, path);
        }
        if (n == 0) break;
        used += static_cast<std::size_t>(n);
    }
    if (used > limit) return too_large();
    data.resize(used);
    return data;
}

// The directory `parent` (absolute) under the root as an O_PATH descriptor; with `create`,
// missing components are made one at a time (mkdirat never follows a link: a link in the way is
// resolved inside the sandbox like any other path). -1 with the errno in `err` on failure.
int open_parent(int root_fd, std::string_view parent, bool create, int& err) {
    const std::string whole(parent);
    const int fd = resolve(root_fd, whole, O_PATH | O_DIRECTORY);
    err = errno;
    if (fd >= 0 || err != ENOENT || !create) return fd;
    unique_fd current(resolve(root_fd, "/", O_PATH | O_DIRECTORY));
    err = errno;
    if (!current.is_open()) return -1;
    std::string prefix;
    std::size_t at = 0;
    while (at < parent.size()) {
        const std::size_t slash = std::min(parent.find('/', at), parent.size());
        const std::string name(parent.substr(at, slash - at));
        at = slash + 1;
        if (name.empty() || name == ".") continue;
        prefix += '/';
        prefix += name;
        unique_fd next(resolve(root_fd, prefix, O_PATH | O_DIRECTORY));
        err = errno;
        if (!next.is_open() && err == ENOENT) {
            if (::mkdirat(current.get(), name.c_str(), 0755) != 0 && errno != EEXIST) {
                err = errno;
                return -1;
            }
            next.reset(resolve(root_fd, prefix, O_PATH | O_DIRECTORY));
            err = errno;
        }
        if (!next.is_open()) return -1;
        current = std::move(next);
    }
    return current.release();
}

bool xattrs_unsupported(int err) noexcept {
    return err == ENOTSUP || err == EOPNOTSUPP;
}

// Sets each metadata entry as an extended attribute of the open file `fd`.
result<void> set_metadata(int fd, const file_metadata& metadata, std::string_view path) {
    for (const auto& [key, value] : metadata) {
        const std::string name = std::string(file_metadata_prefix) + key;
        if (::fsetxattr(fd, name.c_str(), value.data(), value.size(), 0) == 0) continue;
        const int err = errno;
        if (xattrs_unsupported(err))
            return path_error(errc::not_supported, path,
                              "the filesystem here keeps no extended attributes, so no file "
                              "metadata (tmpfs has them from Linux 6.6)");
        if (err == E2BIG || err == ERANGE)
            return path_error(errc::too_large, path,
                              "the filesystem cannot keep this much file metadata");
        return errno_error(err, path);
    }
    return {};
}

// The metadata attributes of the inode behind the O_PATH descriptor `fd` (through /proc/self/fd:
// the path-based calls follow that link to the same inode; the fd-based ones refuse O_PATH).
result<file_metadata> read_metadata_of(int fd, const std::string& path) {
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    std::string names(1024, '\0');
    ssize_t listed = -1;
    for (int attempt = 0; attempt < 4; ++attempt) {
        listed = ::listxattr(link.c_str(), names.data(), names.size());
        if (listed >= 0 || errno != ERANGE) break;
        const ssize_t needed = ::listxattr(link.c_str(), nullptr, 0);
        if (needed < 0) break;
        names.resize(std::min<std::size_t>(static_cast<std::size_t>(needed) + 256, XATTR_LIST_MAX));
    }
    if (listed < 0) {
        if (xattrs_unsupported(errno)) return file_metadata();
        return errno_error(errno, path);
    }
    names.resize(static_cast<std::size_t>(listed));
    detail::file_metadata_collector kept;
    std::string value(max_file_metadata_bytes, '\0');
    for (std::size_t at = 0; at < names.size();) {
        const std::size_t end = std::min(names.find('\0', at), names.size());
        const std::string name = names.substr(at, end - at);
        at = end + 1;
        if (name.size() <= file_metadata_prefix.size() ||
            name.compare(0, file_metadata_prefix.size(), file_metadata_prefix) != 0)
            continue;
        const ssize_t n = ::getxattr(link.c_str(), name.c_str(), value.data(), value.size());
        if (n < 0) {
            if (errno == ENODATA || errno == ERANGE) continue;  // removed meanwhile, or too big
            return errno_error(errno, path);
        }
        kept.add(std::string_view(name).substr(file_metadata_prefix.size()),
                 std::string_view(value).substr(0, static_cast<std::size_t>(n)));
    }
    return kept.take();
}

error batch_too_large(std::size_t files, std::size_t max_files) {
    return make_error(errc::too_large, std::to_string(files) + " files exceed the batch limit of " +
                                           std::to_string(max_files) + " files");
}

}  // namespace

result<void> validate_path(std::string_view path) {
    if (path.empty()) return path_error(errc::invalid_path, "\"\"", "the path is empty");
    if (path.find('\0') != std::string_view::npos) {
        return path_error(errc::invalid_path, path, "contains a NUL byte");
    }
    if (path.size() > max_path_bytes) {
        return make_error(errc::invalid_path, "path of " + std::to_string(path.size()) +
                                                  " bytes exceeds " +
                                                  std::to_string(max_path_bytes) + " bytes");
    }
    if (path.front() != '/') return path_error(errc::invalid_path, path, "not an absolute path");
    return {};
}

path_parts split_path(std::string_view path) {
    const std::size_t slash = path.rfind('/');
    if (slash == std::string_view::npos) return {{}, path};
    std::string_view parent = path.substr(0, slash);
    if (parent.empty()) parent = path.substr(0, 1);
    return {parent, path.substr(slash + 1)};
}

bool has_exited(int pidfd) noexcept {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;  // readable once it exited; an error counts as gone
}

result<unique_fd> open_sandbox_root(int host_pid, int pidfd) {
    const std::string proc = "/proc/" + std::to_string(host_pid) + "/root";
    unique_fd root(::open(proc.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root.is_open()) {
        const int err = errno;
        if (err == EMFILE || err == ENFILE) {
            return make_error(errc::limit_exceeded,
                              "the application is out of file descriptors (RLIMIT_NOFILE): each "
                              "sandbox needs 3");
        }
        return make_error(errc::backend_failure, "open " + proc + ": " + std::strerror(err));
    }
    if (has_exited(pidfd)) {
        return make_error(errc::sandbox_unavailable, "the sandbox's pid 1 exited");
    }
    return root;
}

result<std::vector<file_write_result>> write_files(const sandbox_root& root,
                                                   const std::vector<file_write>& files,
                                                   const file_limits& limits) {
    if (files.size() > limits.max_files) return batch_too_large(files.size(), limits.max_files);
    std::uint64_t total = 0;
    for (const auto& file : files) total += file.content.size();
    if (total > limits.max_batch_bytes) {
        return make_error(errc::too_large, "batch of " + std::to_string(total) +
                                               " bytes exceeds the batch limit of " +
                                               std::to_string(limits.max_batch_bytes) + " bytes");
    }
    std::vector<file_write_result> out;
    out.reserve(files.size());
    for (const auto& file : files) {
        // Each file with its writer's identity: the sandbox's user, or its root.
        const sandbox_identity identity(file.as_root ? root.root_uid : root.uid,
                                        file.as_root ? root.root_gid : root.gid);
        if (auto switched = identity.status(); !switched) return switched.error();
        out.push_back({file.path, write_one(root.root_fd, file, limits)});
    }
    return out;
}

result<std::vector<file_read_result>> read_files(const sandbox_root& root,
                                                 const std::vector<std::string>& paths,
                                                 const file_limits& limits) {
    if (paths.size() > limits.max_files) return batch_too_large(paths.size(), limits.max_files);
    const sandbox_identity identity(root.uid, root.gid);
    if (auto switched = identity.status(); !switched) return switched.error();
    std::vector<file_read_result> out;
    out.reserve(paths.size());
    std::uint64_t total = 0;
    bool batch_full = false;
    const auto batch_limit = [&](const std::string& path) {
        return path_error(errc::too_large, path,
                          "not read: the batch reached its limit of " +
                              std::to_string(limits.max_batch_bytes) + " bytes");
    };
    for (const auto& path : paths) {
        if (batch_full) {
            out.push_back({path, batch_limit(path)});
            continue;
        }
        auto content = read_one(root.root_fd, path, limits);
        if (content && total + content->size() > limits.max_batch_bytes) {
            batch_full = true;
            out.push_back({path, batch_limit(path)});
            continue;
        }
        if (content) total += content->size();
        out.push_back({path, std::move(content)});
    }
    return out;
}

result<std::unique_ptr<stream_writer>> stream_writer::open(const sandbox_root& root,
                                                           const file_write_target& target) {
    const std::string& path = target.path;
    if (auto invalid = validate_path(path); !invalid) return std::move(invalid).error();
    const auto [parent, name] = split_path(path);
    if (name.empty() || name == "." || name == "..") {
        return path_error(errc::is_directory, path, "names a directory");
    }
    const uid_t uid = target.as_root ? root.root_uid : root.uid;
    const gid_t gid = target.as_root ? root.root_gid : root.gid;
    const sandbox_identity identity(uid, gid);
    if (auto switched = identity.status(); !switched) return switched.error();
    std::unique_ptr<stream_writer> writer(new stream_writer());
    writer->uid_ = uid;
    writer->gid_ = gid;
    writer->path_ = path;
    writer->name_ = std::string(name);
    writer->mode_ = target.mode & 0777;
    writer->max_bytes_ = target.max_bytes;
    if (!target.metadata.empty()) {
        auto metadata = normalize_file_metadata(target.metadata);
        if (!metadata) {
            auto e = std::move(metadata).error();
            e.detail = printable(path) + ": " + e.detail;
            return e;
        }
        writer->metadata_ = std::move(*metadata);
    }
    int err = 0;
    writer->dir_.reset(open_parent(root.root_fd, parent, target.create_parents, err));
    if (!writer->dir_.is_open()) return errno_error(err, path);
    if (is_directory_at(writer->dir_.get(), writer->name_)) {
        return path_error(errc::is_directory, path, "is a directory");
    }
    writer->out_.reset(create_temp_file(writer->dir_.get(), writer->temp_));
    if (!writer->out_.is_open()) return errno_error(errno, path);
    return writer;
}

result<void> stream_writer::append(std::string_view chunk) {
    if (!out_.is_open()) return path_error(errc::invalid_argument, path_, "the write has ended");
    if (chunk.size() > max_bytes_ - written_) {
        return path_error(
            errc::too_large, path_,
            "content exceeds the per-file limit of " + std::to_string(max_bytes_) + " bytes");
    }
    if (auto done = write_all(out_.get(), chunk, path_); !done) return done;
    written_ += chunk.size();
    return {};
}

result<void> stream_writer::commit() {
    if (!out_.is_open()) return path_error(errc::invalid_argument, path_, "the write has ended");
    result<void> done;
    {
        const sandbox_identity identity(uid_, gid_);
        done = identity.status();
        // The metadata first: setting a user attribute needs write permission, which the final
        // mode may not give.
        if (done) done = set_metadata(out_.get(), metadata_, path_);
        if (done && ::fchmod(out_.get(), mode_) != 0) done = errno_error(errno, path_);
        if (done && ::close(out_.release()) != 0) done = errno_error(errno, path_);
        if (done) done = rename_over(dir_.get(), temp_, name_, path_);
        if (done) temp_.clear();
    }
    if (!done) abandon();
    return done;
}

void stream_writer::abandon() noexcept {
    out_.reset();
    if (temp_.empty() || !dir_.is_open()) return;
    const sandbox_identity identity(uid_, gid_);
    if (identity.status()) ::unlinkat(dir_.get(), temp_.c_str(), 0);
    temp_.clear();
}

result<std::unique_ptr<stream_reader>> stream_reader::open(const sandbox_root& root,
                                                           const std::string& path) {
    if (auto invalid = validate_path(path); !invalid) return std::move(invalid).error();
    const sandbox_identity identity(root.uid, root.gid);
    if (auto switched = identity.status(); !switched) return switched.error();
    struct stat st {};
    auto opened = open_regular_file(root.root_fd, path, st);
    if (!opened) return std::move(opened).error();
    std::unique_ptr<stream_reader> reader(new stream_reader());
    reader->in_ = std::move(*opened);
    reader->stat_.path = path;
    reader->stat_.type = file_type::regular;
    reader->stat_.size = static_cast<std::uint64_t>(st.st_size);
    reader->stat_.mode = st.st_mode & 07777;
    reader->remaining_ = reader->stat_.size;
    return reader;
}

result<std::string> stream_reader::read(std::size_t most) {
    if (remaining_ == 0) return std::string();
    std::string chunk(static_cast<std::size_t>(std::min<std::uint64_t>(most, remaining_)), '\0');
    for (;;) {
        const ssize_t n = ::read(in_.get(), chunk.data(), chunk.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno_error(errno, stat_.path);
        }
        if (n == 0) {
            return path_error(errc::backend_failure, stat_.path,
                              "the file shrank while it was read (" + std::to_string(remaining_) +
                                  " of " + std::to_string(stat_.size) + " bytes missing)");
        }
        chunk.resize(static_cast<std::size_t>(n));
        remaining_ -= static_cast<std::uint64_t>(n);
        return chunk;
    }
}

result<std::vector<file_metadata_result>> read_metadata(const sandbox_root& root,
                                                        const std::vector<std::string>& paths,
                                                        const file_limits& limits) {
    if (paths.size() > limits.max_files) return batch_too_large(paths.size(), limits.max_files);
    const sandbox_identity identity(root.uid, root.gid);
    if (auto switched = identity.status(); !switched) return switched.error();
    std::vector<file_metadata_result> out;
    out.reserve(paths.size());
    for (const auto& path : paths) {
        file_metadata_result one;
        one.path = path;
        if (auto invalid = validate_path(path); !invalid) {
            one.metadata = std::move(invalid).error();
        } else if (const unique_fd fd(resolve(root.root_fd, path, O_PATH)); !fd.is_open()) {
            one.metadata = errno_error(errno, path);
        } else {
            one.metadata = read_metadata_of(fd.get(), path);
        }
        out.push_back(std::move(one));
    }
    return out;
}

result<file_stat> stat_path(const sandbox_root& root, const std::string& path) {
    if (auto invalid = validate_path(path); !invalid) return std::move(invalid).error();
    const sandbox_identity identity(root.uid, root.gid);
    if (auto switched = identity.status(); !switched) return switched.error();
    const unique_fd fd(resolve(root.root_fd, path, O_PATH | O_NOFOLLOW));
    if (!fd.is_open()) return errno_error(errno, path);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return errno_error(errno, path);
    file_stat out;
    out.path = path;
    out.type = type_of(st.st_mode);
    out.size = static_cast<std::uint64_t>(st.st_size);
    out.mode = st.st_mode & 07777;
    return out;
}

namespace {

// The directory at `path` opened for reading, as the sandbox user (whose identity the caller
// holds).
result<unique_fd> open_listable_dir(const sandbox_root& root, const std::string& path) {
    unique_fd fd(resolve(root.root_fd, path, O_RDONLY | O_DIRECTORY));
    if (fd.is_open()) return fd;
    const int err = errno;
    // ENOTDIR is also "a directory on the way is missing": tell the two apart.
    if (err == ENOTDIR && unique_fd(resolve(root.root_fd, path, O_PATH)).is_open()) {
        return path_error(errc::invalid_path, path, "not a directory");
    }
    return errno_error(err, path);
}

}  // namespace

result<void> check_listable_dir(const sandbox_root& root, const std::string& path) {
    if (auto invalid = validate_path(path); !invalid) return std::move(invalid).error();
    const sandbox_identity identity(root.uid, root.gid);
    if (auto switched = identity.status(); !switched) return switched.error();
    auto opened = open_listable_dir(root, path);
    if (!opened) return std::move(opened).error();
    return {};
}

result<std::vector<dir_entry>> list_dir(const sandbox_root& root, const std::string& path,
                                        const file_limits& limits) {
    if (auto invalid = validate_path(path); !invalid) return std::move(invalid).error();
    const sandbox_identity identity(root.uid, root.gid);
    if (auto switched = identity.status(); !switched) return switched.error();
    auto opened = open_listable_dir(root, path);
    if (!opened) return std::move(opened).error();
    unique_fd fd = std::move(*opened);
    DIR* dir = ::fdopendir(fd.get());
    if (dir == nullptr) return errno_error(errno, path);
    fd.release();  // owned by `dir` now
    std::vector<dir_entry> out;
    result<void> failed;
    for (;;) {
        errno = 0;
        const dirent* entry = ::readdir(dir);
        if (entry == nullptr) {
            if (errno != 0) failed = errno_error(errno, path);
            break;
        }
        const std::string_view name = entry->d_name;
        if (name == "." || name == "..") continue;
        if (out.size() == limits.max_dir_entries) {
            failed = path_error(errc::too_large, path,
                                "more than " + std::to_string(limits.max_dir_entries) + " entries");
            break;
        }
        dir_entry item;
        item.name = std::string(name);
        struct stat st {};
        if (::fstatat(::dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
            item.type = type_of(st.st_mode);
            item.size = static_cast<std::uint64_t>(st.st_size);
        } else {
            // Removed since readdir saw it: keep what readdir knew.
            item.type = entry->d_type == DT_REG   ? file_type::regular
                        : entry->d_type == DT_DIR ? file_type::directory
                        : entry->d_type == DT_LNK ? file_type::symlink
                                                  : file_type::other;
        }
        out.push_back(std::move(item));
    }
    ::closedir(dir);
    if (!failed) return failed.error();
    std::sort(out.begin(), out.end(),
              [](const dir_entry& a, const dir_entry& b) { return a.name < b.name; });
    return out;
}

}  // namespace moat
