// moat-sandboxd: the sandbox helper and the pid-1 agent in one small static binary.
//
//   moat-sandboxd helper --state-dir DIR
//   moat-sandboxd agent --ttl-ms N [--max-processes N] [--survive-owner] [--egress-port N]
//                       [--allow-sudo]
//   sudo [OPTION...] COMMAND...   (run under that name: the sandbox's sudo shim, sudo_shim.hpp)
//
// The helper and the agent expect their control socket on fd 3 (see helper.hpp and agent.hpp).
// Inside a sandbox this binary is bind-mounted at /opt/moat/bin/sudo (template_root.cpp).
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "sandboxd/agent.hpp"
#include "sandboxd/helper.hpp"
#include "sandboxd/sudo_shim.hpp"

namespace {

int usage() {
    std::fputs(
        "usage: moat-sandboxd helper --state-dir DIR\n"
        "       moat-sandboxd agent --ttl-ms N [--max-processes N] [--survive-owner] "
        "[--egress-port N] [--allow-sudo]\n",
        stderr);
    return 2;
}

// Later opens must never land on 0-2 (or they would be mistaken for stdio by children).
void ensure_stdio_open() {
    for (int fd = 0; fd < 3; ++fd) {
        if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", O_RDWR);
    }
}

// The library's signal state leaks through posix_spawn: an ignored SIGCHLD would make the
// kernel auto-reap sandboxes, a blocked signal would stay blocked in every sandbox.
void reset_signals() {
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
        if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &default_action, nullptr);
    }
    // Writes to the pipe of a child that died must fail with EPIPE, not kill the helper.
    ::signal(SIGPIPE, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

// One pidfd per live sandbox: the application's soft limit (often 1024) would cap a helper at
// about a thousand sandboxes. Commands get a conventional soft limit back (see agent.cpp).
void raise_descriptor_limit() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &limit);
    }
}

// A whole decimal number that fits `out`, and nothing after it.
template <class Number>
bool parse_number(const char* text, Number& out) {
    const char* end = text + std::strlen(text);
    const auto [ptr, ec] = std::from_chars(text, end, out);
    return ec == std::errc() && ptr == end;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc >= 1 && moat::sandboxd::invoked_as_sudo(argv[0])) {
        return moat::sandboxd::run_sudo_shim(argc, argv);
    }
    if (argc < 2) return usage();
    const std::string_view mode = argv[1];
    if (mode == "helper") {
        if (argc != 4 || std::string_view(argv[2]) != "--state-dir" || argv[3][0] != '/') {
            return usage();
        }
        // Run from a memfd the process would be named after its descriptor ("8"); name it for ps.
        ::prctl(PR_SET_NAME, "moat-helper", 0, 0, 0);
        ensure_stdio_open();
        // The helper's only inherited descriptors are stdio and the control socket.
        ::close_range(4, ~0u, 0);
        reset_signals();
        raise_descriptor_limit();
        ::umask(022);
        return moat::sandboxd::run_helper(argv[3]);
    }
    if (mode == "agent") {
        std::uint64_t ttl_ms = 0;
        std::uint32_t max_processes = 0;
        std::uint32_t open_files = 0;
        bool survive_owner = false;
        bool allow_sudo = false;
        std::uint16_t egress_port = 0;
        for (int i = 2; i < argc; ++i) {
            const std::string_view arg = argv[i];
            if (arg == "--ttl-ms" && i + 1 < argc) {
                if (!parse_number(argv[++i], ttl_ms)) return usage();
            } else if (arg == "--max-processes" && i + 1 < argc) {
                if (!parse_number(argv[++i], max_processes)) return usage();
            } else if (arg == "--open-files" && i + 1 < argc) {
                if (!parse_number(argv[++i], open_files)) return usage();
            } else if (arg == "--egress-port" && i + 1 < argc) {
                if (!parse_number(argv[++i], egress_port) || egress_port == 0) return usage();
            } else if (arg == "--survive-owner") {
                survive_owner = true;
            } else if (arg == "--allow-sudo") {
                allow_sudo = true;
            } else {
                return usage();
            }
        }
        ::prctl(PR_SET_NAME, "moat-agent", 0, 0, 0);
        return moat::sandboxd::run_agent(ttl_ms, max_processes, open_files, survive_owner,
                                         egress_port, allow_sudo);
    }
    return usage();
}
