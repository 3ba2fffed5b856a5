// moat-sandboxd tested over its wire protocol: a real helper process, real namespaces, real
// commands. Every wait is bounded by a poll timeout, so a broken helper fails a test, never hangs.
#include "support/host_sharing.hpp"

#include <moat/errc.hpp>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"
#include "wire/state_layout.hpp"

namespace {

namespace wire = moat::wire;

constexpr int wait_ms = 10'000;

struct record {
    std::vector<std::byte> bytes;
    std::vector<int> fds;

    wire::message_type type() const {
        wire::header h{};
        if (!wire::read_header(bytes, h)) return wire::message_type{};
        return static_cast<wire::message_type>(h.type);
    }
    template <class Message>
    Message as() const {
        Message m{};
        const wire::message_type t = type();
        REQUIRE(wire::read_fixed(bytes, t, m));
        return m;
    }
};

bool wait_readable(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 1;
}

// One record, or an empty record on EOF or timeout.
record receive(int socket, int timeout_ms = wait_ms) {
    record r;
    if (!wait_readable(socket, timeout_ms)) return r;
    r.bytes.resize(wire::max_message_bytes);
    int fds[wire::max_fds_per_message];
    std::size_t count = 0;
    bool lost = false;
    const ssize_t n = wire::receive_record(socket, r.bytes, fds, count, lost, 0);
    r.bytes.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    r.fds.assign(fds, fds + count);
    return r;
}

template <class Message>
void send_message(int socket, const Message& m, std::span<const int> fds = {}) {
    REQUIRE(wire::send_record(socket, std::as_bytes(std::span(&m, 1)), fds, 0) ==
            static_cast<ssize_t>(sizeof m));
}

bool process_gone(pid_t pid) {
    const std::string proc = "/proc/" + std::to_string(pid);
    return ::kill(pid, 0) != 0 && errno == ESRCH && ::access(proc.c_str(), F_OK) != 0;
}

// Gone, or a zombie waiting for whoever adopted it.
bool process_dead(pid_t pid) {
    if (process_gone(pid)) return true;
    const std::string stat_path = "/proc/" + std::to_string(pid) + "/stat";
    char text[512] = {};
    const int fd = ::open(stat_path.c_str(), O_RDONLY | O_CLOEXEC);
    const ssize_t n = fd >= 0 ? ::read(fd, text, sizeof text - 1) : -1;
    if (fd >= 0) ::close(fd);
    const char* end = n > 0 ? std::strrchr(text, ')') : nullptr;
    return end == nullptr || end[2] == 'Z';
}

// The sandbox's cgroup directories, assuming the usual /sys/fs/cgroup/<controllers> mounts.
std::vector<std::string> cgroup_dirs(pid_t pid) {
    std::vector<std::string> dirs;
    const std::string path = "/proc/" + std::to_string(pid) + "/cgroup";
    std::string text(4096, '\0');
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const ssize_t n = fd >= 0 ? ::read(fd, text.data(), text.size()) : -1;
    if (fd >= 0) ::close(fd);
    text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    std::size_t start = 0;
    while (start < text.size()) {
        std::size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(start, end - start);
        start = end + 1;
        const auto first = line.find(':');
        const auto second = line.find(':', first + 1);
        if (second == std::string::npos || line.find("/moat/") == std::string::npos) continue;
        dirs.push_back("/sys/fs/cgroup/" + line.substr(first + 1, second - first - 1) +
                       line.substr(second + 1));
    }
    return dirs;
}

// Processes whose command line (NULs as spaces) contains `needle`.
std::vector<pid_t> processes_running(const std::string& needle) {
    std::vector<pid_t> found;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
        const std::string name = entry.path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        const int fd = ::open((entry.path() / "cmdline").c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        std::string text(4096, '\0');
        const ssize_t n = ::read(fd, text.data(), text.size());
        ::close(fd);
        text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
        std::replace(text.begin(), text.end(), '\0', ' ');
        const pid_t pid = std::atoi(name.c_str());
        if (text.find(needle) != std::string::npos && !process_dead(pid)) found.push_back(pid);
    }
    return found;
}

bool path_exists(const char* path) {
    return path[0] != '\0' && ::access(path, F_OK) == 0;
}

// A helper started the way the library starts it: posix_spawn, control socket on fd 3, no env.
class helper_process {
  public:
    helper_process() {
        char dir_template[] = "/tmp/moat-sbxd-test-XXXXXX";
        REQUIRE(::mkdtemp(dir_template) != nullptr);
        // Sandbox setup runs as unprivileged host uids that must reach the template inside.
        REQUIRE(::chmod(dir_template, 0711) == 0);
        state_dir_ = std::string(dir_template) + "/state";
        int sockets[2];
        REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) == 0);
        socket_ = sockets[0];
        // Keep the child's end off fd 3 so the dup2 below really clears close-on-exec.
        const int child_end = ::fcntl(sockets[1], F_DUPFD_CLOEXEC, 10);
        ::close(sockets[1]);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, child_end, 3);
        std::string path = MOAT_SANDBOXD_PATH;
        std::string mode = "helper";
        std::string flag = "--state-dir";
        char* argv[] = {path.data(), mode.data(), flag.data(), state_dir_.data(), nullptr};
        char* envp[] = {nullptr};
        REQUIRE(::posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv, envp) == 0);
        posix_spawn_file_actions_destroy(&actions);
        ::close(child_end);
        const record r = receive(socket_);
        REQUIRE(r.type() == wire::message_type::hello);
        hello = r.as<wire::hello_message>();
    }

    ~helper_process() {
        close_socket();
        if (pid_ > 0 && !wait_exit(wait_ms)) {
            ::kill(pid_, SIGKILL);
            wait_exit(wait_ms);
        }
        std::error_code ignored;
        std::filesystem::remove_all(std::filesystem::path(state_dir_).parent_path(), ignored);
    }

    helper_process(const helper_process&) = delete;
    helper_process& operator=(const helper_process&) = delete;

    int socket() const { return socket_; }
    pid_t pid() const { return pid_; }
    const std::string& state_dir() const { return state_dir_; }

    void close_socket() {
        if (socket_ >= 0) ::close(socket_);
        socket_ = -1;
    }

    // True once the helper has exited (and was reaped) within the timeout.
    bool wait_exit(int timeout_ms) {
        for (int waited = 0; waited <= timeout_ms; waited += 5) {
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                exit_status = status;
                pid_ = -1;
                return true;
            }
            ::usleep(5000);
        }
        return false;
    }

    wire::hello_message hello{};
    int exit_status = -1;

  private:
    std::string state_dir_;
    int socket_ = -1;
    pid_t pid_ = -1;
};

