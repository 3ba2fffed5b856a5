#include "cli/bench/baselines.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

extern char** environ;

namespace moat::cli {
namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

bool is_executable(const std::string& path) {
    return !path.empty() && ::access(path.c_str(), X_OK) == 0;
}

// Reads one line (without the newline) within `timeout_ms`; false on timeout or EOF.
bool read_line(int fd, std::string& line, int timeout_ms) {
    line.clear();
    const auto limit = clock_type::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(limit - clock_type::now());
        if (left.count() <= 0) return false;
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
        char c;
        const ssize_t n = ::read(fd, &c, 1);
        if (n <= 0) return false;
        if (c == '\n') return true;
        if (line.size() < 4096) line.push_back(c);
    }
}

}  // namespace

std::unique_ptr<raw_baseline> raw_baseline::start(const std::string& path,
                                                  const std::string& state_dir, std::string& why) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return nullptr;
    if (::pipe2(out, O_CLOEXEC) != 0) {
        ::close(in[0]);
        ::close(in[1]);
        return nullptr;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    std::string p = path, flag = "--state-dir", dir = state_dir;
    char* argv[] = {p.data(), flag.data(), dir.data(), nullptr};
    std::unique_ptr<raw_baseline> r(new raw_baseline());
    const int err = ::posix_spawn(&r->pid_, path.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    r->to_ = in[1];
    r->from_ = out[0];
    if (err != 0) {
        why = "cannot start " + path + ": " + std::strerror(err);
        r->pid_ = -1;
        return nullptr;
    }
    std::string line;
    if (!read_line(r->from_, line, 60'000) || line != "ready") {
        why = "moat-bench-raw did not start: " + (line.empty() ? "no answer" : line);
        return nullptr;
    }
    return r;
}

raw_baseline::~raw_baseline() {
    if (to_ >= 0) ::close(to_);  // EOF ends it
    if (from_ >= 0) ::close(from_);
    if (pid_ > 0) {
        int status = 0;
        // It exits on EOF; do not wait forever for it.
        for (int i = 0; i < 200 && ::waitpid(pid_, &status, WNOHANG) == 0; ++i) ::usleep(10'000);
        if (::waitpid(pid_, &status, WNOHANG) == 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, &status, 0);
        }
    }
}

std::optional<raw_baseline::sample> raw_baseline::run(std::string& why) {
    if (::write(to_, "run\n", 4) != 4) {
        why = "moat-bench-raw is gone";
        return std::nullopt;
    }
    std::string line;
    if (!read_line(from_, line, 30'000)) {
        why = "moat-bench-raw did not answer";
        return std::nullopt;
    }
    sample s;
    if (std::sscanf(line.c_str(), "%lf %lf %lf", &s.create_ms, &s.exec_ms, &s.destroy_ms) != 3) {
        why = line;
        return std::nullopt;
    }
    return s;
}

std::string find_raw_baseline(const std::string& hint) {
    if (!hint.empty()) return is_executable(hint) ? hint : "";
    char self[4096] = {};
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return "";
    std::string dir(self, static_cast<std::size_t>(n));
    dir = dir.substr(0, dir.rfind('/'));
    for (const std::string& candidate : {dir + "/bench/moat-bench-raw", dir + "/moat-bench-raw",
                                         dir + "/../libexec/moat/moat-bench-raw"}) {
        if (is_executable(candidate)) return candidate;
    }
    return "";
}

std::string find_bwrap() {
    for (const char* candidate : {"/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"}) {
        if (is_executable(candidate)) return candidate;
    }
    return "";
}

std::optional<double> bwrap_run_true(const std::string& bwrap) {
    // Flags comparable to moat's defaults: every namespace bwrap offers, read-only /usr, private
    // /proc, /dev, /tmp and /workspace, no capabilities, a new session, death with its parent.
    std::vector<std::string> args = {bwrap,
                                     "--unshare-all",
                                     "--die-with-parent",
                                     "--new-session",
                                     "--cap-drop",
                                     "ALL",
                                     "--ro-bind",
                                     "/usr",
                                     "/usr",
                                     "--symlink",
                                     "usr/bin",
                                     "/bin",
                                     "--symlink",
                                     "usr/lib",
                                     "/lib",
                                     "--symlink",
                                     "usr/lib64",
                                     "/lib64",
                                     "--proc",
                                     "/proc",
                                     "--dev",
                                     "/dev",
                                     "--tmpfs",
                                     "/tmp",
                                     "--tmpfs",
                                     "/workspace",
                                     "--chdir",
                                     "/workspace",
                                     "--",
                                     "/bin/true"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    const auto start = clock_type::now();
    pid_t pid = -1;
    const int err = ::posix_spawn(&pid, bwrap.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (err != 0) return std::nullopt;
    int status = 0;
    ::waitpid(pid, &status, 0);
    const double ms = ms_since(start);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
    return ms;
}

double host_spawn_true() {
    char arg0[] = "/bin/true";
    char* argv[] = {arg0, nullptr};
    const auto start = clock_type::now();
    pid_t pid = -1;
    if (::posix_spawn(&pid, "/bin/true", nullptr, nullptr, argv, environ) != 0) return 0;
    int status = 0;
    ::waitpid(pid, &status, 0);
    return ms_since(start);
}

}  // namespace moat::cli
