// The sandbox's sudo shim (the contract is sudo_shim.hpp): options and environment as sudo has
// them, then one exec record to pid 1's sudo socket and the command's end passed on.
#include "sandboxd/sudo_shim.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"

extern char** environ;

namespace moat::sandboxd {
namespace {

constexpr std::uint64_t request_id = 1;
constexpr const char* usage_text =
    "usage: sudo [-E] [-H] [-n] [-S] [-u root] [--] [NAME=VALUE...] COMMAND [ARG...]\n";
constexpr int passed_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

int refuse(const std::string& text) {
    std::fprintf(stderr, "sudo: %s\n", text.c_str());
    return 1;
}

bool is_root(std::string_view user) {
    return user == "root" || user == "#0" || user == "0";
}

// A NAME=VALUE argument: a shell variable name before the '='.
bool is_assignment(std::string_view arg) {
    const auto eq = arg.find('=');
    if (eq == 0 || eq == std::string_view::npos) return false;
    for (std::size_t i = 0; i < eq; ++i) {
        const char c = arg[i];
        const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
        if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
    }
    return true;
}

// What sudo keeps of the caller's environment without -E (its env_keep, and moat's forced
// proxy variables, without which a root command in a sandbox with a network policy has none).
bool kept(std::string_view name) {
    for (const char* k : {"PATH", "TERM", "LANG", "LANGUAGE", "COLORTERM", "TZ", "http_proxy",
                          "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"}) {
        if (name == k) return true;
    }
    return name.starts_with("LC_");
}

struct request {
    bool preserve_env = false;
    std::vector<std::string> assignments;
    std::vector<std::string> argv;
};

// Parses the options; -1 when the request is complete, else the exit code (a message printed).
int parse(int argc, char** argv, request& out) {
    int i = 1;
    const auto user_ok = [](std::string_view user) {
        if (is_root(user)) return true;
        std::fprintf(stderr, "sudo: only root is available in a moat sandbox, not '%.*s'\n",
                     static_cast<int>(user.size()), user.data());
        return false;
    };
    for (; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--") {
            ++i;
            break;
        }
        if (arg.size() < 2 || arg[0] != '-') break;
        if (arg.starts_with("--")) {
            if (arg == "--preserve-env" || arg.starts_with("--preserve-env=")) {
                out.preserve_env = true;
            } else if (arg == "--non-interactive" || arg == "--stdin" || arg == "--set-home") {
            } else if (arg.starts_with("--user=")) {
                if (!user_ok(arg.substr(7))) return 1;
            } else if (arg == "--user" && i + 1 < argc) {
                if (!user_ok(argv[++i])) return 1;
            } else if (arg == "--help") {
                std::fputs(usage_text, stdout);
                return 0;
            } else {
                std::fprintf(stderr, "sudo: unrecognized option '%s'\n%s", argv[i], usage_text);
                return 1;
            }
            continue;
        }
        for (std::size_t j = 1; j < arg.size(); ++j) {
            const char c = arg[j];
            if (c == 'E') {
                out.preserve_env = true;
            } else if (c == 'n' || c == 'S' || c == 'H') {
            } else if (c == 'h') {
                std::fputs(usage_text, stdout);
                return 0;
            } else if (c == 'u') {
                std::string_view user = arg.substr(j + 1);
                if (user.empty()) {
                    if (i + 1 >= argc) {
                        std::fprintf(stderr, "sudo: option requires an argument -- 'u'\n%s",
                                     usage_text);
                        return 1;
                    }
                    user = argv[++i];
                }
                if (!user_ok(user)) return 1;
                break;
            } else {
                std::fprintf(stderr, "sudo: invalid option -- '%c' (moat's sudo shim)\n%s", c,
                             usage_text);
                return 1;
            }
        }
    }
    for (; i < argc && is_assignment(argv[i]); ++i) out.assignments.emplace_back(argv[i]);
    for (; i < argc; ++i) out.argv.emplace_back(argv[i]);
    if (out.argv.empty()) {
        std::fputs(usage_text, stderr);
        return 1;
    }
    return -1;
}

// The name /etc/passwd gives `uid`, else the number (no NSS in a static binary: the sandbox's
// passwd is a plain file).
std::string user_name(uid_t uid) {
    const std::string number = std::to_string(uid);
    std::FILE* passwd = std::fopen("/etc/passwd", "re");
    if (passwd == nullptr) return number;
    char line[512];
    std::string found = number;
    while (std::fgets(line, sizeof line, passwd) != nullptr) {
        const std::string_view entry = line;
        const auto name_end = entry.find(':');
        const auto uid_start = entry.find(':', name_end + 1);
        if (name_end == std::string_view::npos || uid_start == std::string_view::npos) continue;
        const auto uid_end = entry.find(':', uid_start + 1);
        if (entry.substr(uid_start + 1, uid_end - uid_start - 1) == number) {
            found = std::string(entry.substr(0, name_end));
            break;
        }
    }
    std::fclose(passwd);
    return found;
}

std::vector<std::string> environment(const request& r) {
    std::map<std::string, std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) {
        const std::string_view entry = *e;
        const auto eq = entry.find('=');
        if (eq == std::string_view::npos) continue;
        const std::string name(entry.substr(0, eq));
        if (r.preserve_env || kept(name)) vars[name] = std::string(entry.substr(eq + 1));
    }
    if (!r.preserve_env || vars.count("HOME") == 0) vars["HOME"] = "/root";
    vars["USER"] = "root";
    vars["LOGNAME"] = "root";
    if (!r.preserve_env) vars["SHELL"] = "/bin/sh";
    vars["SUDO_USER"] = user_name(::getuid());
    vars["SUDO_UID"] = std::to_string(::getuid());
    vars["SUDO_GID"] = std::to_string(::getgid());
    std::string command;
    for (const auto& a : r.argv) command += (command.empty() ? "" : " ") + a;
    vars["SUDO_COMMAND"] = command;
    for (const auto& a : r.assignments) {
        const auto eq = a.find('=');
        vars[a.substr(0, eq)] = a.substr(eq + 1);
    }
    std::vector<std::string> out;
    for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
    return out;
}

