// What a command child runs between its clone and the command's execve (the contract with pid 1 is
// command_child.hpp): its stdio, session, seccomp filter and uid, then execvp's search of PATH
// without libc; and the start blocks it runs on, laid out and kept for reuse by pid 1.
#include "sandboxd/command_child.hpp"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <iterator>
#include <new>
#include <string_view>

#include "sandboxd/raw_syscall.hpp"
#include "sandboxd/seccomp_filter.hpp"

namespace moat::sandboxd {
namespace {

[[noreturn]] void command_fail(const command_args& a, long result) {
    const int err = result < 0 ? static_cast<int>(-result) : EINVAL;
    raw(SYS_write, a.status_pipe, &err, sizeof err);
    raw(SYS_exit_group, 127);
    __builtin_unreachable();
}

// execve, and as execvp does for a file the kernel cannot run (ENOEXEC, a script without #!):
// the file run by /bin/sh. The result of the last execve.
long exec_file(const command_args& a, const char* file) {
    const long result = raw(SYS_execve, file, a.argv, a.envp);
    if (result != -ENOEXEC) return result;
    char** shell = a.shell_argv;
    shell[0] = const_cast<char*>("/bin/sh");
    shell[1] = const_cast<char*>(file);
    shell[2] = nullptr;
    for (std::size_t i = 1; i <= a.argc; ++i) shell[i + 1] = a.argv[i];  // argv[argc] is null
    return raw(SYS_execve, "/bin/sh", shell, a.envp);
}

// execvp(argv[0]) without libc: a name with a slash is run as it is; otherwise each PATH entry
// in turn (an empty one is the working directory; no PATH means /bin:/usr/bin) until one runs or
// fails with an error other than "not there" (ENOENT, ENOTDIR, ESTALE, ENODEV, ETIMEDOUT) or
// EACCES, which is returned if no entry ran. The result of the failed execve.
long exec_search(const command_args& a) {
    const char* file = a.argv[0];
    std::size_t file_bytes = 0;
    bool slash = false;
    while (file[file_bytes] != '\0') {
        slash = slash || file[file_bytes] == '/';
        ++file_bytes;
    }
    if (file_bytes == 0) return -ENOENT;
    if (slash) return exec_file(a, file);
    if (file_bytes > NAME_MAX) return -ENAMETOOLONG;
    const char* entry = a.path != nullptr ? a.path : "/bin:/usr/bin";
    char candidate[PATH_MAX + NAME_MAX + 2];
    long result = -ENOENT;
    bool denied = false;
    for (;;) {
        std::size_t entry_bytes = 0;
        while (entry[entry_bytes] != '\0' && entry[entry_bytes] != ':') ++entry_bytes;
        if (entry_bytes < PATH_MAX) {  // a longer entry is skipped, as execvp does
            std::size_t n = 0;
            for (; n < entry_bytes; ++n) candidate[n] = entry[n];
            if (n > 0) candidate[n++] = '/';
            for (std::size_t i = 0; i <= file_bytes; ++i) candidate[n + i] = file[i];
            result = exec_file(a, candidate);
            switch (-result) {
                case EACCES:
                    denied = true;
                    break;
                case ENOENT:
                case ESTALE:
                case ENOTDIR:
                case ENODEV:
                case ETIMEDOUT:
                    break;
                default:
                    return result;  // found, but it could not run
            }
        }
        if (entry[entry_bytes] == '\0') break;
        entry += entry_bytes + 1;
    }
    return denied ? -EACCES : result;
}

}  // namespace

[[noreturn]] void command_main(const command_args& a) {
    long r = 0;
    if (a.join_procs >= 0 && (r = raw(SYS_write, a.join_procs, "0", 1)) != 1) command_fail(a, r);
    if (a.join_freezer >= 0 && (r = raw(SYS_write, a.join_freezer, "0", 1)) != 1) {
        command_fail(a, r);
    }
    raw(SYS_setsid);
    for (int fd = 0; fd < 3; ++fd) {
        // dup2: a descriptor already in place stays as it is.
        r = a.stdio[fd] == fd ? raw(SYS_fcntl, fd, F_GETFD) : raw(SYS_dup3, a.stdio[fd], fd, 0);
        if (r < 0) command_fail(a, r);
    }
    // The new session's controlling terminal: job control, ^C, and the hang-up at its end.
    if (a.terminal && (r = raw(SYS_ioctl, 0, TIOCSCTTY, 0)) != 0) command_fail(a, r);
    // Everything above 2 closes at exec, the status pipe included.
    if ((r = raw(SYS_close_range, 3, ~0u, CLOSE_RANGE_CLOEXEC)) != 0) command_fail(a, r);
    // Limits, the bounding set and the groups were set once in pid 1 (agent::setup) and are
    // inherited; what is left here is what must differ from pid 1.
    if ((r = raw(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)) != 0)
        command_fail(a, r);
    sock_fprog no_clone3{static_cast<unsigned short>(std::size(command_filter)),
                         const_cast<sock_filter*>(command_filter)};
    if ((r = raw(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &no_clone3)) != 0) command_fail(a, r);
    if (a.as_root) {
        // The sandbox's root: uid 0 already (pid 1's), group root; the bounding set pid 1 kept
        // (wire::root_capabilities) is what exec gives it. Its memory (pid 1's, or a copy where
        // fs.suid_dumpable is not 0) is non-dumpable until the exec, so /proc/<child>/mem stays
        // closed to the sandbox's other root processes.
        const gid_t root_group = 0;
        if ((r = raw(SYS_setgroups, 1, &root_group)) != 0) command_fail(a, r);
        if ((r = raw(SYS_setresgid, 0, 0, 0)) != 0) command_fail(a, r);
        if ((r = raw(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0)) != 0) command_fail(a, r);
    } else {
        // No capability left to gain at exec: the bounding set loses what pid 1 kept for root.
        for (int cap = 0; cap < 64; ++cap) {
            if (((wire::root_capabilities >> cap) & 1) == 0) continue;
            if ((r = raw(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0)) != 0) command_fail(a, r);
        }
        // The uid in two steps, because the child shares pid 1's memory: with only the
        // effective uid changed, sandbox code can neither signal, stop nor ptrace the child (its
        // real and saved uids are still 0); then the memory is made non-dumpable again (the euid
        // change set it to the host's fs.suid_dumpable), so that once the child has the
        // sandbox's uid entirely, /proc/<child>/mem does not open pid 1's memory to sandbox
        // code. The second change keeps the euid, so it leaves dumpability alone.
        const uid_t user = wire::sandbox_user_id;
        if ((r = raw(SYS_setresuid, -1, user, -1)) != 0) command_fail(a, r);
        if ((r = raw(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0)) != 0) command_fail(a, r);
        if ((r = raw(SYS_setresuid, user, user, user)) != 0) command_fail(a, r);
    }
    if ((r = raw(SYS_chdir, a.cwd)) != 0) command_fail(a, r);
    const unsigned long no_signals = 0;  // the kernel's sigset_t
    raw(SYS_rt_sigprocmask, SIG_SETMASK, &no_signals, nullptr, sizeof no_signals);
    command_fail(a, exec_search(a));
}

int command_child(void* args) {
    command_main(*static_cast<const command_args*>(args));
}

void start_blocks::release(void*& base, std::size_t bytes) {
    if (base == nullptr) return;
    if (bytes == usual_bytes && spares_ < kept) {
        spare_[spares_++] = base;
    } else {
        ::munmap(base, bytes);
    }
    base = nullptr;
}

bool start_blocks::make(const wire::exec_request_view& request, start_block& out) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t argc = request.argv.size();
    const std::size_t pointers = (argc + 1) + (argc + 2) + (request.env.size() + 1);
    std::size_t strings = request.cwd.size() + 1;
    for (auto s : request.argv) strings += s.size() + 1;
    for (auto s : request.env) strings += s.size() + 1;
    const std::size_t bytes =
        page + child_stack_bytes + sizeof(command_args) + pointers * sizeof(char*) + strings;
    const bool usual = bytes <= usual_bytes && usual_bytes % page == 0;
    const std::size_t mapped = usual ? usual_bytes : (bytes + page - 1) / page * page;
    void* base = nullptr;
    if (usual && spares_ > 0) {
        base = spare_[--spares_];
    } else {
        base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (base == MAP_FAILED) return false;
        if (::mprotect(base, page, PROT_NONE) != 0) {
            const int err = errno;
            ::munmap(base, mapped);
            errno = err;
            return false;
        }
    }
    char* at = static_cast<char*>(base) + page + child_stack_bytes;
    auto* args = new (at) command_args{};
    at += sizeof(command_args);
    auto** argv = reinterpret_cast<char**>(at);
    args->shell_argv = argv + argc + 1;
    auto** envp = args->shell_argv + argc + 2;
    char* text = reinterpret_cast<char*>(envp + request.env.size() + 1);
    const auto copy = [&text](std::string_view s) {
        char* start = text;
        std::memcpy(text, s.data(), s.size());
        text[s.size()] = '\0';
        text += s.size() + 1;
        return start;
    };
    for (std::size_t i = 0; i < argc; ++i) argv[i] = copy(request.argv[i]);
    argv[argc] = nullptr;
    for (std::size_t i = 0; i < request.env.size(); ++i) {
        envp[i] = copy(request.env[i]);
        // getenv's PATH: the first entry that names it.
        if (args->path == nullptr && request.env[i].starts_with("PATH=")) args->path = envp[i] + 5;
    }
    envp[request.env.size()] = nullptr;
    args->cwd = copy(request.cwd);
    args->argv = argv;
    args->argc = argc;
    args->envp = envp;
    out = {base, mapped, args};
    return true;
}

}  // namespace moat::sandboxd
