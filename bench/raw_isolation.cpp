// moat-bench-raw: the physical-limit baseline for `moat bench`. It applies exactly moat's default
// isolation (the same namespaces, template root, loopback, seccomp filter, cgroup v1 limits,
// private uid range and pid-1 agent, from the same sources as moat-sandboxd) with nothing around
// it: no library, no helper process, no IPC to the application, no Asio. What `moat bench` reports
// as moat / baseline is therefore the cost of the library and its helper, not of the isolation.
//
//   moat-bench-raw --state-dir DIR      driven over stdin/stdout, one line per request:
//     "run\n"  -> "<create_ms> <exec_ms> <destroy_ms>\n", or "error <detail>\n"
//   moat-bench-raw agent ...            the sandbox's pid 1 (as moat-sandboxd agent)
//
// Creates until the agent reports ready, execs /bin/true through the agent, destroys until pid 1
// is reaped and the cgroups are removed. Static, single-threaded, -O2; run as root.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <moat/sandbox_spec.hpp>

#include "sandboxd/agent.hpp"
#include "sandboxd/cgroups.hpp"
#include "sandboxd/seccomp_filter.hpp"
#include "sandboxd/spawn_sandbox.hpp"
#include "sandboxd/state_dir.hpp"
#include "sandboxd/template_root.hpp"
#include "sandboxd/uid_slots.hpp"
#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"

namespace {

using namespace moat;
using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point start) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
}

// Waits for one record of `type` on `fd`; false on anything else.
bool receive_type(int fd, wire::message_type type) {
    std::vector<std::byte> buffer(wire::max_message_bytes);
    int fds[wire::max_fds_per_message];
    std::size_t count = 0;
    bool lost = false;
    const ssize_t n = wire::receive_record(fd, buffer, fds, count, lost, 0);
    for (std::size_t i = 0; i < count; ++i) ::close(fds[i]);
    wire::header h{};
    return n > 0 &&
           wire::read_header(std::span<const std::byte>(buffer.data(), static_cast<std::size_t>(n)),
                             h) &&
           h.type == static_cast<std::uint32_t>(type);
}

struct raw_runner {
    std::string state_dir;
    std::string template_path;
    sandboxd::cgroups hierarchy;
    sandboxd::uid_slots slots;
    sandboxd::sandbox_spawner spawner;
    int self_exe = -1;
    std::uint64_t counter = 0;

    std::string setup() {
        if (::unshare(CLONE_NEWNS) != 0) return "unshare(CLONE_NEWNS) failed";
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
            return "make / private failed";
        std::string detail;
        // As the helper does: on a host where no sandbox was made yet, the directory is new.
        if (sandboxd::prepare_state_dir(state_dir, detail) != 0) return detail;
        template_path = state_dir + "/raw-bench-template";
        std::vector<std::string> bound;
        if (sandboxd::build_template_root(template_path, bound, detail) != 0) return detail;
        std::vector<sock_filter> filter;
        if (sandboxd::compile_seccomp_filter(filter, detail) != 0) return detail;
        self_exe = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
        if (self_exe < 0) return "open /proc/self/exe failed";
        if (slots.open() != 0)
            return std::string("uid slots: cannot open ") + sandboxd::host_lock_dir;
        if (spawner.init(template_path, bound, std::move(filter), self_exe, detail) != 0)
            return detail;
        hierarchy.discover();
        return "";
    }

    // Removes the cgroups, waiting (as the helper's loop does, with its timer) while the kernel
    // still counts the exiting tasks.
    int remove_cgroups(sandboxd::sandbox_cgroups& group) {
        int err = hierarchy.try_remove(group);
        for (int attempt = 0; err == EBUSY && attempt < 200; ++attempt) {
            const timespec pause{0, 1'000'000};
            ::nanosleep(&pause, nullptr);
            err = hierarchy.try_remove(group);
        }
        return err;
    }