int connect_agent() {
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, wire::sudo_socket_name.data(), wire::sudo_socket_name.size());
    const auto length =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + wire::sudo_socket_name.size());
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// The command's end as this process's own: its exit code, or its signal re-raised.
int end_as(const wire::exited_message& m, const std::string& program) {
    if ((m.flags & wire::exited_spawn_failed) != 0) {
        switch (m.spawn_errno) {
            case EPERM:
                return refuse("not allowed in this sandbox (it was created without allow_sudo)");
            case EAGAIN:
                return refuse("too many sudo commands are running in this sandbox");
            case ENOENT:
                return refuse(program + ": command not found");
            default:
                return refuse(program + ": " + std::strerror(m.spawn_errno));
        }
    }
    const int status = m.wait_status;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (!WIFSIGNALED(status)) return 1;
    const int sig = WTERMSIG(status);
    std::signal(sig, SIG_DFL);
    sigset_t just{};
    sigemptyset(&just);
    sigaddset(&just, sig);
    ::sigprocmask(SIG_UNBLOCK, &just, nullptr);
    ::raise(sig);
    return 128 + sig;
}

}  // namespace

bool invoked_as_sudo(std::string_view argv0) {
    const auto slash = argv0.rfind('/');
    if (slash != std::string_view::npos) argv0.remove_prefix(slash + 1);
    return argv0 == "sudo";
}

int run_sudo_shim(int argc, char** argv) {
    request r;
    if (const int code = parse(argc, argv, r); code >= 0) return code;
    const std::vector<std::string> env = environment(r);
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) == nullptr) std::strcpy(cwd, "/");
    std::vector<std::byte> record;
    if (!wire::encode_exec(request_id, 0, r.argv, env, cwd, record)) {
        return refuse("the command, its environment and working directory are too large");
    }
    // Three descriptors always go: a closed one stands for /dev/null.
    for (int fd = 0; fd < 3; ++fd) {
        if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", O_RDWR);
    }
    // Signals for the command are read from a signalfd from here on, also those the caller
    // ignored (a shell's background job ignores SIGINT): sudo relays them all.
    sigset_t passed{};
    sigemptyset(&passed);
    for (const int sig : passed_signals) {
        sigaddset(&passed, sig);
        std::signal(sig, SIG_DFL);
    }
    ::sigprocmask(SIG_BLOCK, &passed, nullptr);
    const int signals = ::signalfd(-1, &passed, SFD_CLOEXEC);
    const int agent = connect_agent();
    if (agent < 0) return refuse("the sandbox's agent does not answer (no sudo socket)");
    const int stdio[3] = {0, 1, 2};
    // A refusal may already be on its way back: the answer is read either way.
    if (wire::send_record(agent, record, stdio, 0) < 0 && errno != EPIPE && errno != ECONNRESET) {
        return refuse(std::string("sending the request: ") + std::strerror(errno));
    }
    std::byte buffer[512];
    for (;;) {
        pollfd fds[2] = {{agent, POLLIN, 0}, {signals, POLLIN, 0}};
        if (::poll(fds, signals >= 0 ? 2 : 1, -1) < 0) {
            if (errno == EINTR) continue;
            return refuse(std::string("poll: ") + std::strerror(errno));
        }
        signalfd_siginfo info{};
        if (signals >= 0 && fds[1].revents != 0 &&
            ::read(signals, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
            auto kill = wire::make_message<wire::kill_message>(wire::message_type::kill);
            kill.exec_id = request_id;
            kill.signal = static_cast<std::int32_t>(info.ssi_signo);
            (void)wire::send_record(agent, std::as_bytes(std::span(&kill, 1)), {}, 0);
        }
        if (fds[0].revents == 0) continue;
        int received[wire::max_fds_per_message];
        std::size_t count = 0;
        bool lost = false;
        const ssize_t n = wire::receive_record(agent, buffer, received, count, lost, 0);
        for (std::size_t i = 0; i < count; ++i) ::close(received[i]);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return refuse("the sandbox's agent ended the request");
        const std::span<const std::byte> reply(buffer, static_cast<std::size_t>(n));
        wire::exited_message exited{};
        if (wire::read_fixed(reply, wire::message_type::exited, exited)) {
            ::close(agent);
            return end_as(exited, r.argv.front());
        }
    }
}

}  // namespace moat::sandboxd
