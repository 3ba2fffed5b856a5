#include "cli/bench/helper_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>
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

std::string random_api_key() {
    std::random_device device;
    std::string key = "e2b_";
    constexpr const char* hex = "0123456789abcdef";
    for (int i = 0; i < 40; ++i) key += hex[device() % 16];
    return key;
}

bool scratch_directory::make(const std::string& prefix) {
    remove();
    std::string pattern = "/tmp/" + prefix + "-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) return false;
    path_ = std::move(pattern);
    return true;
}

void scratch_directory::remove() noexcept {
    if (path_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
    path_.clear();
}

void helper_server::stop() {
    stop_helper_process(pid_);
    dir_.remove();
}

bool helper_server::make_directory(const std::string& prefix, std::string& why) {
    if (dir_.make(prefix)) return true;
    why = "cannot make a temporary directory under /tmp";
    return false;
}

bool helper_server::launch(std::vector<std::string> argv, bool quiet,
                           const std::function<bool()>& serving, const std::string& name,
                           std::string& why) {
    std::vector<char*> pointers;
    for (auto& a : argv) pointers.push_back(a.data());
    pointers.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) {
        why = "fork failed";
        return false;
    }
    if (pid_ == 0) {
        if (quiet) {
            const int null = ::open("/dev/null", O_WRONLY);
            ::dup2(null, STDOUT_FILENO);
            ::dup2(null, STDERR_FILENO);
        }
        ::execvp(pointers[0], pointers.data());
        ::_exit(127);
    }
    return wait_until_serving(pid_, serving, name, why);
}

}  // namespace moat::cli
