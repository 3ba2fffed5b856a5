#include "local/sandboxd_launcher.hpp"

#include "core/spawn_attributes.hpp"
#include "wire/protocol.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>

extern "C" const unsigned char moat_sandboxd_image_begin[];
extern "C" const unsigned char moat_sandboxd_image_end[];

namespace moat {
namespace {

std::string errno_text(const char* what, int e) {
    return std::string(what) + ": " + std::strerror(e);
}

// The embedded image in a sealed memfd, made once per process.
result<int> embedded_image_fd() {
    static std::mutex mutex;
    static int fd = -1;
    const std::lock_guard lock(mutex);
    if (fd >= 0) return fd;
    unique_fd memfd(::memfd_create("moat-sandboxd", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!memfd.is_open()) {
        return make_error(errc::backend_failure,
                          errno_text("memfd_create for moat-sandboxd", errno));
    }
    const auto* p = moat_sandboxd_image_begin;
    std::size_t left =
        static_cast<std::size_t>(moat_sandboxd_image_end - moat_sandboxd_image_begin);
    while (left > 0) {
        const ssize_t n = ::write(memfd.get(), p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return make_error(errc::backend_failure, errno_text("writing moat-sandboxd", errno));
        p += n;
        left -= static_cast<std::size_t>(n);
    }
    // F_SEAL_WRITE fails with EBUSY while the kernel still holds a transient pin on one of the
    // file's pages (it waits for pins only briefly): retried a few times, 10 ms apart, once per
    // process.
    for (int attempt = 1;; ++attempt) {
        if (::fcntl(memfd.get(), F_ADD_SEALS,
                    F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) == 0) {
            break;
        }
        if (errno != EBUSY || attempt == 10) {
            return make_error(errc::backend_failure, errno_text("sealing moat-sandboxd", errno));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    fd = memfd.release();
    return fd;
}

}  // namespace

result<launched_helper> launch_sandboxd(const std::string& sandboxd_path,
                                        const std::string& state_dir) {
    std::string program = sandboxd_path;
    if (program.empty()) {
        auto image = embedded_image_fd();
        if (!image) return std::move(image).error();
        program = "/proc/self/fd/" + std::to_string(*image);
    }

    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
        return make_error(errc::backend_failure, errno_text("socketpair for moat-sandboxd", errno));
    }
    unique_fd ours(pair[0]);
    unique_fd theirs(pair[1]);
    // Keep the helper's end clear of fds 0-3: the file actions below reopen 0-2, and dup2(3, 3)
    // would leave close-on-exec set.
    if (theirs.get() < 4) theirs.reset(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 4));

    detail::spawn_attributes sa;
    // The helper gets /dev/null for stdio: whatever the application has on 0-2 (a connection
    // that reused fd 0, a log file) must not be held open by it.
    for (int fd = 0; fd < 3; ++fd) {
        posix_spawn_file_actions_addopen(&sa.actions, fd, "/dev/null", O_RDWR, 0);
    }
    posix_spawn_file_actions_adddup2(&sa.actions, theirs.get(), 3);

    std::string arg0 = "moat-sandboxd", arg1 = "helper", arg2 = "--state-dir", arg3 = state_dir;
    char* argv[] = {arg0.data(), arg1.data(), arg2.data(), arg3.data(), nullptr};
    char* envp[] = {nullptr};
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, program.c_str(), &sa.actions, &sa.attr, argv, envp);
    if (rc != 0) {
        return make_error(errc::backend_failure, errno_text("starting moat-sandboxd", rc));
    }
    launched_helper helper;
    helper.pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!helper.pidfd.is_open()) {
        const int err = errno;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        return make_error(errc::backend_failure, errno_text("pidfd_open for moat-sandboxd", err));
    }
    helper.socket = std::move(ours);
    return helper;
}

}  // namespace moat
