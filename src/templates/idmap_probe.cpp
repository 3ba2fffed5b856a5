#include "templates/idmap_probe.hpp"

#include "core/unique_fd.hpp"

#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace moat::templates {
namespace {

// The throwaway namespace's process: it waits until the probe is done (its pipe closes; its
// own copy of the write end goes first).
int wait_for_close(void* pipe_fds) {
    const int* fds = static_cast<int*>(pipe_fds);
    ::close(fds[1]);
    char byte = 0;
    (void)::read(fds[0], &byte, 1);
    return 0;
}

error failed(const std::string& step, int err) {
    return make_error(errc::layer_unavailable,
                      step + ": " + std::strerror(err) +
                          " (templates need idmapped mounts: Linux 5.12 or later, as root, on a "
                          "file system that supports them)");
}

}  // namespace

result<void> probe_idmapped_mount(const std::string& dir) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return failed("pipe", errno);
    alignas(16) static std::array<char, 64 * 1024> stack;
    const pid_t child =
        ::clone(wait_for_close, stack.data() + stack.size(), CLONE_NEWUSER | SIGCHLD, pipe_fds);
    unique_fd keep_open(pipe_fds[1]);
    ::close(pipe_fds[0]);
    if (child < 0) return failed("clone a user namespace", errno);
    const auto reap = [child, &keep_open] {
        keep_open.reset();
        int status = 0;
        while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
    };
    const std::string proc = "/proc/" + std::to_string(child) + "/";
    // One id of nobody's: enough for a mount_setattr to accept the namespace.
    for (const char* file : {"uid_map", "gid_map"}) {
        unique_fd map(::open((proc + file).c_str(), O_WRONLY | O_CLOEXEC));
        constexpr std::string_view line = "0 65534 1\n";
        if (!map.is_open() || ::write(map.get(), line.data(), line.size()) < 0) {
            const int err = errno;
            reap();
            return failed(std::string("write ") + file, err);
        }
    }
    unique_fd userns(::open((proc + "ns/user").c_str(), O_RDONLY | O_CLOEXEC));
    unique_fd tree(static_cast<int>(
        ::syscall(SYS_open_tree, AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
    int err = 0;
    std::string step;
    if (!userns.is_open()) {
        err = errno;
        step = "open the user namespace";
    } else if (!tree.is_open()) {
        err = errno;
        step = "open_tree " + dir;
    } else {
        mount_attr attr{};
        attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY;
        attr.userns_fd = static_cast<std::uint64_t>(userns.get());
        if (::syscall(SYS_mount_setattr, tree.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) {
            err = errno;
            step = "idmapped mount of " + dir;
        }
    }
    reap();
    if (err != 0) return failed(step, err);
    return {};
}

}  // namespace moat::templates
