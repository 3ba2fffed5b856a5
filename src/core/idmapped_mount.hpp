// Idmapped mounts, the one sequence every layer of a sandbox's root goes through
// (docs/architecture.md, "Layers and ownership"): a directory cloned as a detached mount and
// idmapped onto a user namespace, so that ids stored as a sandbox sees them (0 its root, 1000 its
// user) appear as that sandbox's host ids. Header-only, errno-style and free of the library's
// types, because the helper (a static binary of its own) and the library both use it.
#pragma once

#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <string>

namespace moat::idmapped {

// `path` cloned as a detached mount (its own mount only, not those below it), idmapped onto the
// user namespace `userns_fd` with `extra_attrs` (MOUNT_ATTR_RDONLY...) set too. Returns the mount's
// file descriptor (close-on-exec), or -1 with errno set and `step` naming what failed.
inline int open_tree(const char* path, int userns_fd, std::uint64_t extra_attrs,
                     const char*& step) {
    const int tree = static_cast<int>(
        ::syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
    if (tree < 0) {
        step = "open_tree";
        return -1;
    }
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_IDMAP | extra_attrs;
    attr.userns_fd = static_cast<std::uint64_t>(userns_fd);
    if (::syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) {
        const int err = errno;
        ::close(tree);
        errno = err;
        step = "idmapped mount";
        return -1;
    }
    return tree;
}

namespace detail {
// The throwaway namespace's process: it waits until the probe is done (its pipe closes; its own
// copy of the write end goes first).
inline int wait_for_close(void* pipe_fds) {
    const int* fds = static_cast<int*>(pipe_fds);
    ::close(fds[1]);
    char byte = 0;
    (void)::read(fds[0], &byte, 1);
    return 0;
}
}  // namespace detail

// Whether `dir` can be idmapped here, tried for real: a throwaway user namespace (one id of
// nobody's, enough for mount_setattr to accept it) and open_tree above, read-only. Needs root.
// Returns 0, or an errno with `step` naming what failed.
inline int probe(const char* dir, std::string& step) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
        step = "pipe";
        return errno;
    }
    alignas(16) static std::array<char, 64 * 1024> stack;
    const pid_t child = ::clone(detail::wait_for_close, stack.data() + stack.size(),
                                CLONE_NEWUSER | SIGCHLD, pipe_fds);
    const int clone_err = errno;
    ::close(pipe_fds[0]);
    int keep_open = pipe_fds[1];
    const auto reap = [child, &keep_open] {
        if (keep_open >= 0) ::close(keep_open);
        keep_open = -1;
        int status = 0;
        while (child > 0 && ::waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
    };
    if (child < 0) {
        ::close(keep_open);
        step = "clone a user namespace";
        return clone_err;
    }
    const std::string proc = "/proc/" + std::to_string(child) + "/";
    for (const char* file : {"uid_map", "gid_map"}) {
        const int map = ::open((proc + file).c_str(), O_WRONLY | O_CLOEXEC);
        constexpr char line[] = "0 65534 1\n";
        const bool written = map >= 0 && ::write(map, line, sizeof line - 1) >= 0;
        const int err = errno;
        if (map >= 0) ::close(map);
        if (!written) {
            reap();
            step = std::string("write ") + file;
            return err;
        }
    }
    const int userns = ::open((proc + "ns/user").c_str(), O_RDONLY | O_CLOEXEC);
    int err = 0;
    if (userns < 0) {
        err = errno;
        step = "open the user namespace";
    } else {
        const char* failed = "";
        const int tree = open_tree(dir, userns, MOUNT_ATTR_RDONLY, failed);
        if (tree < 0) {
            err = errno;
            step = std::string(failed) + " of " + dir;
        } else {
            ::close(tree);
        }
        ::close(userns);
    }
    reap();
    return err;
}

}  // namespace moat::idmapped