struct sandbox_options {
    std::uint64_t memory_bytes = 256ull << 20;
    std::uint32_t pids_max = 64;
    std::uint32_t cpu_millicores = 1000;
    std::uint64_t ttl_ms = 60'000;
    std::uint32_t flags = 0;
};

class sandbox {
  public:
    sandbox(helper_process& helper, std::string id, const sandbox_options& options = {})
        : helper_(helper), id_(std::move(id)) {
        auto m = wire::make_message<wire::create_message>(wire::message_type::create);
        m.request_id = 42;
        wire::copy_field(m.sandbox_id, id_);
        m.memory_bytes = options.memory_bytes;
        m.workspace_bytes = 64ull << 20;
        m.tmp_bytes = 16ull << 20;
        m.ttl_ms = options.ttl_ms;
        m.pids_max = options.pids_max;
        m.cpu_millicores = options.cpu_millicores;
        m.flags = options.flags;
        send_message(helper.socket(), m);
        const record r = receive(helper.socket());
        if (r.type() == wire::message_type::create_failed) {
            const auto failed = r.as<wire::create_failed_message>();
            FAIL("create failed: " << wire::read_field(failed.detail));
        }
        REQUIRE(r.type() == wire::message_type::created);
        REQUIRE(r.fds.size() == 2);
        created = r.as<wire::created_message>();
        CHECK(created.request_id == 42);
        pidfd_ = r.fds[0];
        control_ = r.fds[1];
        const record ready = receive(control_);
        REQUIRE(ready.type() == wire::message_type::ready);
    }

    ~sandbox() {
        if (control_ >= 0) ::close(control_);
        if (pidfd_ >= 0) ::close(pidfd_);
    }

