// A server process a bench starts beside itself (redis-server, a python3 http.server): how it is
// stopped. Blocking, for the bench's own thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>

namespace moat::cli {

// Polls `serving` until it holds (true), the process exits (`pid` becomes -1) or `limit` passes;
// on false, `why` says which, naming the process as `name`.
bool wait_until_serving(pid_t& pid, const std::function<bool()>& serving, const std::string& name,
                        std::string& why,
                        std::chrono::milliseconds limit = std::chrono::seconds(10));

// SIGTERM, then SIGKILL once `grace` has passed, and reaped; `pid` becomes -1. Nothing for a pid
// of 0 or less.
void stop_helper_process(pid_t& pid, std::chrono::milliseconds grace = std::chrono::seconds(5));

}  // namespace moat::cli
