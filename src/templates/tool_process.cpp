#include "templates/tool_process.hpp"

#include "core/spawn_attributes.hpp"
#include "core/unique_fd.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

namespace moat::templates {
namespace {

constexpr std::size_t kept_stderr_bytes = 8 * 1024;

// Waits for `pid` (already dead or killed), retrying on EINTR.
int reap(pid_t pid) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
}

}  // namespace

std::string last_line(std::string_view text) {
    std::string clean;
    clean.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c == 0x1b) {  // ESC [ ... final byte: a terminal escape
            if (i + 1 < text.size() && text[i + 1] == '[') {
                i += 2;
                while (i < text.size() && (text[i] < 0x40 || text[i] > 0x7e)) ++i;
            }
            continue;
        }
        if (c == '\n' || c >= 0x20) clean += static_cast<char>(c == 0x7f ? '?' : c);
    }
    std::size_t end = clean.size();
    while (end > 0) {
        const std::size_t start = clean.rfind('\n', end - 1);
        const std::size_t from = start == std::string::npos ? 0 : start + 1;
        std::string_view line = std::string_view(clean).substr(from, end - from);
        while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        while (!line.empty() && line.back() == ' ') line.remove_suffix(1);
        if (!line.empty()) return std::string(line.substr(0, 200));
        if (start == std::string::npos) break;
        end = start;
    }
    return "(no output)";
}

result<void> run_tool(const std::vector<std::string>& argv, const std::string& cwd,
                      std::chrono::steady_clock::time_point deadline) {
    const std::string& program = argv.at(0);
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
        return make_error(errc::backend_failure, "pipe: " + std::string(std::strerror(errno)));
    unique_fd read_end(pipe_fds[0]);
    unique_fd write_end(pipe_fds[1]);
    detail::spawn_attributes setup;
    posix_spawn_file_actions_addopen(&setup.actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&setup.actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&setup.actions, write_end.get(), 2);
    posix_spawn_file_actions_addchdir_np(&setup.actions, cwd.c_str());
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::array<char*, 3> environment = {
        const_cast<char*>("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        const_cast<char*>("LC_ALL=C"), nullptr};
    pid_t pid = 0;
    const int spawned = ::posix_spawnp(&pid, program.c_str(), &setup.actions, &setup.attr,
                                       args.data(), environment.data());
    write_end.reset();
    if (spawned == ENOENT)
        return make_error(errc::layer_unavailable,
                          program + " is not installed (Debian: apt-get install " + program + ")");
    if (spawned != 0)
        return make_error(errc::backend_failure,
                          "run " + program + ": " + std::string(std::strerror(spawned)));
    unique_fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd.is_open()) {
        const int err = errno;
        ::kill(-pid, SIGKILL);
        reap(pid);
        return make_error(errc::backend_failure, "pidfd_open: " + std::string(std::strerror(err)));
    }
    std::string kept;
    std::array<char, 4096> buffer;
    // Reads what is ready on stderr; false at its end.
    const auto drain = [&]() {
        const ssize_t got = ::read(read_end.get(), buffer.data(), buffer.size());
        if (got < 0) return errno == EINTR;
        if (got == 0) return false;
        kept.append(buffer.data(), static_cast<std::size_t>(got));
        if (kept.size() > kept_stderr_bytes) kept.erase(0, kept.size() - kept_stderr_bytes);
        return true;
    };
    bool output_open = true;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            ::kill(-pid, SIGKILL);
            reap(pid);
            return make_error(errc::deadline_exceeded,
                              program + " ran past its deadline and was killed");
        }
        std::array<pollfd, 2> waits{{{pidfd.get(), POLLIN, 0}, {read_end.get(), POLLIN, 0}}};
        const int n = ::poll(waits.data(), output_open ? 2 : 1,
                             static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
        if (n < 0 && errno != EINTR) {
            const int err = errno;
            ::kill(-pid, SIGKILL);
            reap(pid);
            return make_error(errc::backend_failure, "poll: " + std::string(std::strerror(err)));
        }
        if (n <= 0) continue;
        if (output_open && waits[1].revents != 0) output_open = drain();
        if (waits[0].revents != 0) break;
    }
    // It exited: its group goes too (nothing it started outlives it), then what is left of its
    // stderr is read, a short while at most.
    ::kill(-pid, SIGKILL);
    for (int polls = 0; output_open && polls < 50; ++polls) {
        pollfd wait{read_end.get(), POLLIN, 0};
        if (::poll(&wait, 1, 100) > 0) output_open = drain();
    }
    const int status = reap(pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
    const std::string how = WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                              : "signal " + std::to_string(WTERMSIG(status));
    return make_error(errc::backend_failure, program + " failed (" + how + "): " + last_line(kept));
}

}  // namespace moat::templates
