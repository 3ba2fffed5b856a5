#include "support/serve_process.hpp"

#include "support/build_paths.hpp"
#include "support/host_inspect.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace moat::test {
namespace {

std::string random_hex(std::size_t bytes) {
    std::ifstream in("/dev/urandom", std::ios::binary);
    std::string out;
    static constexpr char digits[] = "0123456789abcdef";
    for (std::size_t i = 0; i < bytes; ++i) {
        const auto c = static_cast<unsigned char>(in.get());
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out;
}

// The value of the line "<label> <value>" in `text`, or "".
std::string printed(const std::string& text, const std::string& label) {
    std::size_t at = 0;
    while (at < text.size()) {
        const std::size_t end = text.find('\n', at);
        if (end == std::string::npos) break;  // an unfinished line
        const std::string line = text.substr(at, end - at);
        if (line.rfind(label + " ", 0) == 0) return line.substr(label.size() + 1);
        at = end + 1;
    }
    return "";
}

// "scheme://host:port" -> host, port.
std::pair<std::string, unsigned short> host_port(const std::string& url) {
    const std::size_t start = url.find("://");
    const std::size_t colon = url.rfind(':');
    if (start == std::string::npos || colon == std::string::npos || colon < start + 3) return {};
    return {url.substr(start + 3, colon - start - 3),
            static_cast<unsigned short>(std::stoi(url.substr(colon + 1)))};
}

// The direct children of `pid`.
std::vector<pid_t> children_of(pid_t pid) {
    std::vector<pid_t> out;
    const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
        std::istringstream in(read_file(task.path().string() + "/children"));
        pid_t child = 0;
        while (in >> child) out.push_back(child);
    }
    return out;
}

}  // namespace

