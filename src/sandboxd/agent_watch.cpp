// pid 1's part of a file watch (agent_impl.hpp): the watch is added here, in the sandbox's mount
// namespace, so a path means what it means to the sandbox's own processes; the events are read by
// the library straight from the inotify instance, which pid 1 makes and hands out but never keeps.
// Nothing here blocks: an open of a directory and inotify_add_watch.
#include "sandboxd/agent_impl.hpp"

#include <fcntl.h>
#include <sys/inotify.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <string>

namespace moat::sandboxd {
namespace {

// The directory `base`/`relative`: base resolved as any path in the sandbox, then each component
// of relative without following a symlink. -1 with errno on failure.
int open_watched_dir(std::string_view base, std::string_view relative) {
    const std::string base_path(base);
    int dir = ::open(base_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    while (dir >= 0 && !relative.empty()) {
        const std::size_t slash = relative.find('/');
        const std::string name(relative.substr(0, slash));
        relative =
            slash == std::string_view::npos ? std::string_view{} : relative.substr(slash + 1);
        if (name.empty() || name == "." || name == "..") {
            ::close(dir);
            errno = EINVAL;
            return -1;
        }
        const int next = ::openat(dir, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        const int saved = errno;
        ::close(dir);
        errno = saved;
        dir = next;
    }
    return dir;
}

}  // namespace

void agent::handle_watch_dir(int fd, std::span<const std::byte> record, std::span<int> fds,
                             bool descriptors_lost) {
    wire::watch_dir_view request;
    if (!wire::decode_watch_dir(record, request) || fds.size() > 1) {
        for (const int received : fds) ::close(received);
        return;
    }
    auto reply = wire::make_message<wire::watch_added_message>(wire::message_type::watch_added);
    reply.request_id = request.request_id;
    reply.watch_descriptor = -1;
    int instance = fds.empty() ? -1 : fds[0];
    const bool made_here = fds.empty() && !descriptors_lost;
    if (descriptors_lost) reply.watch_errno = EMFILE;
    if (made_here) {
        instance = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
        if (instance < 0) reply.watch_errno = errno;
    }
    if (instance >= 0) {
        const int dir = open_watched_dir(request.base, request.relative);
        if (dir < 0) {
            reply.watch_errno = errno;
        } else {
            // The descriptor's own /proc link names the directory opened above: no second walk.
            char link[32];
            std::snprintf(link, sizeof link, "/proc/self/fd/%d", dir);
            const int wd = ::inotify_add_watch(instance, link, request.mask | IN_ONLYDIR);
            if (wd < 0) {
                reply.watch_errno = errno;
            } else {
                reply.watch_descriptor = wd;
            }
            ::close(dir);
        }
    }
    const int attached[1] = {instance};
    std::span<const int> out;
    if (made_here && reply.watch_errno == 0) out = attached;
    const auto bytes = std::as_bytes(std::span(&reply, 1));
    if (wire::send_record(fd, bytes, out, MSG_DONTWAIT) < 0) mark_closing(fd);
    if (instance >= 0) ::close(instance);
}

}  // namespace moat::sandboxd