    sandbox(const sandbox&) = delete;
    sandbox& operator=(const sandbox&) = delete;

    const std::string& id() const { return id_; }
    pid_t host_pid() const { return created.host_pid; }
    int control() const { return control_; }

    void close_control() {
        ::close(control_);
        control_ = -1;
    }

    // pid 1 has exited (its pidfd turns readable) within the timeout.
    bool wait_ended(int timeout_ms = wait_ms) const { return wait_readable(pidfd_, timeout_ms); }

    void destroy() {
        auto m = wire::make_message<wire::destroy_message>(wire::message_type::destroy);
        wire::copy_field(m.sandbox_id, id_);
        send_message(helper_.socket(), m);
    }

    wire::created_message created{};

  private:
    helper_process& helper_;
    std::string id_;
    int pidfd_ = -1;
    int control_ = -1;
};

struct command_result {
    bool complete = false;
    std::int32_t pid = 0;
    int status = -1;
    std::uint32_t flags = 0;
    int spawn_errno = 0;
    std::uint64_t duration_us = 0;
    std::string out;
    std::string err;

    bool exited_with(int code) const { return WIFEXITED(status) && WEXITSTATUS(status) == code; }
};

struct pipe_pair {
    int read = -1;
    int write = -1;
    pipe_pair() {
        int fds[2];
        REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
        read = fds[0];
        write = fds[1];
    }
};

// Sends an exec request and collects its output and exit. `on_started` may act on the running
// command (send a kill, ...).
template <class OnStarted>
command_result run(sandbox& s, std::vector<std::string> argv, std::uint64_t wall_limit_ms,
                   std::vector<std::string> env, OnStarted on_started) {
    static std::uint64_t next_exec_id = 1;
    const std::uint64_t exec_id = next_exec_id++;
    env.emplace_back("PATH=/usr/bin:/bin");
    std::vector<std::byte> request;
    REQUIRE(wire::encode_exec(exec_id, wall_limit_ms, argv, env, "/workspace", request));
    pipe_pair in, out, err;
    const int passed[] = {in.read, out.write, err.write};
    REQUIRE(wire::send_record(s.control(), request, passed, 0) > 0);
    for (const int fd : {in.read, in.write, out.write, err.write}) ::close(fd);

    command_result result;
    int streams[2] = {out.read, err.read};
    std::string* sinks[2] = {&result.out, &result.err};
    bool exited = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (!exited || streams[0] >= 0 || streams[1] >= 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd fds[3] = {
            {s.control(), POLLIN, 0}, {streams[0], POLLIN, 0}, {streams[1], POLLIN, 0}};
        if (left.count() <= 0 || ::poll(fds, 3, static_cast<int>(left.count())) <= 0) break;
        if (fds[0].revents != 0) {
            const record r = receive(s.control(), 0);
            if (r.type() == wire::message_type::started) {
                const auto started = r.as<wire::started_message>();
                CHECK(started.exec_id == exec_id);
                result.pid = started.pid;
                on_started(exec_id);
            } else if (r.type() == wire::message_type::exited) {
                const auto m = r.as<wire::exited_message>();
                CHECK(m.exec_id == exec_id);
                result.status = m.wait_status;
                result.flags = m.flags;
                result.spawn_errno = m.spawn_errno;
                result.duration_us = m.duration_us;
                exited = true;
            } else {
                break;  // EOF or an unexpected message
            }
        }
        for (int i = 0; i < 2; ++i) {
            if (fds[i + 1].revents == 0) continue;
            char buffer[4096];
            const ssize_t n = ::read(streams[i], buffer, sizeof buffer);
            if (n > 0) {
                sinks[i]->append(buffer, static_cast<std::size_t>(n));
            } else {
                ::close(streams[i]);
                streams[i] = -1;
            }
        }
    }
    result.complete = exited && streams[0] < 0 && streams[1] < 0;
    for (const int fd : streams) {
        if (fd >= 0) ::close(fd);
    }
    return result;
}

command_result run(sandbox& s, std::vector<std::string> argv, std::uint64_t wall_limit_ms = 0,
                   std::vector<std::string> env = {}) {
    return run(s, std::move(argv), wall_limit_ms, std::move(env), [](std::uint64_t) {});
}