serve_process::serve_process(serve_process_options options) {
    char dir_template[] = "/tmp/moat-serve-test-XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    work_dir_ = dir_template;
    state_dir_ = work_dir_ + "/state";
    key_file_ = work_dir_ + "/api-key";
    api_key_ = "e2b_" + random_hex(20);
    {
        std::ofstream out(key_file_);
        out << api_key_ << "\n";
    }
    ::chmod(key_file_.c_str(), 0600);

    std::vector<std::string> args = {moat::test::moat_cli_path(),
                                     "serve",
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--envd-listen",
                                     "127.0.0.1:0",
                                     "--api-key-file",
                                     key_file_,
                                     "--state-dir",
                                     state_dir_};
    if (!options.tls_cert_file.empty()) {
        args.insert(args.end(),
                    {"--tls-cert", options.tls_cert_file, "--tls-key", options.tls_key_file});
    }
    if (options.max_sandboxes) {
        args.insert(args.end(), {"--max-sandboxes", std::to_string(*options.max_sandboxes)});
    }
    if (options.destroy_on_exit) args.emplace_back("--destroy-on-exit");
    args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string out_path = work_dir_ + "/stdout";
    const std::string err_path = work_dir_ + "/stderr";
    const pid_t parent = ::getpid();

    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
        // Only async-signal-safe calls between fork and exec: the test process has threads.
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != parent) ::_exit(127);
        const int null_in = ::open("/dev/null", O_RDONLY);
        const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (null_in < 0 || out < 0 || err < 0) ::_exit(127);
        ::dup2(null_in, 0);
        ::dup2(out, 1);
        ::dup2(err, 2);
        if (options.open_files_limit) {
            const rlimit files{*options.open_files_limit, *options.open_files_limit};
            if (::setrlimit(RLIMIT_NOFILE, &files) != 0) ::_exit(127);
        }
        ::execve(argv[0], argv.data(), environ);
        ::_exit(127);
    }

    const auto limit = std::chrono::steady_clock::now() + options.start_deadline;
    for (;;) {
        const std::string text = stdout_text();
        api_url_ = printed(text, "api");
        envd_url_ = printed(text, "envd");
        if (!api_url_.empty() && !envd_url_.empty()) break;
        if (!is_running()) {
            FAIL("moat serve exited with " << stop() << " before listening: " << stderr_text());
        }
        if (std::chrono::steady_clock::now() > limit) {
            const int status = stop(std::chrono::seconds(5));
            FAIL("moat serve printed no listeners within " << options.start_deadline.count()
                                                           << " ms (stopped: " << status
                                                           << "): " << stderr_text());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

serve_process::~serve_process() {
    if (pid_ > 0 && !exit_status_) stop();
    std::error_code ignored;
    std::filesystem::remove_all(work_dir_, ignored);
}

std::string serve_process::api_host() const {
    return host_port(api_url_).first;
}
unsigned short serve_process::api_port() const {
    return host_port(api_url_).second;
}
std::string serve_process::envd_host() const {
    return host_port(envd_url_).first;
}
unsigned short serve_process::envd_port() const {
    return host_port(envd_url_).second;
}

bool serve_process::is_running() const {
    if (exit_status_ || pid_ <= 0) return false;
    // Not reaped here (stop() reaps): a zombie has exited.
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
        return false;
    }
    return info.si_pid == 0;
}

int serve_process::stop(std::chrono::milliseconds grace, int signal) {
    if (exit_status_) return *exit_status_;
    if (pid_ <= 0) return -1;
    ::kill(pid_, signal);
    auto reap = [this](std::chrono::milliseconds within) -> bool {
        const auto limit = std::chrono::steady_clock::now() + within;
        for (;;) {
            int status = 0;
            const pid_t got = ::waitpid(pid_, &status, WNOHANG);
            if (got == pid_) {
                exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                return true;
            }
            if (got < 0) {
                exit_status_ = -1;
                return true;
            }
            if (std::chrono::steady_clock::now() > limit) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    };
    if (!reap(grace)) {
        // Not a doctest macro: this also runs from destructors of statics, after doctest ended.
        std::fprintf(stderr, "moat serve did not exit within %lld ms of signal %d: SIGKILL\n",
                     static_cast<long long>(grace.count()), signal);
        ::kill(pid_, SIGKILL);
        if (!reap(std::chrono::seconds(10))) exit_status_ = -1;
    }
    return *exit_status_;
}

std::vector<pid_t> serve_process::descendants() const {
    if (pid_ <= 0 || exit_status_) return {};
    std::vector<pid_t> out;
    for (pid_t p : moat::test::descendants(pid_)) {
        if (moat::test::is_running(p)) out.push_back(p);
    }
    return out;
}

std::vector<pid_t> serve_process::sandbox_agents() const {
    // serve -> its helper (moat-helper) -> each sandbox's pid 1 (moat-agent) -> the commands.
    std::vector<pid_t> out;
    if (pid_ <= 0 || exit_status_) return out;
    for (pid_t helper : children_of(pid_)) {
        for (pid_t agent : children_of(helper)) {
            if (moat::test::is_running(agent)) out.push_back(agent);
        }
    }
    return out;
}

std::vector<pid_t> serve_process::sandbox_processes() const {
    std::vector<pid_t> out;
    for (pid_t agent : sandbox_agents()) {
        for (pid_t p : moat::test::descendants(agent)) {
            if (moat::test::is_running(p)) out.push_back(p);
        }
    }
    return out;
}

std::vector<pid_t> serve_process::sandbox_processes_matching(const std::string& needle) const {
    std::vector<pid_t> out;
    for (pid_t p : sandbox_processes()) {
        if (command_line(p).find(needle) != std::string::npos) out.push_back(p);
    }
    return out;
}

std::string serve_process::describe(const std::vector<pid_t>& pids) const {
    std::string out;
    for (pid_t p : pids) out += std::to_string(p) + ": " + command_line(p) + "\n";
    return out;
}

std::string serve_process::stdout_text() const {
    return read_file(work_dir_ + "/stdout");
}

std::string serve_process::stderr_text() const {
    return read_file(work_dir_ + "/stderr");
}

}  // namespace moat::test
