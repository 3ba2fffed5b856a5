#include "wire/fd_passing.hpp"

#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>

namespace moat::wire {

ssize_t send_record(int socket, std::span<const std::byte> data, std::span<const int> fds,
                    int flags) noexcept {
    if (fds.size() > max_fds_per_message) {
        errno = EINVAL;
        return -1;
    }
    iovec iov{const_cast<std::byte*>(data.data()), data.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds_per_message)] = {};
    if (!fds.empty()) {
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n;
    do {
        n = ::sendmsg(socket, &msg, flags | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
}

ssize_t receive_record(int socket, std::span<std::byte> buffer, std::span<int> fds,
                       std::size_t& fd_count, bool& descriptors_lost, int flags) noexcept {
    fd_count = 0;
    descriptors_lost = false;
    iovec iov{buffer.data(), buffer.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds_per_message)] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n;
    do {
        n = ::recvmsg(socket, &msg, flags | MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return n;

    int received[max_fds_per_message];
    std::size_t count = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < k && count < max_fds_per_message; ++i) {
            std::memcpy(&received[count++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
    }
    const bool lost = count > fds.size() || (msg.msg_flags & MSG_CTRUNC) != 0;
    const bool truncated = (msg.msg_flags & MSG_TRUNC) != 0;
    if (lost || truncated) {
        for (std::size_t i = 0; i < count; ++i) ::close(received[i]);
        if (truncated) {
            errno = EMSGSIZE;
            return -1;
        }
        descriptors_lost = true;
        return n;
    }
    for (std::size_t i = 0; i < count; ++i) fds[i] = received[i];
    fd_count = count;
    return n;
}

}  // namespace moat::wire