command_result shell(sandbox& s, const std::string& script) {
    return run(s, {"sh", "-c", script});
}

// The next record from the helper must be `reaped` for `id`.
wire::reaped_message expect_reaped(helper_process& helper, const std::string& id) {
    const record r = receive(helper.socket());
    REQUIRE(r.type() == wire::message_type::reaped);
    const auto reaped = r.as<wire::reaped_message>();
    CHECK(wire::read_field(reaped.sandbox_id) == id);
    return reaped;
}

}  // namespace

TEST_CASE("the helper says hello with the layers this host supports") {
    helper_process helper;
    CHECK(helper.hello.version == wire::protocol_version);
    const std::uint32_t expected = wire::layer_user_ns | wire::layer_pid_ns | wire::layer_mount_ns |
                                   wire::layer_net_ns | wire::layer_seccomp |
                                   wire::layer_cgroup_memory | wire::layer_cgroup_pids |
                                   wire::layer_cgroup_cpu;
    CHECK((helper.hello.host_layers & expected) == expected);
}

TEST_CASE("a command's output and exit status come back") {
    helper_process helper;
    sandbox box(helper, "echo");
    const command_result r = run(box, {"echo", "hello"});
    REQUIRE(r.complete);
    CHECK(r.out == "hello\n");
    CHECK(r.err.empty());
    CHECK(r.exited_with(0));
    CHECK(r.pid > 1);
    CHECK(r.flags == 0);
}

TEST_CASE("a non-zero exit code is propagated") {
    helper_process helper;
    sandbox box(helper, "exit3");
    const command_result r = shell(box, "echo oops >&2; exit 3");
    REQUIRE(r.complete);
    CHECK(r.exited_with(3));
    CHECK(r.err == "oops\n");
}

