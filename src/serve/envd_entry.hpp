// The pure parts of envd's filesystem service and file routes under `moat serve`: how a request's
// path resolves against the user's home, and the in-sandbox commands whose output becomes the
// EntryInfo the SDK reads (e2b_protocol/filesystem_messages.hpp writes it).
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

#include "e2b_protocol/filesystem_messages.hpp"

#include <moat/files.hpp>
#include <moat/result.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// filesystem.FileType and filesystem.EntryInfo, which the commands below fill as envd does.
using e2b_protocol::entry_info;
using e2b_protocol::entry_type;

// Go's os.FileMode.String() for a find %y type letter and %m permission bits.
std::string go_permissions(char find_type, std::uint32_t mode);

// The -printf format the commands below use: per entry %y %Y %s %m %u %g %T@ %l %p, each
// followed by a NUL.
std::string_view find_format();
// Parses find's output (a sequence of entries in find_format). protocol_error for output that
// is not a whole number of well-formed entries.
result<std::vector<entry_info>> parse_find_output(std::string_view output);

// Puts a listing in the order envd's walk gives it (filepath.WalkDir): depth first, each
// directory's entries by name, bytewise; so a directory's entries follow it, before a sibling
// whose name extends its own ("a", "a/x", "a-b").
void sort_as_walked(std::vector<entry_info>& entries);

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
