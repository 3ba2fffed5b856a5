// The agent's commands (agent_impl.hpp is the contract between pid 1's files): an exec request
// becomes a command child (command_child.hpp) in a cgroup of its own where it can; its start and
// its end are reported to the connection that asked; reaping kills what a command left behind,
// and the per-command cgroups are reused, drained after a kill, or dropped.
#include "sandboxd/agent_impl.hpp"

#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>

#include "sandboxd/pid_lines.hpp"
#include "sandboxd/raw_syscall.hpp"

namespace moat::sandboxd {
namespace {

constexpr std::size_t idle_cgroups_kept = 4;  // empty per-command cgroups kept for reuse
// A per-command cgroup still populated this long after its kill is not reused (a process stuck
// in the kernel); the helper removes it with the sandbox.
constexpr std::uint64_t drain_give_up_us = 10'000'000;

// The value of `key` in a cgroup's flat keyed file below `dir`, or -1.
long long read_keyed(int dir, const char* file, std::string_view key) {
    const int fd = ::openat(dir, file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char text[256];
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n <= 0) return -1;
    std::string_view rest(text, static_cast<std::size_t>(n));
    while (!rest.empty()) {
        const auto newline = rest.find('\n');
        const std::string_view line = rest.substr(0, newline);
        if (line.size() > key.size() && line.starts_with(key) && line[key.size()] == ' ') {
            long long value = -1;
            std::from_chars(line.data() + key.size() + 1, line.data() + line.size(), value);
            return value;
        }
        if (newline == std::string_view::npos) break;
        rest.remove_prefix(newline + 1);
    }
    return -1;
}

bool write_at(int dir, const char* file, const char* text) {
    const int fd = ::openat(dir, file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const std::size_t length = std::char_traits<char>::length(text);
    const bool ok = ::write(fd, text, length) == static_cast<ssize_t>(length);
    ::close(fd);
    return ok;
}

}  // namespace

void agent::handle_exec(int fd, std::span<const std::byte> record, std::span<int> fds,
                        bool descriptors_lost) {
    wire::exec_request_view request;
    const bool decoded = wire::decode_exec(record, request);
    const bool terminal = decoded && (request.flags & wire::exec_terminal) != 0;
    if (!decoded || fds.size() != (terminal ? 0u : 3u)) {
        for (const int f : fds) ::close(f);
        // A request that names its command is answered, so the library never waits in vain.
        if (decoded) {
            send_exited(fd, request.exec_id, 0, wire::exited_spawn_failed,
                        descriptors_lost ? EMFILE : EBADF, now_us());
        }
        return;
    }
    run_exec(fd, request, fds);
}

void agent::run_exec(int fd, const wire::exec_request_view& request, std::span<int> fds) {
    const bool terminal = (request.flags & wire::exec_terminal) != 0;
    // A copy of what the child reads, which must outlive this record until the child has exec'd.
    start_block block;
    if (!blocks_.make(request, block)) {
        const int err = errno;
        for (const int f : fds) ::close(f);
        send_exited(fd, request.exec_id, 0, wire::exited_spawn_failed, err, now_us());
        return;
    }
    // A terminal command's stdio is its terminal's slave, in all three places.
    int master = -1;
    int slave = -1;
    if (terminal && !open_terminal(request.rows, request.cols, master, slave)) {
        const int err = errno;
        blocks_.release(block.base, block.bytes);
        send_exited(fd, request.exec_id, 0, wire::exited_spawn_failed, err, now_us());
        return;
    }
    int stdio[3] = {slave, slave, slave};
    for (std::size_t i = 0; i < fds.size(); ++i) stdio[i] = fds[i];
    const auto close_stdio = [&fds, slave] {
        for (const int f : fds) ::close(f);
        if (slave >= 0) ::close(slave);
    };
    const bool own_cgroup = (request.flags & wire::exec_own_cgroup) != 0;
    cgroup_slot slot;
    if (own_cgroup) slot = acquire_cgroup();
    int status[2];
    const std::uint64_t start = now_us();
    if (::pipe2(status, O_CLOEXEC | O_NONBLOCK) != 0) {
        const int err = errno;
        close_stdio();
        if (master >= 0) ::close(master);
        if (slot.dir >= 0) idle_cgroups_.push_back(slot);
        blocks_.release(block.base, block.bytes);
        send_exited(fd, request.exec_id, 0, wire::exited_spawn_failed, err, start);
        return;
    }
    for (int i = 0; i < 3; ++i) block.args->stdio[i] = stdio[i];
    block.args->status_pipe = status[1];
    block.args->join_procs = -1;
    block.args->join_freezer = freezer_tasks_;
    block.args->terminal = terminal;
    block.args->as_root = (request.flags & wire::exec_as_root) != 0;
    // Spawned processes go to the commands' cgroup (they outlive execs); an exec to its own.
    const int cgroup_dir = slot.dir >= 0 ? slot.dir : command_cgroup_;
    const pid_t pid = start_child(block, cgroup_dir);
    const int clone_errno = errno;
    ::close(status[1]);
    close_stdio();

    if (pid < 0) {
        ::close(status[0]);
        if (master >= 0) ::close(master);
        if (slot.dir >= 0) idle_cgroups_.push_back(slot);
        blocks_.release(block.base, block.bytes);
        send_exited(fd, request.exec_id, 0, wire::exited_spawn_failed, clone_errno, start);
        return;
    }
    const std::uint64_t deadline =
        request.wall_limit_ms == 0 ? 0 : start + request.wall_limit_ms * 1000;
    // `started` follows once the child has exec'd (check_starts), never waited for here.
    command c{request.exec_id, pid, start, deadline, fd, status[0], slot};
    c.resident = (request.flags & wire::exec_resident) != 0;
    c.pty_master = master;
    c.block = block.base;
    c.block_bytes = block.bytes;
    commands_.push_back(c);
}

void agent::check_starts() {
    for (auto& c : commands_) {
        if (c.started || c.status_pipe < 0) continue;
        int spawn_errno = 0;
        const ssize_t n = ::read(c.status_pipe, &spawn_errno, sizeof spawn_errno);
        if (n < 0) continue;  // EAGAIN: still on its way to exec
        if (n == 0) {
            // Exec'd: the program runs in its own process group from here.
            c.started = true;
            ::close(c.status_pipe);
            c.status_pipe = -1;
            blocks_.release(c.block, c.block_bytes);
            send_started(c);
        }
        // An errno: the child exits at once (on its start block still), and reap() reports it.
        if (n == static_cast<ssize_t>(sizeof spawn_errno) && spawn_errno != 0) {
            c.spawn_errno = spawn_errno;
            ::close(c.status_pipe);
            c.status_pipe = -1;
        }
    }
}

// Starts a command child in `cgroup_dir` (if >= 0): a pid, or -1 with errno set.
pid_t agent::start_child(const start_block& block, int cgroup_dir) {
    if (clone3_usable_) {
        clone_args ca{};
        ca.exit_signal = SIGCHLD;
        const bool share = clone3_run_available && share_memory_;
        if (share) {
            // Sharing pid 1's memory, on the block's stack; pid 1 goes on at once.
            ca.flags = CLONE_VM;
            ca.stack = reinterpret_cast<std::uint64_t>(block.base) +
                       static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
            ca.stack_size = child_stack_bytes;
        }
        const auto start = [&ca, &block, share]() -> long {
            if (share) return clone3_run(&ca, command_child, block.args);
            // A copy of pid 1 (no sequence for this architecture, or fs.suid_dumpable is not 0).
            const long pid = ::syscall(SYS_clone3, &ca, sizeof ca);
            if (pid == 0) command_main(*block.args);
            return pid < 0 ? -errno : pid;
        };
        const std::uint64_t sharing = ca.flags;
        if (cgroup_dir >= 0) {
            ca.flags = sharing | CLONE_INTO_CGROUP;
            ca.cgroup = static_cast<std::uint64_t>(cgroup_dir);
        }
        long pid = start();
        if (pid < 0 && cgroup_dir >= 0 && pid != -ENOSYS && pid != -EAGAIN && pid != -ENOMEM) {
            // The cgroup refused (not delegated to pid 1, or a kernel before 5.7): commands run
            // in pid 1's cgroup from now on, and strays are killed when the sandbox is idle.
            per_command_cgroups_ = false;
            command_cgroup_ = -1;
            ca.flags = sharing;
            ca.cgroup = 0;
            pid = start();
        }
        if (pid > 0) return static_cast<pid_t>(pid);
        if (pid != -ENOSYS) {
            errno = static_cast<int>(-pid);
            return -1;
        }
        clone3_usable_ = false;  // no clone3 here: fork, and the child moves itself
    }
    command_args& moving = *block.args;
    if (cgroup_dir >= 0 && command_cgroup_ >= 0) {
        moving.join_procs = ::openat(cgroup_dir, "cgroup.procs", O_WRONLY | O_CLOEXEC);
    }
    const pid_t pid = ::fork();
    if (pid == 0) command_main(moving);
    const int fork_errno = errno;
    if (moving.join_procs >= 0) ::close(moving.join_procs);
    errno = fork_errno;
    return pid;
}

agent::cgroup_slot agent::acquire_cgroup() {
    if (!idle_cgroups_.empty()) {
        const cgroup_slot slot = idle_cgroups_.back();
        idle_cgroups_.pop_back();
        return slot;
    }
    if (!per_command_cgroups_) return {};
    cgroup_slot slot;
    slot.number = next_cgroup_++;
    char name[24];
    std::snprintf(name, sizeof name, "c%llu", static_cast<unsigned long long>(slot.number));
    if (::mkdirat(command_cgroup_, name, 0755) != 0 && errno != EEXIST) {
        // Not delegated (a hybrid host whose unified hierarchy moat may not write): every command
        // shares the commands' cgroup, and strays are killed when the sandbox is idle. Anything
        // else (a descendant limit, memory) costs this exec its own cgroup only.
        if (errno == EACCES || errno == EPERM || errno == EROFS || errno == ENOENT)
            per_command_cgroups_ = false;
        return {};
    }
    slot.dir = ::openat(command_cgroup_, name, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (slot.dir < 0) {
        (void)::unlinkat(command_cgroup_, name, AT_REMOVEDIR);
        return {};
    }
    return slot;
}

bool agent::release_cgroup(cgroup_slot slot) {
    if (read_keyed(slot.dir, "cgroup.events", "populated") == 0) {
        if (idle_cgroups_.size() < idle_cgroups_kept) {
            idle_cgroups_.push_back(slot);
        } else {
            drop_cgroup(slot);
        }
        return false;
    }
    // Whatever it started lives on: kill all of it at once, however it forked or detached.
    if (!write_at(slot.dir, "cgroup.kill", "1")) {
        // Before Linux 5.14: freeze, signal every member, thaw (a frozen cgroup cannot fork).
        (void)write_at(slot.dir, "cgroup.freeze", "1");
        kill_members(slot.dir);
        (void)write_at(slot.dir, "cgroup.freeze", "0");
    }
    slot.killed_us = now_us();
    draining_cgroups_.push_back(slot);
    return true;
}

void agent::check_draining() {
    const std::uint64_t now = now_us();
    for (std::size_t i = draining_cgroups_.size(); i-- > 0;) {
        const cgroup_slot slot = draining_cgroups_[i];
        const bool empty = read_keyed(slot.dir, "cgroup.events", "populated") == 0;
        if (!empty && now - slot.killed_us < drain_give_up_us) continue;
        draining_cgroups_.erase(draining_cgroups_.begin() + static_cast<std::ptrdiff_t>(i));
        // Never reused: a cgroup once killed through cgroup.kill kills every child cloned into
        // it afterwards (seen on Linux 6.18: its kill count no longer matches the parent's).
        if (empty) {
            drop_cgroup(slot);
        } else {
            ::close(slot.dir);  // still populated: left for the helper, which removes it
        }
    }
}

void agent::drop_cgroup(const cgroup_slot& slot) {
    char name[24];
    std::snprintf(name, sizeof name, "c%llu", static_cast<unsigned long long>(slot.number));
    (void)::unlinkat(command_cgroup_, name, AT_REMOVEDIR);
    ::close(slot.dir);
}

void agent::reap() {
    signalfd_siginfo info[8];
    while (::read(signal_fd_, info, sizeof info) > 0) {
    }
    bool command_ended = false;
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
        for (std::size_t i = 0; i < commands_.size(); ++i) {
            command c = commands_[i];
            if (c.pid != pid) continue;
            blocks_.release(c.block, c.block_bytes);
            // Background processes die with the command: its process group always, and where it
            // has a cgroup of its own, everything in it. The leader is reaped, so the group kill
            // succeeds only if something of the command was left in it (such as a child caught
            // before its setsid): that is a stray killed too.
            const bool group_left = ::kill(-c.pid, SIGKILL) == 0;
            commands_.erase(commands_.begin() + static_cast<std::ptrdiff_t>(i));
            std::uint32_t flags = c.timed_out ? std::uint32_t{wire::exited_timed_out} : 0u;
            const bool cgroup_left = c.cgroup.dir >= 0 && release_cgroup(c.cgroup);
            if (group_left || cgroup_left) flags |= wire::exited_strays_killed;
            // The child has exited, so its end of the status pipe is closed: this never blocks.
            int spawn_errno = c.spawn_errno;
            if (c.status_pipe >= 0) {
                if (::read(c.status_pipe, &spawn_errno, sizeof spawn_errno) !=
                    static_cast<ssize_t>(sizeof spawn_errno)) {
                    spawn_errno = 0;
                }
                ::close(c.status_pipe);
            }
            if (spawn_errno != 0) {
                flags = wire::exited_spawn_failed;
            } else if (!c.started) {
                // It exec'd and ended before its status pipe was read: started, then exited.
                send_started(c);
            }
            send_exited(c.connection, c.exec_id, status, flags, spawn_errno, c.start_us);
            for (const auto& [peer, id] : c.attached) {
                send_exited(peer, id, status, flags, spawn_errno, c.start_us);
            }
            if (c.pty_master >= 0) ::close(c.pty_master);
            command_ended = true;
            break;
        }
    }
    // Nothing runs in an idle sandbox: this also catches processes that escaped with setsid where
    // there are no per-command cgroups. Their exits arrive as new SIGCHLDs and are reaped on the
    // next pass.
    // (Not the commands' cgroup.kill: a cgroup once killed that way kills every child later cloned
    // into it or below it, see check_draining.)
    if (!command_ended) return;
    bool residents = false;
    bool separable = true;  // every resident has a cgroup of its own
    for (const auto& c : commands_) {
        if (!c.resident) return;
        residents = true;
        separable = separable && c.cgroup.dir >= 0;
    }
    if (!residents) {
        ::kill(-1, SIGKILL);
        return;
    }
    // Only residents run: they and what they started live in cgroups of their own below the
    // commands' one, so the strays are the commands' cgroup's own members. Without per-command
    // cgroups there is no telling a resident's processes from strays: nothing is swept then.
    if (separable && command_cgroup_ >= 0) kill_members(command_cgroup_);
}

void agent::kill_members(int cgroup_dir) {
    const int procs = ::openat(cgroup_dir, "cgroup.procs", O_RDONLY | O_CLOEXEC);
    if (procs < 0) return;
    char text[4096];
    pid_lines lines;  // a pid may straddle two reads
    std::vector<int> members;
    for (;;) {
        const ssize_t n = ::read(procs, text, sizeof text);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        lines.feed(std::string_view(text, static_cast<std::size_t>(n)), members);
        for (const int member : members) {
            if (member > 1) ::kill(member, SIGKILL);
        }
        members.clear();
    }
    ::close(procs);
}

void agent::send_exited(int fd, std::uint64_t exec_id, int status, std::uint32_t flags,
                        int spawn_errno, std::uint64_t start_us) {
    auto m = wire::make_message<wire::exited_message>(wire::message_type::exited);
    m.exec_id = exec_id;
    m.wait_status = status;
    m.flags = flags;
    m.spawn_errno = spawn_errno;
    m.duration_us = now_us() - start_us;
    send(fd, m);
}

}  // namespace moat::sandboxd