TEST_CASE("a command past its wall limit is killed and reported as timed out" *
          moat::test::shares_host) {
    helper_process helper;
    sandbox box(helper, "wall");
    const command_result r = run(box, {"sleep", "30"}, 200);
    REQUIRE(r.complete);
    CHECK((r.flags & wire::exited_timed_out) != 0);
    CHECK(WIFSIGNALED(r.status));
    CHECK(WTERMSIG(r.status) == SIGKILL);
    CHECK(r.duration_us >= 200'000);
    CHECK(r.duration_us < 5'000'000);
}

TEST_CASE("a kill request signals the command's process group") {
    helper_process helper;
    sandbox box(helper, "killed");
    const command_result r = run(box, {"sleep", "30"}, 0, {}, [&box](std::uint64_t exec_id) {
        auto m = wire::make_message<wire::kill_message>(wire::message_type::kill);
        m.exec_id = exec_id;
        m.signal = SIGTERM;
        send_message(box.control(), m);
    });
    REQUIRE(r.complete);
    CHECK(WIFSIGNALED(r.status));
    CHECK(WTERMSIG(r.status) == SIGTERM);
    CHECK(r.flags == 0);
}

TEST_CASE("a program that cannot be executed reports a spawn failure") {
    helper_process helper;
    sandbox box(helper, "missing");
    const command_result r = run(box, {"/no/such/program"});
    REQUIRE(r.complete);
    CHECK((r.flags & wire::exited_spawn_failed) != 0);
    CHECK(r.spawn_errno == ENOENT);
    CHECK(r.pid == 0);
    // The sandbox still works afterwards.
    CHECK(run(box, {"true"}).exited_with(0));
}

TEST_CASE("commands run as uid 1000 without capabilities or host groups") {
    helper_process helper;
    sandbox box(helper, "ids");
    CHECK(run(box, {"id", "-u"}).out == "1000\n");
    CHECK(run(box, {"id", "-G"}).out == "1000\n");
    const command_result caps = shell(box, "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status");
    CHECK(caps.out ==
          "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
          "CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n");
    CHECK(shell(box, "grep NoNewPrivs /proc/self/status").out == "NoNewPrivs:\t1\n");
}

TEST_CASE("workspace is writable while the root and usr are read-only") {
    helper_process helper;
    sandbox box(helper, "fs");
    const command_result r = shell(box,
                                   "echo data > /workspace/f && cat /workspace/f && "
                                   "echo tmp > /tmp/f && echo null > /dev/null && "
                                   "! touch /usr/f 2>/dev/null && ! touch /f 2>/dev/null && "
                                   "! touch /etc/passwd 2>/dev/null && test ! -e /sys && echo ok");
    CHECK(r.out == "data\nok\n");
    CHECK(r.exited_with(0));
    CHECK(run(box, {"pwd"}).out == "/workspace\n");
}

TEST_CASE("the hostname is sandbox and only the sandbox's processes are visible") {
    helper_process helper;
    sandbox box(helper, "view");
    CHECK(run(box, {"hostname"}).out == "sandbox\n");
    // The cgroup namespace is rooted at the sandbox's own cgroups.
    CHECK(shell(box, "grep -c moat /proc/self/cgroup").out == "0\n");
    // pid 1 (the agent) and the shell itself; ls is the shell's child.
    const command_result r = shell(box, "ls -d /proc/[0-9]* | wc -l");
    CHECK(std::atoi(r.out.c_str()) <= 4);
    CHECK(shell(box, "cat /proc/1/cmdline | tr '\\0' ' '").out ==
          "moat-sandboxd agent --ttl-ms 60000 --max-processes 64 --open-files 0 ");
}

TEST_CASE("the host environment does not reach commands") {
    ::setenv("MOAT_TEST_HOST_SECRET", "leak", 1);
    helper_process helper;
    sandbox box(helper, "env");
    const command_result r = run(box, {"env"}, 0, {"GIVEN=yes"});
    REQUIRE(r.complete);
    CHECK(r.out.find("MOAT_TEST_HOST_SECRET") == std::string::npos);
    CHECK(r.out.find("GIVEN=yes") != std::string::npos);
    ::unsetenv("MOAT_TEST_HOST_SECRET");
}

TEST_CASE("commands cannot create namespaces, mount or trace") {
    helper_process helper;
    sandbox box(helper, "seccomp");
    // Each attempt gets past the kernel's own checks without the filter: a nested user namespace
    // and unshare(0) succeed for anyone, mount with an unreadable type string fails EFAULT before
    // any capability check, ptrace of a pid that cannot exist fails ESRCH. So EPERM is the
    // filter's answer, and a missing tool (exit 127) or a refusal for another reason fails.
    const command_result nested = run(box, {"unshare", "-Ur", "true"});
    CHECK(nested.exited_with(1));
    CHECK(nested.err.find("Operation not permitted") != std::string::npos);
    const command_result calls = run(box, {"python3", "-c",
                                           "import ctypes, errno, platform\n"
                                           "numbers = {'x86_64': (272, 165, 101),"
                                           " 'aarch64': (97, 40, 117)}[platform.machine()]\n"
                                           "libc = ctypes.CDLL(None, use_errno=True)\n"
                                           "def probe(name, *args):\n"
                                           "    rc = libc.syscall(*args)\n"
                                           "    print(name, 'ok' if rc >= 0 else "
                                           "errno.errorcode[ctypes.get_errno()])\n"
                                           "probe('unshare', numbers[0], 0)\n"
                                           "probe('mount', numbers[1], b'none', b'/tmp',"
                                           " ctypes.c_void_p(8), 0, None)\n"
                                           "probe('ptrace', numbers[2], 16, 0x3ffffff0, 0, 0)\n"});
    CHECK(calls.out == "unshare EPERM\nmount EPERM\nptrace EPERM\n");
    CHECK(calls.exited_with(0));
}

TEST_CASE("background processes die when the command exits") {
    helper_process helper;
    sandbox box(helper, "bg");
    CHECK(shell(box, "sleep 100 & setsid sleep 100 & echo started").out == "started\n");
    // Both sleeps are gone: only pid 1, this shell, and its pipeline remain.
    const command_result r = shell(box, "for p in /proc/[0-9]*; do cat $p/comm; done");
    CHECK(r.out.find("sleep") == std::string::npos);
}

TEST_CASE("destroy reaps pid 1 and removes its cgroups") {
    helper_process helper;
    sandbox box(helper, "destroy-me");
    const std::string memory = box.created.memory_cgroup;
    const std::string pids = box.created.pids_cgroup;
    CHECK(path_exists(memory.c_str()));
    CHECK(path_exists(pids.c_str()));
    CHECK((box.created.applied_layers & wire::layer_cgroup_memory) != 0);
    CHECK(box.created.uid_base >= (1u << 20));
    CHECK(box.created.start_time_ticks != 0);
    box.destroy();
    const auto reaped = expect_reaped(helper, box.id());
    CHECK(WIFSIGNALED(reaped.wait_status));
    CHECK(WTERMSIG(reaped.wait_status) == SIGKILL);
    CHECK(reaped.cleanup_errno == 0);
    CHECK(process_gone(box.host_pid()));
    CHECK_FALSE(path_exists(memory.c_str()));
    CHECK_FALSE(path_exists(pids.c_str()));
}

// A host process parked in a sandbox's cgroup keeps it from emptying after pid 1 is gone, for as
// long as the test wants: the real kernel's EBUSY, on demand. Killed when the test ends.
class cgroup_holder {
  public:
    explicit cgroup_holder(const std::string& cgroup) {
        std::string program = "/bin/sleep";
        std::string seconds = "1000";
        char* argv[] = {program.data(), seconds.data(), nullptr};
        char* envp[] = {nullptr};
        REQUIRE(::posix_spawn(&pid_, program.c_str(), nullptr, nullptr, argv, envp) == 0);
        const std::string pid_text = std::to_string(pid_);
        const std::string procs = cgroup + "/cgroup.procs";
        const int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
        REQUIRE(fd >= 0);
        const bool moved =
            ::write(fd, pid_text.data(), pid_text.size()) == static_cast<ssize_t>(pid_text.size());
        ::close(fd);
        REQUIRE(moved);
    }
    ~cgroup_holder() { release(); }
    cgroup_holder(const cgroup_holder&) = delete;
    cgroup_holder& operator=(const cgroup_holder&) = delete;

    void release() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }

  private:
    pid_t pid_ = -1;
};

