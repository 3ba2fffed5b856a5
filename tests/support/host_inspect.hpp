// Looking at sandboxes from the host, never through the backend under test: processes by host
// pid, cgroup directories, mounts.
#pragma once

#include <sys/types.h>
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace moat::test {

// All descendants of `root` (children, grandchildren, ...), read from /proc/<pid>/task/*/children.
std::vector<pid_t> descendants(pid_t root);

// True while /proc/<pid> exists and is not a zombie.
bool is_running(pid_t pid);

// True once /proc/<pid> is gone (the process has been reaped).
bool is_gone(pid_t pid);

// /proc/<pid>/cmdline with NULs turned into spaces; "" if unreadable.
std::string command_line(pid_t pid);

// The directory of `pid`'s cgroup in the v1 hierarchy of `controller` ("memory", "pids").
std::string cgroup_dir(pid_t pid, const std::string& controller);

// Polls `condition` every 10 ms until it holds or `timeout` passes; returns the last value.
bool eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = std::chrono::seconds(10));

// The parent of `pid`, from /proc/<pid>/stat, or -1.
pid_t parent_of(pid_t pid);

// First descendant of `root` whose command line contains `needle`, or -1. A fork that has not
// exec'd yet (its command line still its parent's) is passed over.
pid_t find_descendant(pid_t root, const std::string& needle);

// Reads a whole file; "" if it cannot be read.
std::string read_file(const std::string& path);

// Resident set size in bytes of `pid` (0: this process).
long resident_bytes(pid_t pid = 0);

// This process's open descriptors (/proc/self/fd), not counting the one that reads them.
std::size_t open_descriptors();

}  // namespace moat::test
