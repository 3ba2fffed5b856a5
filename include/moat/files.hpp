// File transfer types. Paths are absolute paths inside the sandbox; every path gets its own
// result, so one bad path never fails a whole batch.
#pragma once

#include <moat/result.hpp>

#include <cstdint>
#include <string>

namespace moat {

struct file_limits {
    std::uint64_t max_file_bytes = 10 * 1024 * 1024;    // per file
    std::size_t max_files = 100;                        // per batch
    std::uint64_t max_batch_bytes = 100 * 1024 * 1024;  // per batch
};

struct file_write {
    std::string path;     // absolute, inside the sandbox
    std::string content;  // bytes
    std::uint32_t mode = 0644;
};

// Per-path outcome of a write: empty on success, else file_not_found, invalid_path,
// is_directory, permission_denied or too_large with a detail naming the path.
struct file_write_result {
    std::string path;
    result<void> outcome;
};

struct file_read_result {
    std::string path;
    result<std::string> content;
};

enum class file_type { regular, directory, symlink, other };

struct file_stat {
    std::string path;
    file_type type = file_type::regular;
    std::uint64_t size = 0;
    std::uint32_t mode = 0;
};

struct dir_entry {
    std::string name;
    file_type type = file_type::regular;
    std::uint64_t size = 0;
};

}  // namespace moat