TEST_CASE("a create is not delayed by a destroy whose cgroup is slow to empty") {
    helper_process helper;
    sandbox slow(helper, "slow-to-empty");
    const std::string pids = slow.created.pids_cgroup;
    REQUIRE_FALSE(pids.empty());
    cgroup_holder holder(pids);
    slow.destroy();
    REQUIRE(slow.wait_ended());
    // pid 1 is reaped, its cgroup still counts the holder: the helper must answer this create
    // now, not after its removal attempts.
    sandbox fast(helper, "fast");
    CHECK(path_exists(pids.c_str()));
    CHECK(run(fast, {"true"}).exited_with(0));
    holder.release();
    const auto reaped = expect_reaped(helper, slow.id());
    CHECK(reaped.cleanup_errno == 0);
    CHECK_FALSE(path_exists(pids.c_str()));
}

TEST_CASE("the sandbox's cgroup limits are the requested ones") {
    helper_process helper;
    sandbox_options options;
    options.memory_bytes = 128ull << 20;
    options.pids_max = 32;
    sandbox box(helper, "limits", options);
    auto read_value = [](const std::string& path) {
        std::string text(64, '\0');
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        const ssize_t n = fd >= 0 ? ::read(fd, text.data(), text.size()) : -1;
        if (fd >= 0) ::close(fd);
        text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
        return text;
    };
    CHECK(read_value(std::string(box.created.memory_cgroup) + "/memory.limit_in_bytes") ==
          std::to_string(128ull << 20) + "\n");
    CHECK(read_value(std::string(box.created.pids_cgroup) + "/pids.max") == "32\n");
    CHECK(read_value(std::string(box.created.pids_cgroup) + "/cgroup.procs") ==
          std::to_string(box.host_pid()) + "\n");
}

