// The shared-session tests' worker processes: tests/session_worker.cpp (moat_session_worker) run
// as a child whose stdout the test reads line by line. Every wait is bounded.
#pragma once

#include "support/local_fixture.hpp"

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace moat::test {

struct worker_process {
    pid_t pid = -1;
    int out = -1;  // the read end of its stdout
};

// Starts moat_session_worker with `args` (STORE KEY ACTION [flags]; see tests/session_worker.cpp).
worker_process start_worker(const std::vector<std::string>& args);

// Reads until a line starting with `prefix` (returned, without the newline), the end of its
// output, or 90 s (then what was read of the last line).
std::string read_line(const worker_process& w, const std::string& prefix = "");

// Waits for it to exit (at most 120 s, then SIGKILL) and closes its pipe: its exit code, or
// 128 + the signal that ended it.
int finish(worker_process& w);

// The value of `name=` in a worker's line ("" when absent).
std::string field(const std::string& line, const std::string& name);

// What a group of `acquire` workers printed: the sandbox ids they got and how many were told of
// a rebuild. Reads each one's "id=" line, CHECKs that it exited 0, and finishes it.
struct acquires {
    std::set<std::string> ids;
    int rebuilt = 0;
};
acquires collect_acquires(std::vector<worker_process>& workers);

// How many sandboxes with these labels the local backend has running.
std::size_t running_with(local_fixture& f, const std::map<std::string, std::string>& labels);

}  // namespace moat::test
