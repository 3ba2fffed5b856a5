// A server process a bench starts beside itself (redis-server, a python3 http.server): how it is
// stopped. Blocking, for the bench's own thread.
#pragma once

#include <sys/types.h>

#include <chrono>

namespace moat::cli {

// SIGTERM, then SIGKILL once `grace` has passed, and reaped; `pid` becomes -1. Nothing for a pid
// of 0 or less.
void stop_helper_process(pid_t& pid, std::chrono::milliseconds grace = std::chrono::seconds(5));

}  // namespace moat::cli
