// File transfer types for backend::async_write_files, async_read_files, async_stat and
// async_list_dir.
//
// The contract every backend follows:
// - Paths are absolute paths inside the sandbox, without NUL bytes and at most 4095 bytes long; a
//   relative or empty path is errc::invalid_path. Symbolic links are followed only inside the
//   sandbox's own view: an absolute link resolves against the sandbox's "/", ".." never climbs
//   above it, and /proc links that are not paths (/proc/<pid>/root, /proc/self/fd/N) are refused
//   (invalid_path, or permission_denied when the kernel's own check on them refuses first).
//   Nothing outside the sandbox is ever read or written.
// - File operations have the sandbox user's permissions (uid/gid 1000, as commands run): writing
//   under the read-only root fails with permission_denied, /workspace and /tmp are writable, and
//   files the API creates are owned by 1000 inside.
// - Batch calls return one result per path, in order, so one bad path never fails the others.
//   The whole call fails (nothing is done) only when the sandbox is unknown (sandbox_not_found)
//   or gone (sandbox_unavailable), when the batch itself exceeds file_limits (too_large: more
//   than max_files paths, or writes of more than max_batch_bytes in all), or when the backend
//   cannot do file access at all (backend_failure).
// - Per-path errors are normalized: file_not_found (the path or one of its directories does not
//   exist), invalid_path (malformed, not a regular file where one is needed, a refused link),
//   is_directory, permission_denied, too_large (a limit, or no space left in the sandbox), and
//   backend_failure for anything else. Every detail names the path as the sandbox sees it.
// - Writes are atomic: the content goes to a temporary file in the target's directory, which is
//   renamed over the target only once everything was written. A failed write leaves the target
//   as it was (an existing file keeps its old content) and no temporary file behind. Parent
//   directories are not created: a write into a missing directory is file_not_found.
//   Writing to a path whose last component is a symlink replaces the link, not its target.
// - Sizes are bounded (file_limits): content is written from, and read into, the caller's
//   strings directly, never staged in another whole-batch buffer.
#pragma once

#include <moat/result.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace moat {

struct file_limits {
    std::uint64_t max_file_bytes = 10 * 1024 * 1024;    // per file, read or written
    std::size_t max_files = 100;                        // per batch
    std::uint64_t max_batch_bytes = 100 * 1024 * 1024;  // per batch, all contents together
    std::size_t max_dir_entries = 10'000;               // per list_dir
};

struct file_write {
    std::string path;     // absolute, inside the sandbox
    std::string content;  // bytes
    // Permission bits of the written file; only 0777 is kept (no setuid, setgid or sticky bit).
    std::uint32_t mode = 0644;
};

// Per-path outcome of a write: empty on success, else file_not_found, invalid_path,
// is_directory, permission_denied or too_large with a detail naming the path.
struct file_write_result {
    std::string path;
    result<void> outcome;
};

// Per-path outcome of a read: the file's bytes, or file_not_found, invalid_path (not a regular
// file: a FIFO, a device, a socket), is_directory, permission_denied or too_large (the file is
// over max_file_bytes, or the batch reached max_batch_bytes before this path).
struct file_read_result {
    std::string path;
    result<std::string> content;
};

enum class file_type { regular, directory, symlink, other };

struct file_stat {
    std::string path;
    file_type type = file_type::regular;
    std::uint64_t size = 0;  // bytes; for a symlink, the length of its target
    std::uint32_t mode = 0;  // permission bits (07777)
};

struct dir_entry {
    std::string name;
    file_type type = file_type::regular;
    std::uint64_t size = 0;
};

}  // namespace moat
