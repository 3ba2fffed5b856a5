// Host-side file operations on a live sandbox: plain synchronous functions that run inline on the
// backend's executor (each is a handful of system calls per file, bounded by file_limits), and the
// two stream classes whose steps the backend runs on its file threads.
//
// Every path is resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) under the sandbox's
// root directory, so ".." and absolute symlinks stay inside the sandbox and /proc magic links
// (/proc/<pid>/root, /proc/self/fd/N) are refused. While an operation runs, the calling thread's
// filesystem identity is the sandbox user's (fsuid/fsgid, no supplementary groups, no effective
// capabilities), so the kernel's permission checks are the ones a command in the sandbox would
// get. The thread's credentials are restored before the function returns.
#pragma once

#include <moat/files.hpp>
#include <moat/result.hpp>

#include "core/unique_fd.hpp"

#include <sys/types.h>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moat {

// What the file functions need to reach one sandbox.
struct sandbox_root {
    int root_fd = -1;    // O_PATH directory descriptor of the sandbox's "/"
    uid_t uid = 0;       // host uid of the sandbox user (uid 1000 inside)
    gid_t gid = 0;       // host gid of the sandbox group (gid 1000 inside)
    uid_t root_uid = 0;  // host uid of the sandbox's root (uid 0 inside): writes as_root
    gid_t root_gid = 0;  // host gid of the sandbox's gid 0
};

// The longest path accepted, in bytes (the kernel's PATH_MAX includes the terminating NUL).
inline constexpr std::size_t max_path_bytes = 4095;

// Pure check of a sandbox path: absolute, no NUL byte, at most max_path_bytes. invalid_path
// naming the path otherwise.
result<void> validate_path(std::string_view path);

// Splits an absolute path into the directory that holds its last component and that component:
// "/a/b/c" -> {"/a/b", "c"}, "/c" -> {"/", "c"}, "/a/" -> {"/a", ""}.
struct path_parts {
    std::string_view parent;
    std::string_view name;
};
path_parts split_path(std::string_view path);

// Whether `name` is one of the temporary files the writes below make (".moat-<16 hex>.tmp"),
// renamed over their target once written: a watch reports the target instead.
bool is_temporary_name(std::string_view name) noexcept;

// Opens /proc/<host_pid>/root (O_PATH | O_DIRECTORY) and checks through `pidfd` that the process
// was still alive afterwards, so a reused pid can never hand out another process's root.
result<unique_fd> open_sandbox_root(int host_pid, int pidfd);

// True once the process behind `pidfd` has exited.
bool has_exited(int pidfd) noexcept;

// Writes each file atomically (a temporary file in the same directory, renamed over the target).
// Fails the whole call with too_large when the batch exceeds limits.max_files or
// limits.max_batch_bytes (nothing is written); otherwise every file gets its own outcome.
result<std::vector<file_write_result>> write_files(const sandbox_root& root,
                                                   const std::vector<file_write>& files,
                                                   const file_limits& limits);

// Reads each regular file. Fails the whole call with too_large when there are more than
// limits.max_files paths; paths past the point where limits.max_batch_bytes would be exceeded get
// too_large naming the batch limit.
result<std::vector<file_read_result>> read_files(const sandbox_root& root,
                                                 const std::vector<std::string>& paths,
                                                 const file_limits& limits);

// A streamed write under way: the content goes to a temporary file (mode 0600, the sandbox
// user's) in the target's directory, renamed over the target by commit(). Until then, or if
// anything fails, the target is as it was; the temporary file is removed by abandon(), by a failed
// commit(), or at the latest by the destructor. open(), commit() and abandon() take the sandbox
// user's identity on the calling thread for their system calls; append() is a plain write() to
// the descriptor open() made, which needs none. Any thread may call them, one at a time.
class stream_writer {
  public:
    // Checks the path, resolves (and with create_parents, creates) the parent directory inside
    // the sandbox, refuses a directory at the target, creates the temporary file. Per-path errors.
    static result<std::unique_ptr<stream_writer>> open(const sandbox_root& root,
                                                       const file_write_target& target);
    // too_large (nothing more is written) once the content would exceed target.max_bytes.
    result<void> append(std::string_view chunk);
    // Sets the mode and the metadata, then renames the temporary file over the target.
    result<void> commit();
    void abandon() noexcept;
    ~stream_writer() { abandon(); }

    stream_writer(const stream_writer&) = delete;
    stream_writer& operator=(const stream_writer&) = delete;

  private:
    stream_writer() = default;

    uid_t uid_ = 0;
    gid_t gid_ = 0;
    unique_fd dir_;  // the target's directory (O_PATH)
    unique_fd out_;  // the temporary file
    std::string path_;
    std::string name_;  // the target's name in dir_
    std::string temp_;  // the temporary file's name in dir_; empty once renamed or removed
    std::uint32_t mode_ = 0644;
    std::uint64_t max_bytes_ = 0;
    std::uint64_t written_ = 0;
    file_metadata metadata_;  // normalized; set on the temporary file by commit()
};

// One regular file open for a streamed read: open() runs under the sandbox user's identity with
// the batch read's rules (looked at through O_PATH first, so a FIFO or device is never opened);
// read() is a plain read() of that descriptor and delivers exactly stat().size bytes.
class stream_reader {
  public:
    static result<std::unique_ptr<stream_reader>> open(const sandbox_root& root,
                                                       const std::string& path);
    const file_stat& stat() const noexcept { return stat_; }
    // Up to `most` bytes; "" once stat().size bytes were delivered; backend_failure naming the
    // path if the file ended early (it shrank).
    result<std::string> read(std::size_t most);

  private:
    stream_reader() = default;

    unique_fd in_;
    file_stat stat_;
    std::uint64_t remaining_ = 0;
};

// The metadata (files.hpp) of each path, a final symlink followed inside the sandbox. Fails the
// whole call with too_large when there are more than limits.max_files paths.
result<std::vector<file_metadata_result>> read_metadata(const sandbox_root& root,
                                                        const std::vector<std::string>& paths,
                                                        const file_limits& limits);

// lstat-like: a final symlink is reported as a symlink.
result<file_stat> stat_path(const sandbox_root& root, const std::string& path);

// Whether the sandbox user could list the directory at `path` (what a watch of it needs): the
// errors of list_dir (file_not_found, invalid_path "not a directory", permission_denied).
result<void> check_listable_dir(const sandbox_root& root, const std::string& path);

// Entries other than "." and "..", sorted by name; too_large past limits.max_dir_entries.
result<std::vector<dir_entry>> list_dir(const sandbox_root& root, const std::string& path,
                                        const file_limits& limits);

}  // namespace moat
