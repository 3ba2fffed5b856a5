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

// An E2B-style API key ("e2b_" and 40 random hex digits) for a moat serve a bench starts.
std::string random_api_key();

// A new directory "/tmp/<prefix>-XXXXXX", removed with what it holds when this is destroyed (or
// by remove()). path() is "" when it could not be made.
class scratch_directory {
  public:
    scratch_directory() = default;
    explicit scratch_directory(const std::string& prefix) { make(prefix); }
    ~scratch_directory() { remove(); }
    scratch_directory(const scratch_directory&) = delete;
    scratch_directory& operator=(const scratch_directory&) = delete;

    const std::string& path() const noexcept { return path_; }
    // Removes the current directory (if any) and makes a new one; false when it cannot.
    bool make(const std::string& prefix);
    void remove() noexcept;

  private:
    std::string path_;
};

// A server a bench starts beside itself in a temporary directory of its own. stop() (and the
// destructor) stops the process (stop_helper_process) and removes the directory.
class helper_server {
  public:
    helper_server() = default;
    ~helper_server() { stop(); }
    helper_server(const helper_server&) = delete;
    helper_server& operator=(const helper_server&) = delete;

    void stop();
    const std::string& directory() const noexcept { return dir_.path(); }

  protected:
    // Makes the directory (/tmp/<prefix>-XXXXXX); false with `why` set when it cannot.
    bool make_directory(const std::string& prefix, std::string& why);
    // Forks and execs `argv` (found on PATH; its stdout and stderr to /dev/null when `quiet`),
    // then waits until `serving` holds (wait_until_serving, naming it `name`).
    bool launch(std::vector<std::string> argv, bool quiet, const std::function<bool()>& serving,
                const std::string& name, std::string& why);

  private:
    scratch_directory dir_;
    pid_t pid_ = -1;
};

}  // namespace moat::cli