TEST_CASE("a limit that cannot be set fails the create unless best effort") {
    helper_process helper;
    sandbox reference(helper, "reference");
    const std::string memory_parent =
        std::filesystem::path(reference.created.memory_cgroup).parent_path().string();
    auto m = wire::make_message<wire::create_message>(wire::message_type::create);
    m.request_id = 9;
    wire::copy_field(m.sandbox_id, "too-many-pids");
    m.memory_bytes = 64ull << 20;
    m.pids_max = 0xffffffff;  // above the kernel's PID_MAX_LIMIT: pids.max refuses it
    send_message(helper.socket(), m);
    const record r = receive(helper.socket());
    REQUIRE(r.type() == wire::message_type::create_failed);
    const auto failed = r.as<wire::create_failed_message>();
    CHECK(failed.request_id == 9);
    CHECK(failed.error_code == static_cast<std::int32_t>(moat::errc::layer_unavailable));
    CHECK(failed.sys_errno == EINVAL);
    CHECK(wire::read_field(failed.detail) == "pids cgroup: write pids.max: EINVAL");
    CHECK_FALSE(path_exists((memory_parent + "/too-many-pids").c_str()));

    sandbox_options options;
    options.pids_max = 0xffffffff;
    options.flags = wire::create_best_effort;
    sandbox box(helper, "best-effort", options);
    CHECK((box.created.applied_layers & wire::layer_cgroup_pids) == 0);
    CHECK((box.created.applied_layers & wire::layer_cgroup_memory) != 0);
    CHECK(wire::read_field(box.created.pids_cgroup).empty());
    CHECK(run(box, {"true"}).exited_with(0));
}

TEST_CASE("destroying an unknown sandbox reports ESRCH") {
    helper_process helper;
    auto m = wire::make_message<wire::destroy_message>(wire::message_type::destroy);
    wire::copy_field(m.sandbox_id, "nobody-home");
    send_message(helper.socket(), m);
    CHECK(expect_reaped(helper, "nobody-home").cleanup_errno == ESRCH);
}

TEST_CASE("an invalid or duplicate sandbox id fails the create") {
    helper_process helper;
    sandbox box(helper, "taken");
    for (const char* id : {"taken", "../escape", ""}) {
        auto m = wire::make_message<wire::create_message>(wire::message_type::create);
        m.request_id = 7;
        wire::copy_field(m.sandbox_id, id);
        send_message(helper.socket(), m);
        const record r = receive(helper.socket());
        REQUIRE(r.type() == wire::message_type::create_failed);
        const auto failed = r.as<wire::create_failed_message>();
        CHECK(failed.request_id == 7);
        CHECK(failed.error_code == static_cast<std::int32_t>(moat::errc::invalid_argument));
    }
}

TEST_CASE("closing the library end of the control socket ends the sandbox") {
    helper_process helper;
    sandbox box(helper, "owner-gone");
    box.close_control();
    expect_reaped(helper, box.id());
    CHECK(box.wait_ended(0));
    CHECK(process_gone(box.host_pid()));
}

TEST_CASE("the TTL ends the sandbox") {
    helper_process helper;
    sandbox_options options;
    options.ttl_ms = 300;
    sandbox box(helper, "ttl", options);
    const auto reaped = expect_reaped(helper, box.id());
    CHECK(WIFEXITED(reaped.wait_status));
    CHECK(process_gone(box.host_pid()));
}

// The wall clock stepped ahead while the helper waits for the TTL.
class wall_clock_step {
  public:
    explicit wall_clock_step(std::chrono::seconds step) : step_(step) { REQUIRE(move(step_)); }
    ~wall_clock_step() { move(-step_); }
    wall_clock_step(const wall_clock_step&) = delete;
    wall_clock_step& operator=(const wall_clock_step&) = delete;

  private:
    static bool move(std::chrono::seconds by) {
        timespec now{};
        ::clock_gettime(CLOCK_REALTIME, &now);
        now.tv_sec += static_cast<time_t>(by.count());
        return ::clock_settime(CLOCK_REALTIME, &now) == 0;
    }
    std::chrono::seconds step_;
};

