#include "support/session_worker_process.hpp"

#include "support/build_paths.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

namespace moat::test {

using namespace std::chrono_literals;

worker_process start_worker(const std::vector<std::string>& args) {
    int pipe_fds[2];
    REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(pipe_fds[1], STDOUT_FILENO);
        std::vector<char*> argv;
        static std::string path = moat::test::session_worker_path();
        argv.push_back(path.data());
        std::vector<std::string> copy = args;
        for (auto& a : copy) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execv(path.c_str(), argv.data());
        ::_exit(127);
    }
    ::close(pipe_fds[1]);
    return worker_process{pid, pipe_fds[0]};
}

std::string read_line(const worker_process& w, const std::string& prefix) {
    std::string line;
    const auto limit = std::chrono::steady_clock::now() + 90s;
    for (;;) {
        pollfd p{w.out, POLLIN, 0};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            limit - std::chrono::steady_clock::now());
        if (left.count() <= 0) return line;
        const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) return line;
        char ch;
        const ssize_t n = ::read(w.out, &ch, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return line;
        if (ch == '\n') {
            if (line.rfind(prefix, 0) == 0) return line;
            line.clear();
            continue;
        }
        line += ch;
    }
}

int finish(worker_process& w) {
    int status = 0;
    const auto limit = std::chrono::steady_clock::now() + 120s;
    while (::waitpid(w.pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > limit) {
            ::kill(w.pid, SIGKILL);
            ::waitpid(w.pid, &status, 0);
            break;
        }
        std::this_thread::sleep_for(10ms);
    }
    ::close(w.out);
    w.out = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string field(const std::string& line, const std::string& name) {
    const auto at = line.find(name + "=");
    if (at == std::string::npos) return "";
    const auto start = at + name.size() + 1;
    return line.substr(start, line.find(' ', start) - start);
}

acquires collect_acquires(std::vector<worker_process>& workers) {
    acquires got;
    for (auto& w : workers) {
        const auto line = read_line(w, "id=");
        CAPTURE(line);
        CHECK(finish(w) == 0);
        got.ids.insert(field(line, "id"));
        got.rebuilt += field(line, "rebuilt") == "1" ? 1 : 0;
    }
    return got;
}

std::size_t running_with(local_fixture& f, const std::map<std::string, std::string>& labels) {
    auto listed = f.run(f.local->async_list(labels));
    REQUIRE(listed);
    std::size_t n = 0;
    for (const auto& info : *listed) n += info.state == moat::sandbox_state::running ? 1 : 0;
    return n;
}

}  // namespace moat::test
