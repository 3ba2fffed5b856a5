#include "sandboxd/helper.hpp"

#include <moat/errc.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <ctime>
#include <vector>

#include "sandboxd/cgroups.hpp"
#include "sandboxd/seccomp_filter.hpp"
#include "sandboxd/spawn_sandbox.hpp"
#include "sandboxd/state_dir.hpp"
#include "sandboxd/template_root.hpp"
#include "sandboxd/ttl_backstop.hpp"
#include "sandboxd/uid_slots.hpp"
#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"
#include "wire/state_layout.hpp"

namespace moat::sandboxd {
namespace {

constexpr int control_fd = 3;

constexpr std::uint32_t namespace_layers =
    wire::layer_user_ns | wire::layer_pid_ns | wire::layer_mount_ns | wire::layer_net_ns |
    wire::layer_ipc_ns | wire::layer_uts_ns | wire::layer_cgroup_ns;

const char* errno_name(int err) {
    const char* name = ::strerrorname_np(err);
    return name != nullptr ? name : "E?";
}

// 0 or the errno of a failed send. A library that went away also shows up as EOF on the next
// poll; a caller whose reply announces something (a sandbox) must undo it when the reply is lost.
template <class Message>
int send(const Message& m, std::span<const int> fds = {}) {
    const auto bytes = std::as_bytes(std::span(&m, 1));
    for (;;) {
        if (wire::send_record(control_fd, bytes, fds, 0) >= 0) return 0;
        if (errno != EINTR) return errno;
    }
}

bool valid_sandbox_id(std::string_view id) {
    if (id.empty() || id == "." || id == "..") return false;
    for (const char c : id) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
        if (!ok) return false;
    }
    return true;
}

// A unix SOCK_SEQPACKET socket bound (not yet listening: the sandbox's pid 1 listens, so that
// connecting peers see it in SO_PEERCRED) at `path`, mode 0600. Returns the descriptor or -errno.
int bind_attach_socket(const std::string& path, std::string& detail) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (path.size() >= sizeof address.sun_path) {
        detail = "attach socket path is longer than " +
                 std::to_string(sizeof address.sun_path - 1) +
                 " bytes (choose a shorter state directory): " + path;
        return -ENAMETOOLONG;
    }
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        detail = std::string("attach socket: ") + errno_name(errno);
        return -errno;
    }
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
        ::chmod(path.c_str(), 0600) != 0) {
        const int err = errno;
        detail = "bind " + path + ": " + errno_name(err);
        ::close(fd);
        return -err;
    }
    return fd;
}

int to_wait_status(const siginfo_t& info) {
    switch (info.si_code) {
        case CLD_EXITED:
            return (info.si_status & 0xff) << 8;
        case CLD_KILLED:
            return info.si_status & 0x7f;
        case CLD_DUMPED:
            return (info.si_status & 0x7f) | 0x80;
        default:
            return 0;
    }
}

class helper {
  public:
    explicit helper(std::string state_dir) : state_dir_(std::move(state_dir)) {}

    void setup();
    void run();

  private:
    struct sandbox {
        std::string id;
        int pidfd = -1;
        bool survive_owner = false;
        sandbox_cgroups cgroups;
        // Its attach socket, when the library never learned of the sandbox (its `created` was
        // lost) and nobody else will remove it.
        std::string orphaned_socket;
        // The TTL's backstop (CLOCK_BOOTTIME ms, ttl_backstop.hpp; 0 = no TTL): pid 1 ends the
        // sandbox at its TTL; if it is still alive this long after (stopped, stuck), the helper
        // ends it.
        std::uint64_t backstop_ms = 0;
        backstop_anchor anchor;  // converts the expiry its record holds (ttl_backstop.hpp)
    };

    // A reaped sandbox whose cgroups still count a process (an exiting task, or one that has
    // not emptied yet): retried from the loop's timer, never waited for, so that creates never
    // queue behind a destroy. Its `reaped` report goes out once removal is done or given up.
    struct pending_removal {
        std::string id;
        sandbox_cgroups cgroups;
        bool report = true;  // false: a failed create's, nobody waits for it
        int wait_status = 0;
        int wait_errno = 0;
        int attempts = 0;
        std::uint64_t next_ms = 0;  // monotonic
        std::uint64_t give_up_ms = 0;
    };