// It steps the host's wall clock: skipped unless asked for (--no-skip), and refused outside the
// guest kernel of tests/guest, whose guest_init.sh runs it (the unit tests in
// sandboxd_units_test.cpp check the arithmetic everywhere).
TEST_CASE("a wall-clock step forward does not end a sandbox before its TTL" * doctest::skip()) {
    const char* guest = std::getenv("MOAT_GUEST_CLOCK_STEPPABLE");
    REQUIRE_MESSAGE((guest != nullptr && std::string(guest) == "1"),
                    "this test steps the wall clock: it runs in the guest kernel (tests/guest)");
    helper_process helper;
    sandbox_options options;
    options.ttl_ms = 60'000;
    sandbox box(helper, "clock-step", options);
    {
        const wall_clock_step step(std::chrono::hours(2));
        // Any message wakes the helper, which then looks at its TTL backstops.
        auto m = wire::make_message<wire::destroy_message>(wire::message_type::destroy);
        wire::copy_field(m.sandbox_id, "wake-up");
        send_message(helper.socket(), m);
        CHECK(expect_reaped(helper, "wake-up").cleanup_errno == ESRCH);
        CHECK_FALSE(box.wait_ended(1500));
    }
    box.destroy();
    expect_reaped(helper, box.id());
}

TEST_CASE("a survive-owner sandbox outlives its control socket until destroyed") {
    helper_process helper;
    sandbox_options options;
    options.flags = wire::create_survive_owner;
    sandbox box(helper, "survivor", options);
    box.close_control();
    CHECK_FALSE(box.wait_ended(300));
    box.destroy();
    expect_reaped(helper, box.id());
}

TEST_CASE("closing the helper's control socket kills all its sandboxes") {
    helper_process helper;
    sandbox first(helper, "first");
    sandbox second(helper, "second");
    CHECK(first.created.uid_base != second.created.uid_base);
    helper.close_socket();
    REQUIRE(helper.wait_exit(wait_ms));
    CHECK(WIFEXITED(helper.exit_status));
    CHECK(WEXITSTATUS(helper.exit_status) == 0);
    CHECK(first.wait_ended(0));
    CHECK(second.wait_ended(0));
    CHECK(process_gone(first.host_pid()));
    CHECK(process_gone(second.host_pid()));
    CHECK_FALSE(path_exists(first.created.memory_cgroup));
}

TEST_CASE("killing the helper process kills its sandboxes") {
    helper_process helper;
    sandbox box(helper, "orphan");
    const std::vector<std::string> cgroups = cgroup_dirs(box.host_pid());
    REQUIRE(::kill(helper.pid(), SIGKILL) == 0);
    REQUIRE(helper.wait_exit(wait_ms));
    // PR_SET_PDEATHSIG killed pid 1; whoever adopted it reaps it (this host's init takes ~2 s).
    CHECK(box.wait_ended());
    CHECK(process_dead(box.host_pid()));
    // Nobody is left to remove the cgroups (the library's janitor would): clean up after the test.
    for (const auto& dir : cgroups) {
        for (int i = 0; i < 200 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i)
            ::usleep(10'000);
    }
}

TEST_CASE("a sandbox whose created reply cannot be sent is killed, not left running") {
    helper_process helper;
    // The library stops reading: the helper's `created` fails with EPIPE. A survivor (which
    // outlives the helper's shutdown) must not be left running unknown to anyone until its TTL.
    REQUIRE(::shutdown(helper.socket(), SHUT_RD) == 0);
    const std::uint64_t ttl_ms = 600'000 + static_cast<std::uint64_t>(::getpid() % 100'000);
    auto m = wire::make_message<wire::create_message>(wire::message_type::create);
    m.request_id = 9;
    wire::copy_field(m.sandbox_id, "lost-reply");
    m.memory_bytes = 256ull << 20;
    m.workspace_bytes = 64ull << 20;
    m.tmp_bytes = 16ull << 20;
    m.ttl_ms = ttl_ms;
    m.pids_max = 64;
    m.cpu_millicores = 1000;
    m.flags = wire::create_survive_owner;
    send_message(helper.socket(), m);
    // The create is queued before the end of the socket: the helper handles it, then shuts down.
    helper.close_socket();
    REQUIRE(helper.wait_exit(wait_ms));
    const std::string agent = "agent --ttl-ms " + std::to_string(ttl_ms);
    const auto survivors = processes_running(agent);
    CHECK_MESSAGE(survivors.empty(), "the sandbox announced in the lost reply is still running");
    for (const pid_t pid : survivors) ::kill(pid, SIGKILL);
    const std::string socket = wire::attach_socket_path(helper.state_dir(), "lost-reply");
    CHECK_FALSE(path_exists(socket.c_str()));
}
