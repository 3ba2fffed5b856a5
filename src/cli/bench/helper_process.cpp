#include "cli/bench/helper_process.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <thread>

namespace moat::cli {

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
