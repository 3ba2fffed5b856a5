// File transfer types for backend::async_write_files, async_read_files, async_stat,
// async_list_dir and the streaming calls async_write_file_stream / async_read_file_stream.
//
// The contract every backend follows:
// - Paths are absolute paths inside the sandbox, without NUL bytes and at most 4095 bytes long; a
//   relative or empty path is errc::invalid_path. Symbolic links are followed only inside the
//   sandbox's own view: an absolute link resolves against the sandbox's "/", ".." never climbs
//   above it, and /proc links that are not paths (/proc/<pid>/root, /proc/self/fd/N) are refused
//   (invalid_path, or permission_denied when the kernel's own check on them refuses first).
//   Nothing outside the sandbox is ever read or written.
// - File operations have the sandbox user's permissions (uid/gid 1000, as commands run; a write
//   as_root has root's ownership, see file_write::as_root): writing
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

#include <asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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
    // Written as the sandbox's root: the file (and any parent directory made) belongs to uid 0
    // inside. Local backend: root's ownership without its capabilities (the write runs on the
    // host, where a capability would reach beyond the sandbox): it may write where uid 0 may by
    // the permission bits (its home /root, directories it owns, world-writable ones).
    bool as_root = false;
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

// Streaming transfer of one file (backend::async_write_file_stream, async_read_file_stream).
// The contract above holds (path rules, the sandbox user's permissions, normalized per-path errors,
// atomic replace), with these differences:
// - Memory stays bounded by one chunk whatever the file's size: a write pulls the next chunk from
//   its byte_source only once the previous one is in the file; a read hands out chunks of at most
//   file_stream_chunk_bytes.
// - A streamed write has its own cap (file_write_target::max_bytes, default 100 MiB) instead of
//   file_limits::max_file_bytes. Past it the write stops with too_large and leaves nothing.
// - Parent directories are created when file_write_target::create_parents says so.

// The most bytes one file_read_stream::async_next() returns (local backend).
inline constexpr std::size_t file_stream_chunk_bytes = 128 * 1024;
// The default cap of a streamed write.
inline constexpr std::uint64_t default_stream_write_bytes = 100 * 1024 * 1024;

// User-defined file metadata: short key/value pairs kept with a file as extended attributes named
// file_metadata_prefix + key (E2B's envd names them so, and both backends do the same, so code
// inside a sandbox finds them under the same names wherever it runs). They follow the file's
// inode: a rename keeps them, a replacing write brings its own.
//
// Keys are HTTP token characters (letters, digits and !#$%&'*+-.^_`|~; E2B carries them as
// X-Metadata-<key> headers), case-insensitive and kept lowercased, at most
// max_file_metadata_key_bytes each; values are printable US-ASCII (0x20-0x7e). All keys and values
// of one file, each key counted with the prefix, fit in max_file_metadata_bytes (one ext4 block,
// the budget every filesystem here keeps).
using file_metadata = std::map<std::string, std::string>;

inline constexpr std::string_view file_metadata_prefix = "user.e2b.";
inline constexpr std::size_t max_file_metadata_key_bytes = 255 - file_metadata_prefix.size();
inline constexpr std::size_t max_file_metadata_bytes = 4096;

// Checks `metadata` against the rules above and returns it with its keys lowercased.
// invalid_argument naming the first key (or value's key) that breaks a rule, or two keys that are
// the same once lowercased; too_large past max_file_metadata_bytes.
result<file_metadata> normalize_file_metadata(const file_metadata& metadata);

// Per-path outcome of backend::async_read_metadata: the file's metadata (empty when it has none,
// or its filesystem keeps no extended attributes), or one of the per-path errors.
struct file_metadata_result {
    std::string path;
    result<file_metadata> metadata;
};

struct file_write_target {
    std::string path;  // absolute, inside the sandbox
    // Permission bits of the written file; only 0777 is kept.
    std::uint32_t mode = 0644;
    // Create missing parent directories (mode 0755, owned by the sandbox user), as E2B's envd
    // does on upload. Without it a missing directory is file_not_found. Directories created
    // before a write failed stay.
    bool create_parents = false;
    // The most bytes the file may have; the byte past it ends the write with too_large.
    std::uint64_t max_bytes = default_stream_write_bytes;
    // As file_write::as_root.
    bool as_root = false;
    // The written file's metadata (rules above), set before the file appears at its path: the
    // file has exactly these (a replaced file's metadata is not kept). A key or value that breaks
    // the rules fails the write with invalid_argument, and a filesystem that keeps no extended
    // attributes (tmpfs before Linux 6.6) with not_supported, both leaving the target as it was.
    file_metadata metadata;
};

// Where a streamed write's bytes come from: each call returns the next chunk, an empty chunk ends
// the file, an error aborts the write (the error becomes the write's per-path outcome, its code
// kept and its detail prefixed with the path). Called on the backend's executor, one call at a
// time, never again after it returned an empty chunk or an error. A cancellation of the write
// reaches the source's pending call (its own operations see it).
using byte_source = std::function<asio::awaitable<result<std::string>>()>;

// One file being read, opened by async_read_file_stream. The file's type was checked (a regular
// file), and its size and permission bits were taken when it was opened; the stream then
// delivers exactly stat().size bytes in chunks and an empty chunk at the end. A file that
// shrinks while it is read fails the pull with backend_failure naming the path (the bytes
// announced cannot be delivered); bytes appended meanwhile are not read (the e2b backend, whose
// read is a Stat and then a GET, fails a file whose size changed in between: e2b_backend.hpp).
// Move-only; dropping it closes the file (and, through a sandbox handle, gives the sandbox's turn
// on).
class file_read_stream {
  public:
    struct impl {
        virtual ~impl() = default;
        virtual asio::awaitable<result<std::string>> async_next() = 0;
    };

    file_read_stream() = default;
    file_read_stream(file_stat stat, std::unique_ptr<impl> i)
        : stat_(std::move(stat)), impl_(std::move(i)) {}

    // path, type (regular), size and mode as they were when the file was opened.
    const file_stat& stat() const noexcept { return stat_; }

    // The next chunk (at most file_stream_chunk_bytes), or an empty string once stat().size bytes
    // were delivered. Calling again after the end or an error fails with invalid_argument.
    // Per-Operation Cancellation: the chunk being read completes first (it is bounded), then the
    // call completes with errc::cancelled and the stream is finished.
    asio::awaitable<result<std::string>> async_next() { return impl_->async_next(); }

    explicit operator bool() const noexcept { return impl_ != nullptr; }

  private:
    file_stat stat_;
    std::unique_ptr<impl> impl_;
};

}  // namespace moat
