// Host-side file I/O for the CLI: bounded reads of a file or stdin, and atomic writes.
#pragma once

#include <moat/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace moat::cli {

// Reads a regular host file, or stdin for "-", of at most `limit` bytes. `mode` receives its
// permission bits (0644 for stdin). Errors: file_not_found, permission_denied, invalid_path (not a
// regular file), too_large, backend_failure; each detail names the path.
result<std::string> read_host_input(const std::string& path, std::uint64_t limit,
                                    std::uint32_t& mode);

// Writes `data` to a temporary file beside `path` (mode 0666 minus the umask), then renames it
// over `path`, so a failure never leaves a partial file under that name.
result<void> write_host_file_atomically(const std::string& path, std::string_view data);

}  // namespace moat::cli
