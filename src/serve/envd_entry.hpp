// The pure parts of envd's filesystem service and file routes under `moat serve`: how a request's
// path resolves against the user's home, the EntryInfo message the SDK reads, and the
// in-sandbox commands whose output becomes EntryInfo.
//
// Stat, ListDir, MakeDir, Move and Remove run as one command each inside the sandbox (as its user,
// in its own mount namespace, so a symlink planted there can never reach the host). A command is
// an argv, never a shell line built from a path: the paths travel as positional parameters of a
// fixed /bin/sh script ("$1", "$2"), and `find -printf` reports each entry as NUL-separated fields,
// so a file name with spaces, quotes, newlines or leading dashes is just bytes. Every path handed
// to these commands is absolute (resolve_envd_path), so find never takes one for an expression.
//
// No I/O here: unit-tested in tests/serve_files_test.cpp.
#pragma once

#include <moat/files.hpp>
#include <moat/result.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat {
class json_writer;
}

namespace moat::serve {

// envd's path rules: "" is the home directory, "~" and "~/x" expand to it, "~other" is
// invalid_argument, a relative path is joined to the home; the result is made lexically clean
// (no "//", ".", ".." segments, no trailing '/'). invalid_argument for a NUL byte or a result
// longer than 4095 bytes.
result<std::string> resolve_envd_path(std::string_view path, std::string_view home);

// The directory holding a clean absolute path's last component ("/a/b" -> "/a", "/a" -> "/").
std::string parent_path(std::string_view clean_path);
// The last component ("/a/b" -> "b", "/" -> "/").
std::string base_name(std::string_view clean_path);

// filesystem.FileType.
enum class entry_type { unspecified = 0, file = 1, directory = 2, symlink = 3 };

// filesystem.EntryInfo, as envd fills it: for a symlink the type is its target's (unspecified
// when dangling) and symlink_target the target made absolute; permissions is Go's FileMode
// string of the entry itself ("drwxr-xr-x", "-rw-r--r--", "Lrwxrwxrwx").
struct entry_info {
    std::string name;
    entry_type type = entry_type::unspecified;
    std::string path;
    std::int64_t size = 0;
    std::uint32_t mode = 0;  // permission bits (0777 and setuid/setgid/sticky as 07777)
    std::string permissions;
    std::string owner;
    std::string group;
    std::int64_t modified_seconds = 0;
    std::int32_t modified_nanos = 0;
    std::optional<std::string> symlink_target;
    // The file's metadata (user.e2b.* attributes, a symlink's target's), read through the
    // backend (the listing commands do not print it); "metadata" only when not empty.
    file_metadata metadata;
};

// Go's os.FileMode.String() for a find %y type letter and %m permission bits.
std::string go_permissions(char find_type, std::uint32_t mode);

// The -printf format the commands below use: per entry %y %Y %s %m %u %g %T@ %l %p, each
// followed by a NUL.
std::string_view find_format();
// Parses find's output (a sequence of entries in find_format). protocol_error for output that
// is not a whole number of well-formed entries.
result<std::vector<entry_info>> parse_find_output(std::string_view output);

// Writes the EntryInfo JSON object (proto3 JSON: int64 size as a string, modifiedTime RFC 3339,
// symlinkTarget only for symlinks, metadata only when there is some).
void write_entry_info(json_writer& out, const entry_info& entry);
// The "metadata" member of an EntryInfo (or of an upload reply's entry); nothing when empty.
void write_metadata(json_writer& out, const file_metadata& metadata);

// What each in-sandbox command exits with, beside 0 (done) and anything else (failed: stderr
// names why).
inline constexpr int exit_not_found = 3;
inline constexpr int exit_not_directory = 4;   // ListDir of a non-directory; MakeDir on a non-dir
inline constexpr int exit_already_exists = 5;  // MakeDir on an existing directory

// argv of each command (run as the sandbox's user). Paths must be clean and absolute.
std::vector<std::string> stat_command(const std::string& path);
// Entries below `path` (a symlinked directory is followed) down to `depth` levels (1: children).
std::vector<std::string> list_command(const std::string& path, std::uint32_t depth);
// Creates `path` and missing parents (mode 0755 as umask allows), then stats it.
std::vector<std::string> make_dir_command(const std::string& path);
// Creates the destination's parents, renames (never into a directory: mv -T), then stats.
std::vector<std::string> move_command(const std::string& source, const std::string& destination);
// Removes recursively; a missing path is success (envd's os.RemoveAll).
std::vector<std::string> remove_command(const std::string& path);
// Creates a directory and its missing parents (POST /files does this for the file's parent).
std::vector<std::string> make_parents_command(const std::string& directory);

}  // namespace moat::serve
