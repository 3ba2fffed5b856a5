// Host-side file operations on a live sandbox: plain synchronous functions that run inline on the
// backend's executor (each is a handful of system calls per file, bounded by file_limits).
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
#include <string>
#include <string_view>
#include <vector>

namespace moat {

// What the file functions need to reach one sandbox.
struct sandbox_root {
    int root_fd = -1;  // O_PATH directory descriptor of the sandbox's "/"
    uid_t uid = 0;     // host uid of the sandbox user (uid 1000 inside)
    gid_t gid = 0;     // host gid of the sandbox group (gid 1000 inside)
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

// lstat-like: a final symlink is reported as a symlink.
result<file_stat> stat_path(const sandbox_root& root, const std::string& path);

// Entries other than "." and "..", sorted by name; too_large past limits.max_dir_entries.
result<std::vector<dir_entry>> list_dir(const sandbox_root& root, const std::string& path,
                                        const file_limits& limits);

}  // namespace moat
