// A server process a bench starts beside itself (redis-server, a python3 http.server): how it is
// stopped. Blocking, for the bench's own thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace moat::cli {

// Polls `serving` until it holds (true), the process exits (`pid` becomes -1) or `limit` passes;
// on false, `why` says which, naming the process as `name`.
bool wait_until_serving(pid_t& pid, const std::function<bool()>& serving, const std::string& name,
                        std::string& why,
                        std::chrono::milliseconds limit = std::chrono::seconds(10));

// SIGTERM, then SIGKILL once `grace` has passed, and reaped; `pid` becomes -1. Nothing for a pid
// of 0 or less.
void stop_helper_process(pid_t& pid, std::chrono::milliseconds grace = std::chrono::seconds(5));

// A new directory "/tmp/<prefix>-XXXXXX"; "" when it cannot be made.
std::string make_temporary_directory(const std::string& prefix);

// A server a bench starts beside itself in a temporary directory of its own. stop() (and the
// destructor) stops the process (stop_helper_process) and removes the directory.
class helper_server {
  public:
    helper_server() = default;
    ~helper_server() { stop(); }
    helper_server(const helper_server&) = delete;
    helper_server& operator=(const helper_server&) = delete;

    void stop();
    const std::string& directory() const noexcept { return dir_; }

  protected:
    // Makes the directory (/tmp/<prefix>-XXXXXX); false with `why` set when it cannot.
    bool make_directory(const std::string& prefix, std::string& why);
    // Forks and execs `argv` (found on PATH; its stdout and stderr to /dev/null when `quiet`),
    // then waits until `serving` holds (wait_until_serving, naming it `name`).
    bool launch(std::vector<std::string> argv, bool quiet, const std::function<bool()>& serving,
                const std::string& name, std::string& why);

  private:
    std::string dir_;
    pid_t pid_ = -1;
};

}  // namespace moat::cli