    void fail_setup(moat::errc code, int err, const std::string& detail);
    // Ends sandboxes whose TTL passed while pid 1 did not end them, and sets backstop_timer_ to
    // the next backstop.
    void enforce_backstops();
    // Removes `group` now if it can, or queues the removal; then (or later) sends `reaped`.
    void remove_cgroups(std::string id, sandbox_cgroups group, bool report, int wait_status,
                        int wait_errno);
    // Retries the due removals; returns the poll timeout until the next one (-1: none).
    int retry_removals();
    void send_reaped(const std::string& id, int wait_status, int cleanup_errno) {
        auto reaped = wire::make_message<wire::reaped_message>(wire::message_type::reaped);
        wire::copy_field(reaped.sandbox_id, id);
        reaped.wait_status = wait_status;
        reaped.cleanup_errno = cleanup_errno;
        (void)send(reaped);  // a lost report: the library's destroy confirms through its pidfd
    }
    // False when the control socket has closed.
    bool handle_control();
    void handle_create(const wire::create_message& m);
    void handle_destroy(const wire::destroy_message& m);
    // Reaps sandbox `i` if pid 1 has exited; true if it did (the entry is erased).
    bool try_reap(std::size_t i, bool block);
    void shut_down();

    void send_create_failed(std::uint64_t request_id, moat::errc code, int err,
                            std::string_view detail) {
        auto m = wire::make_message<wire::create_failed_message>(wire::message_type::create_failed);
        m.request_id = request_id;
        m.error_code = static_cast<std::int32_t>(code);
        m.sys_errno = err;
        wire::copy_field(m.detail, detail);
        (void)send(m);  // nothing was made: a lost answer leaves nothing behind
    }

    std::string state_dir_;
    bool usable_ = false;
    moat::errc unusable_code_ = moat::errc::layer_unavailable;
    std::string unusable_detail_;
    std::uint32_t host_layers_ = 0;
    std::string layer_detail_;
    int agent_exe_fd_ = -1;
    // A CLOCK_BOOTTIME timerfd at the next backstop: poll's own timeout counts CLOCK_MONOTONIC,
    // which stands still while the host is suspended.
    int backstop_timer_ = -1;
    cgroups cgroups_;
    uid_slots slots_;
    sandbox_spawner spawner_;
    std::vector<sandbox> sandboxes_;
    std::vector<pending_removal> removals_;
};

std::uint64_t monotonic_ms() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000 +
           static_cast<std::uint64_t>(ts.tv_nsec) / 1'000'000;
}

