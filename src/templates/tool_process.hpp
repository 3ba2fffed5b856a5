// A host program a template build runs to completion (umoci): blocking, bounded in time and in
// what it keeps of the program's output.
#pragma once

#include <moat/result.hpp>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace moat::templates {

// The last non-empty line of `text`, control bytes and terminal escapes removed, at most 200
// bytes: what an error shows of a program's stderr (never all of it).
std::string last_line(std::string_view text);

// Runs `argv` (argv[0] looked up on PATH) in `cwd`, with stdin and stdout on /dev/null, stderr
// captured (its last 8 KiB kept), in a process group of its own, with an environment of PATH and
// LC_ALL=C only (nothing of moat's, so no secret). Waits through a pidfd until it exits or
// `deadline` passes; then the group is killed (SIGKILL) and reaped before returning.
// layer_unavailable when argv[0] is not installed, deadline_exceeded past the deadline,
// backend_failure when it exits non-zero or dies of a signal (the detail ends with last_line of
// its stderr).
result<void> run_tool(const std::vector<std::string>& argv, const std::string& cwd,
                      std::chrono::steady_clock::time_point deadline);

}  // namespace moat::templates