    // One create / exec / destroy with moat's default limits.
    std::string run(double& create_ms, double& exec_ms, double& destroy_ms) {
        const std::string id =
            "sb-raw" + std::to_string(::getpid()) + "x" + std::to_string(counter++);
        auto start = clock_type::now();
        sandboxd::uid_slot slot;
        if (slots.claim(slot) != 0) return "uid slot";
        sandboxd::sandbox_cgroups group;
        std::string detail;
        const resource_limits defaults = resource_limits{}.with_defaults();
        const sandboxd::cgroup_limits limits{*defaults.memory_bytes, *defaults.pids,
                                             *defaults.cpu_millicores, false};
        if (hierarchy.create(id, limits, group, detail) != 0) {
            ::close(slot.lock_fd);
            return detail;
        }
        sandboxd::spawn_request request;
        request.sandbox_id = id;
        request.workspace_bytes = *defaults.workspace_bytes;
        request.tmp_bytes = *defaults.tmp_bytes;
        request.ttl_ms = 3'600'000;
        request.max_processes = *defaults.pids;
        request.open_files = *defaults.open_files;
        sandboxd::spawned_sandbox spawned;
        sandboxd::spawn_failure failure;
        const bool ok = spawner.spawn(request, slot, hierarchy, group, spawned, failure);
        ::close(slot.lock_fd);
        if (!ok) {
            remove_cgroups(group);
            return failure.detail;
        }
        const bool ready = receive_type(spawned.library_socket, wire::message_type::ready);
        create_ms = ms_since(start);

        start = clock_type::now();
        bool ran = false;
        if (ready) {
            std::vector<std::string> argv{"/bin/true"};
            std::vector<std::string> env{"PATH=/usr/bin:/bin"};
            std::vector<std::byte> record;
            const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
            const int stdio[3] = {null, null, null};
            ran = wire::encode_exec(1, 60'000, argv, env, "/workspace", record) &&
                  wire::send_record(spawned.library_socket, record, stdio, 0) > 0 &&
                  receive_type(spawned.library_socket, wire::message_type::started) &&
                  receive_type(spawned.library_socket, wire::message_type::exited);
            ::close(null);
        }
        exec_ms = ms_since(start);

        start = clock_type::now();
        ::syscall(SYS_pidfd_send_signal, spawned.pidfd, SIGKILL, nullptr, 0);
        siginfo_t info{};
        while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(spawned.pidfd), &info,
                        WEXITED) != 0 &&
               errno == EINTR) {
        }
        const int removed = remove_cgroups(group);
        ::close(spawned.pidfd);
        ::close(spawned.library_socket);
        destroy_ms = ms_since(start);
        if (!ready) return "the agent did not report ready";
        if (!ran) return "exec of /bin/true failed";
        if (removed != 0) return std::string("cgroup removal: ") + std::strerror(removed);
        return "";
    }
};

int run_agent_mode(int argc, char** argv) {
    std::uint64_t ttl_ms = 0;
    std::uint32_t max_processes = 0;
    std::uint32_t open_files = 0;
    bool survive = false;
    for (int i = 2; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--ttl-ms" && i + 1 < argc) {
            const char* t = argv[++i];
            std::from_chars(t, t + std::strlen(t), ttl_ms);
        } else if (arg == "--max-processes" && i + 1 < argc) {
            const char* t = argv[++i];
            std::from_chars(t, t + std::strlen(t), max_processes);
        } else if (arg == "--open-files" && i + 1 < argc) {
            const char* t = argv[++i];
            std::from_chars(t, t + std::strlen(t), open_files);
        } else if (arg == "--survive-owner") {
            survive = true;
        }
    }
    return sandboxd::run_agent(ttl_ms, max_processes, open_files, survive);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc >= 2 && std::string_view(argv[1]) == "agent") return run_agent_mode(argc, argv);
    if (argc != 3 || std::string_view(argv[1]) != "--state-dir") {
        std::fputs("usage: moat-bench-raw --state-dir DIR  (then \"run\" lines on stdin)\n",
                   stderr);
        return 2;
    }
    ::signal(SIGPIPE, SIG_IGN);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    raw_runner runner;
    runner.state_dir = argv[2];
    if (const std::string failed = runner.setup(); !failed.empty()) {
        std::printf("error %s\n", failed.c_str());
        return 1;
    }
    std::printf("ready\n");
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof line, stdin) != nullptr) {
        if (std::string_view(line).substr(0, 3) != "run") break;
        double create_ms = 0, exec_ms = 0, destroy_ms = 0;
        const std::string failed = runner.run(create_ms, exec_ms, destroy_ms);
        if (failed.empty()) {
            std::printf("%.4f %.4f %.4f\n", create_ms, exec_ms, destroy_ms);
        } else {
            std::printf("error %s\n", failed.c_str());
        }
        std::fflush(stdout);
    }
    return 0;
}