// The expiry the library last recorded for a sandbox (extend_ttl moves it: from any process,
// through the agent, which the helper does not hear), or 0. The record is JSON the library wrote;
// a key inside a string value would have its quotes escaped, so the first match is the key.
std::uint64_t recorded_expiry_ms(const std::string& state_dir, const std::string& id) {
    // The key comes near the start (after the id and owner fields): 4 KiB is plenty.
    char buffer[4096];
    const int fd = ::open(wire::record_path(state_dir, id).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    ::close(fd);
    if (n <= 0) return 0;
    const std::string_view text(buffer, static_cast<std::size_t>(n));
    constexpr std::string_view key = "\"expires_at_ms\":";
    const auto at = text.find(key);
    if (at == std::string_view::npos) return 0;
    std::uint64_t value = 0;
    const char* begin = text.data() + at + key.size();
    std::from_chars(begin, text.data() + text.size(), value);
    return value;
}

void helper::enforce_backstops() {
    std::uint64_t next = 0;
    const clock_reading now = read_clocks();
    for (auto& s : sandboxes_) {
        if (s.backstop_ms == 0) continue;
        if (now.boot_ms >= s.backstop_ms) {
            const std::uint64_t recorded = recorded_expiry_ms(state_dir_, s.id);
            const std::uint64_t extended =
                recorded == 0 ? 0 : recorded_backstop_at(recorded, s.anchor, now);
            if (extended > now.boot_ms) {
                s.backstop_ms = extended;  // extended meanwhile
            } else {
                // Expired and pid 1 did not end it: end it from here. The reap follows from the
                // pidfd as for a destroy; a stopped pid 1 dies of SIGKILL all the same.
                cgroups_.kill(s.cgroups);
                ::syscall(SYS_pidfd_send_signal, s.pidfd, SIGKILL, nullptr, 0);
                s.backstop_ms = 0;
                continue;
            }
        }
        if (next == 0 || s.backstop_ms < next) next = s.backstop_ms;
    }
    // Absolute, so that it fires at the backstop however long the host slept; 0 disarms it.
    itimerspec at{};
    at.it_value.tv_sec = static_cast<time_t>(next / 1000);
    at.it_value.tv_nsec = static_cast<long>(next % 1000) * 1'000'000;
    ::timerfd_settime(backstop_timer_, TFD_TIMER_ABSTIME, &at, nullptr);
}

// Retries at 1, 2, 4, ... ms, then every 50 ms; EBUSY is reported after 5 s.
constexpr std::uint64_t removal_give_up_ms = 5000;

void helper::remove_cgroups(std::string id, sandbox_cgroups group, bool report, int wait_status,
                            int wait_errno) {
    const int err = cgroups_.try_remove(group);
    if (err != EBUSY) {
        if (report) send_reaped(id, wait_status, err != 0 ? err : wait_errno);
        return;
    }
    const std::uint64_t now = monotonic_ms();
    removals_.push_back({std::move(id), std::move(group), report, wait_status, wait_errno, 0,
                         now + 1, now + removal_give_up_ms});
}

int helper::retry_removals() {
    std::uint64_t now = monotonic_ms();
    for (std::size_t i = removals_.size(); i-- > 0;) {
        pending_removal& r = removals_[i];
        if (r.next_ms > now) continue;
        const int err = cgroups_.try_remove(r.cgroups);
        if (err == EBUSY && now < r.give_up_ms) {
            ++r.attempts;
            r.next_ms = now + std::min<std::uint64_t>(50, std::uint64_t{1} << r.attempts);
            continue;
        }
        if (r.report) send_reaped(r.id, r.wait_status, err != 0 ? err : r.wait_errno);
        removals_.erase(removals_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (removals_.empty()) return -1;
    std::uint64_t next = removals_.front().next_ms;
    for (const auto& r : removals_) next = std::min(next, r.next_ms);
    now = monotonic_ms();
    return next > now ? static_cast<int>(next - now) : 0;
}

// A setup failure makes this helper unusable for its whole life: every create fails with it, so
// its code is never a retryable one (layer_unavailable: this host, as set up, cannot do it).
void helper::fail_setup(moat::errc code, int err, const std::string& detail) {
    unusable_code_ = code;
    unusable_detail_ = detail;
    if (err != 0) unusable_detail_ += std::string(": ") + errno_name(err);
    layer_detail_ = unusable_detail_;
    host_layers_ = 0;
}

void helper::setup() {
    if (::geteuid() != 0) {
        fail_setup(moat::errc::layer_unavailable, 0,
                   "helper: needs euid 0 in this version (running as uid " +
                       std::to_string(::geteuid()) + ")");
        return;
    }
    // Searchable, not listable (see state_dir.hpp). The uid-slot locks stay 0700.
    if (std::string detail; const int err = prepare_state_dir(state_dir_, detail)) {
        return fail_setup(moat::errc::layer_unavailable, err == EACCES ? 0 : err,
                          "helper: " + detail);
    }
    // Records and attach sockets: root only, whatever the state directory's mode.
    const std::string sandboxes = wire::sandboxes_dir(state_dir_);
    if (::mkdir(sandboxes.c_str(), 0700) != 0 && errno != EEXIST) {
        return fail_setup(moat::errc::layer_unavailable, errno, "helper: mkdir " + sandboxes);
    }
    if (::chmod(sandboxes.c_str(), 0700) != 0) {
        return fail_setup(moat::errc::layer_unavailable, errno, "helper: chmod " + sandboxes);
    }
    // Everything mounted from here on (the template root) stays inside this helper.
    if (::unshare(CLONE_NEWNS) != 0) {
        return fail_setup(moat::errc::layer_unavailable, errno, "helper: unshare(CLONE_NEWNS)");
    }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
        return fail_setup(moat::errc::layer_unavailable, errno, "helper: make / private");
    }
    std::string detail;
    const std::string template_path = state_dir_ + "/template";
    std::vector<std::string> template_bound;
    if (const int err = build_template_root(template_path, template_bound, detail)) {
        return fail_setup(moat::errc::layer_unavailable, 0, detail);
    }
    std::vector<sock_filter> filter;
    if (const int err = compile_seccomp_filter(filter, detail)) {
        return fail_setup(moat::errc::layer_unavailable, err, detail);
    }
    agent_exe_fd_ = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (agent_exe_fd_ < 0) {
        return fail_setup(moat::errc::layer_unavailable, errno, "helper: open /proc/self/exe");
    }
    if (const int err = slots_.open()) {
        return fail_setup(moat::errc::layer_unavailable, err,
                          std::string("helper: uid range locks ") + host_lock_dir);
    }
    if (const int err = spawner_.init(template_path, template_bound, std::move(filter),
                                      agent_exe_fd_, detail)) {
        return fail_setup(moat::errc::layer_unavailable, err, "helper: " + detail);
    }
    backstop_timer_ = ::timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK);
    if (backstop_timer_ < 0) {
        return fail_setup(moat::errc::layer_unavailable, errno,
                          "helper: timerfd_create(CLOCK_BOOTTIME)");
    }
    cgroups_.discover();

    static constexpr struct {
        const char* path;
        std::uint32_t bit;
    } namespaces[] = {
        {"/proc/self/ns/user", wire::layer_user_ns},     {"/proc/self/ns/pid", wire::layer_pid_ns},
        {"/proc/self/ns/mnt", wire::layer_mount_ns},     {"/proc/self/ns/net", wire::layer_net_ns},
        {"/proc/self/ns/ipc", wire::layer_ipc_ns},       {"/proc/self/ns/uts", wire::layer_uts_ns},
        {"/proc/self/ns/cgroup", wire::layer_cgroup_ns},
    };
    for (const auto& ns : namespaces) {
        if (::access(ns.path, F_OK) == 0) host_layers_ |= ns.bit;
    }
    if (::prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0) host_layers_ |= wire::layer_seccomp;
    host_layers_ |= wire::layer_no_new_privs | cgroups_.host_layers();
    for (const controller c : {controller::memory, controller::pids, controller::cpu}) {
        if (cgroups_.available(c)) continue;
        if (layer_detail_.find(cgroups_.unavailable_reason(c)) != std::string::npos) continue;
        if (!layer_detail_.empty()) layer_detail_ += "; ";
        layer_detail_ += cgroups_.unavailable_reason(c);
    }
    usable_ = true;
}

void helper::run() {
    auto hello = wire::make_message<wire::hello_message>(wire::message_type::hello);
    hello.version = wire::protocol_version;
    hello.host_layers = host_layers_;
    hello.setup_error = usable_ ? 0 : static_cast<std::int32_t>(unusable_code_);
    wire::copy_field(hello.layer_detail, layer_detail_);
    (void)send(hello);

    std::vector<pollfd> fds;
    for (;;) {
        const int timeout_ms = retry_removals();
        enforce_backstops();
        fds.clear();
        fds.push_back({control_fd, POLLIN, 0});
        fds.push_back({backstop_timer_, POLLIN, 0});  // -1 (unusable helper): ignored
        for (const auto& s : sandboxes_) fds.push_back({s.pidfd, POLLIN, 0});
        if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (fds[1].revents != 0) {
            std::uint64_t expirations = 0;  // read to clear it; the next pass rearms it
            (void)::read(backstop_timer_, &expirations, sizeof expirations);
        }
        // Reap first, walking backwards so erasing keeps the remaining indices valid.
        for (std::size_t i = sandboxes_.size(); i-- > 0;) {
            if (fds[i + 2].revents != 0) try_reap(i, false);
        }
        if (fds[0].revents != 0 && !handle_control()) break;
    }
    shut_down();
}

bool helper::handle_control() {
    // The largest request the library sends is a create.
    alignas(8) std::byte buffer[4096];
    static_assert(sizeof(wire::create_message) <= sizeof buffer);
    int fds[wire::max_fds_per_message];
    std::size_t fd_count = 0;
    bool descriptors_lost = false;  // the library sends none; any that came are closed
    const ssize_t n =
        wire::receive_record(control_fd, buffer, fds, fd_count, descriptors_lost, MSG_DONTWAIT);
    for (std::size_t i = 0; i < fd_count; ++i) ::close(fds[i]);
    if (n == 0) return false;
    if (n < 0) {
        // An oversized record is dropped; anything else means the socket is gone.
        return errno == EAGAIN || errno == EINTR || errno == EMSGSIZE;
    }
    const std::span<const std::byte> record(buffer, static_cast<std::size_t>(n));
    wire::header h{};
    if (!wire::read_header(record, h)) return true;
    switch (static_cast<wire::message_type>(h.type)) {
        case wire::message_type::create: {
            wire::create_message m{};
            if (wire::read_fixed(record, wire::message_type::create, m)) {
                handle_create(m);
            } else {
                send_create_failed(0, moat::errc::protocol_error, 0, "malformed create message");
            }
            break;
        }
        case wire::message_type::destroy: {
            wire::destroy_message m{};
            if (wire::read_fixed(record, wire::message_type::destroy, m)) handle_destroy(m);
            break;
        }
        default:
            break;
    }
    return true;
}

void helper::handle_create(const wire::create_message& m) {
    if (!usable_) {
        return send_create_failed(m.request_id, unusable_code_, 0, unusable_detail_);
    }
    const std::string_view id = wire::read_field(m.sandbox_id);
    if (!valid_sandbox_id(id)) {
        return send_create_failed(m.request_id, moat::errc::invalid_argument, 0,
                                  "sandbox id must be 1-31 characters of [A-Za-z0-9._-]");
    }
    for (const auto& s : sandboxes_) {
        if (s.id == id) {
            return send_create_failed(m.request_id, moat::errc::invalid_argument, EEXIST,
                                      "sandbox id already in use: " + s.id);
        }
    }
    for (const auto& r : removals_) {
        if (r.id == id) {
            return send_create_failed(m.request_id, moat::errc::invalid_argument, EEXIST,
                                      "sandbox id already in use (its cgroups are still being "
                                      "removed): " +
                                          r.id);
        }
    }
    const bool best_effort = (m.flags & wire::create_best_effort) != 0;
    const bool survive_owner = (m.flags & wire::create_survive_owner) != 0;

    // Only lowering is possible inside the sandbox (its pid 1 has no CAP_SYS_RESOURCE here).
    rlimit own_files{};
    if (m.open_files != 0 && ::getrlimit(RLIMIT_NOFILE, &own_files) == 0 &&
        m.open_files > own_files.rlim_max) {
        return send_create_failed(m.request_id, moat::errc::invalid_argument, 0,
                                  "limits.open_files: " + std::to_string(m.open_files) +
                                      " is above the application's hard RLIMIT_NOFILE " +
                                      std::to_string(own_files.rlim_max));
    }
    if (m.egress_port > 65535) {
        return send_create_failed(
            m.request_id, moat::errc::invalid_argument, 0,
            "egress port " + std::to_string(m.egress_port) + " is not a port");
    }
    if (const auto layer = wire::read_field(m.template_layer);
        !layer.empty() && (layer.front() != '/' || layer.find("/..") != std::string_view::npos)) {
        return send_create_failed(
            m.request_id, moat::errc::invalid_argument, 0,
            "template layer " + std::string(layer) + " is not a clean absolute path");
    }
    uid_slot slot;
    if (const int err = slots_.claim(slot)) {
        const auto code = err == EAGAIN ? moat::errc::limit_exceeded : moat::errc::backend_failure;
        return send_create_failed(m.request_id, code, err,
                                  std::string("uid slot: ") + errno_name(err));
    }
    sandbox s;
    s.id = std::string(id);
    s.survive_owner = survive_owner;
    std::string detail;
    const cgroup_limits limits{m.memory_bytes, m.pids_max, m.cpu_millicores, best_effort};
    if (const int err = cgroups_.create(id, limits, s.cgroups, detail)) {
        ::close(slot.lock_fd);
        return send_create_failed(m.request_id, moat::errc::layer_unavailable, err, detail);
    }
    int listen_socket = -1;
    std::string socket_path;
    if (survive_owner) {
        socket_path = wire::attach_socket_path(state_dir_, id);
        std::string bind_detail;
        listen_socket = bind_attach_socket(socket_path, bind_detail);
        if (listen_socket < 0) {
            ::close(slot.lock_fd);
            remove_cgroups(s.id, std::move(s.cgroups), false, 0, 0);
            return send_create_failed(m.request_id, moat::errc::backend_failure, -listen_socket,
                                      bind_detail);
        }
    }
    spawn_request request;
    request.sandbox_id = id;
    request.listen_socket = listen_socket;
    request.workspace_bytes = m.workspace_bytes;
    request.tmp_bytes = m.tmp_bytes;
    request.ttl_ms = m.ttl_ms;
    request.max_processes = m.pids_max;
    request.open_files = m.open_files;
    request.survive_owner = survive_owner;
    request.allow_sudo = (m.flags & wire::create_allow_sudo) != 0;
    request.egress_port = static_cast<std::uint16_t>(m.egress_port);
    request.best_effort = best_effort;
    request.user_name = wire::read_field(m.user_name);
    request.home = wire::read_field(m.home);
    request.workdir = wire::read_field(m.workdir);
    request.artifacts_dir = wire::read_field(m.artifacts_dir);
    request.template_layer = wire::read_field(m.template_layer);
    request.template_python = wire::read_field(m.template_python);
    spawned_sandbox spawned;
    spawn_failure failure;
    const bool ok = spawner_.spawn(request, slot, cgroups_, s.cgroups, spawned, failure);
    // pid 1 holds its own copies of the slot lock and the attach socket now; ours go either way.
    ::close(slot.lock_fd);
    if (listen_socket >= 0) ::close(listen_socket);
    if (!ok) {
        if (!socket_path.empty()) ::unlink(socket_path.c_str());
        remove_cgroups(s.id, std::move(s.cgroups), false, 0, 0);
        return send_create_failed(m.request_id, failure.code, failure.sys_errno, failure.detail);
    }

    auto created = wire::make_message<wire::created_message>(wire::message_type::created);
    created.request_id = m.request_id;
    created.host_pid = spawned.host_pid;
    created.uid_base = slot.uid_base;
    created.applied_layers = namespace_layers | wire::layer_seccomp | wire::layer_no_new_privs |
                             s.cgroups.applied_layers;
    if (s.cgroups.unified || !s.cgroups.tracking_dirs.empty()) {
        created.applied_layers |= wire::layer_command_cgroups;
    }
    created.start_time_ticks = spawned.start_time_ticks;
    wire::copy_field(created.memory_cgroup, s.cgroups.paths[0]);
    wire::copy_field(created.pids_cgroup, s.cgroups.paths[1]);
    wire::copy_field(created.cpu_cgroup, s.cgroups.paths[2]);
    if (!s.cgroups.tracking_dirs.empty()) {
        wire::copy_field(created.tracking_cgroup, s.cgroups.tracking_dirs.back());
    } else if (!s.cgroups.freezer_dirs.empty()) {
        wire::copy_field(created.tracking_cgroup, s.cgroups.freezer_dirs.back());
    }
    const int passed[] = {spawned.pidfd, spawned.library_socket};
    const int lost = send(created, passed);
    ::close(spawned.library_socket);
    s.pidfd = spawned.pidfd;
    if (m.ttl_ms != 0) {
        const clock_reading now = read_clocks();
        s.backstop_ms = backstop_at(now, m.ttl_ms);
        // The library wrote the record before it asked for the sandbox.
        const std::uint64_t recorded = recorded_expiry_ms(state_dir_, s.id);
        s.anchor = {s.backstop_ms, recorded != 0 ? recorded : now.wall_ms + m.ttl_ms};
    }
    if (lost != 0) {
        // Nobody knows this sandbox: a survivor would run to its TTL. Kill it (it is reaped and
        // its cgroups removed as usual) and tell the library, if a smaller record still gets
        // through, instead of leaving its create to time out.
        ::syscall(SYS_pidfd_send_signal, s.pidfd, SIGKILL, nullptr, 0);
        s.survive_owner = false;
        s.orphaned_socket = socket_path;
        send_create_failed(m.request_id, moat::errc::backend_failure, lost,
                           std::string("the created reply could not be sent (") + errno_name(lost) +
                               "): the sandbox was killed");
    }
    sandboxes_.push_back(std::move(s));
}

void helper::handle_destroy(const wire::destroy_message& m) {
    const std::string_view id = wire::read_field(m.sandbox_id);
    for (const auto& s : sandboxes_) {
        if (s.id == id) {
            // The reap follows when the pidfd turns readable. Where it can (v2), the whole
            // cgroup goes at once too, whatever entered it.
            cgroups_.kill(s.cgroups);
            ::syscall(SYS_pidfd_send_signal, s.pidfd, SIGKILL, nullptr, 0);
            return;
        }
    }
    for (const auto& r : removals_) {
        if (r.id == id && r.report) return;  // reaped already: the report follows the removal
    }
    send_reaped(std::string(id), 0, ESRCH);
}

bool helper::try_reap(std::size_t i, bool block) {
    sandbox& s = sandboxes_[i];
    siginfo_t info{};
    const int options = WEXITED | (block ? 0 : WNOHANG);
    int rc;
    do {
        rc = ::waitid(P_PIDFD, static_cast<id_t>(s.pidfd), &info, options);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0 && info.si_pid == 0) return false;  // not exited yet
    const int wait_errno = rc == 0 ? 0 : errno;
    if (!s.orphaned_socket.empty()) ::unlink(s.orphaned_socket.c_str());
    const int wait_status = rc == 0 ? to_wait_status(info) : 0;
    remove_cgroups(s.id, std::move(s.cgroups), true, wait_status, wait_errno);
    ::close(s.pidfd);
    sandboxes_.erase(sandboxes_.begin() + static_cast<std::ptrdiff_t>(i));
    return true;
}

void helper::shut_down() {
    for (const auto& s : sandboxes_) {
        if (s.survive_owner) continue;
        cgroups_.kill(s.cgroups);
        ::syscall(SYS_pidfd_send_signal, s.pidfd, SIGKILL, nullptr, 0);
    }
    for (std::size_t i = sandboxes_.size(); i-- > 0;) {
        if (!sandboxes_[i].survive_owner) try_reap(i, true);
    }
    // Survivors keep running (and keep their cgroups) without us.
    for (const auto& s : sandboxes_) ::close(s.pidfd);
    sandboxes_.clear();
    // Nobody is left to serve: waiting here delays no create. What is still there after the
    // retries give up is the janitor's.
    for (int timeout_ms = retry_removals(); timeout_ms >= 0; timeout_ms = retry_removals()) {
        ::poll(nullptr, 0, timeout_ms);
    }
}

}  // namespace

int run_helper(const std::string& state_dir) {
    helper h(state_dir);
    h.setup();
    h.run();
    return 0;
}

}  // namespace moat::sandboxd
