#include "cli/bench/helper_process.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <thread>

namespace moat::cli {

bool wait_until_serving(pid_t& pid, const std::function<bool()>& serving, const std::string& name,
                        std::string& why, std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!serving()) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) != 0) {
            pid = -1;
            why = name + " exited at start";
            return false;
        }
        if (std::chrono::steady_clock::now() > until) {
            why = name + " did not listen within " +
                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(limit).count()) +
                  " s";
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
}

void stop_helper_process(pid_t& pid, std::chrono::milliseconds grace) {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    int status = 0;
    const auto limit = std::chrono::steady_clock::now() + grace;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > limit) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid = -1;
}

}  // namespace moat::cli
