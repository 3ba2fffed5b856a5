// Starts the moat-sandboxd helper: from the image embedded in this library (run from a sealed
// memfd) or from a path. posix_spawn only (vfork-based: safe and cheap in a large, threaded
// application); the helper gets its own process group (a terminal's Ctrl-C is the application's
// to handle), default signal dispositions, an empty signal mask and an empty environment.
#pragma once

#include <moat/result.hpp>

#include "core/unique_fd.hpp"

#include <string>

namespace moat {

struct launched_helper {
    unique_fd pidfd;   // for the application-side reap
    unique_fd socket;  // SOCK_SEQPACKET control socket (the helper's end is its fd 3)
};

result<launched_helper> launch_sandboxd(const std::string& sandboxd_path,
                                        const std::string& state_dir);

}  // namespace moat
