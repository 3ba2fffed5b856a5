// A layer's tree on disk (templates.hpp has the rules): copying a host directory into a layer,
// refusing and clearing what the rules say, its canonical digest, and its removal. Every walk is
// descriptor-relative (openat, fstatat with AT_SYMLINK_NOFOLLOW), so a symbolic link in a tree is
// only ever copied, never followed, and a tree cannot steer the walk outside itself.
#pragma once

#include <moat/result.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace moat::templates {

// The ids a layer may store: those of a sandbox (0-65535).
inline constexpr std::uint32_t max_layer_id = 65535;

struct copied_tree {
    std::uint64_t bytes = 0;           // regular files' sizes, summed
    std::vector<std::string> cleared;  // what the copy changed, one line per path
};

// Copies the tree at `source` into `target` (made here, 0700 until the copy is whole, then the
// source root's mode). invalid_argument naming the path for what the rules refuse, too_large past
// `max_bytes`, file_not_found when `source` is missing. On failure `target` may hold part of the
// copy: the caller removes it.
result<copied_tree> copy_tree(const std::string& source, const std::string& target,
                              std::uint64_t max_bytes);

// Checks what a root needs (the mount points a sandbox uses are directories or absent, absent
// ones are made; /bin/sh is an executable regular file, found inside the tree).
result<void> check_root(const std::string& root);

// "sha256:<hex>" of the tree's canonical listing (templates.hpp).
result<std::string> tree_digest(const std::string& root);

// The whole file at `path` (not through a final symbolic link), refused (invalid_argument) past
// `max_bytes`; file_not_found when it is missing.
result<std::string> read_small_file(const std::string& path, std::size_t max_bytes);

// Removes the tree at `path` (never following a link). Best effort: what cannot be removed stays.
void remove_tree(const std::string& path);

}  // namespace moat::templates
