#include "support/loopback_peer.hpp"

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace moat::test {

namespace {

// A loopback socket, connected or not (false when the connect failed).
bool open_loopback(unsigned short port, std::chrono::seconds bound, int receive_window, int& fd) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    if (receive_window > 0)
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_window, sizeof receive_window);
    timeval timeout{static_cast<time_t>(bound.count()), 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
}

}  // namespace

int connect_loopback(unsigned short port, std::chrono::seconds bound, int receive_window) {
    int fd = -1;
    const bool connected = open_loopback(port, bound, receive_window, fd);
    if (!connected) ::close(fd);
    REQUIRE(connected);
    return fd;
}

std::vector<int> open_idle_health_clients(unsigned short port, int count) {
    std::vector<int> fds;
    const std::string request =
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n\r\n";
    for (int i = 0; i < count; ++i) {
        int fd = -1;
        const bool connected = open_loopback(port, std::chrono::seconds(5), 0, fd);
        fds.push_back(fd);
        if (!connected) continue;
        (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
        char reply[512];
        (void)::recv(fd, reply, sizeof reply, 0);  // the answer, or the close of a refused one
    }
    return fds;
}

void raise_open_files(std::size_t descriptors) {
    rlimit files{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &files) == 0);
    if (files.rlim_cur >= descriptors) return;
    files.rlim_cur = std::min<rlim_t>(descriptors, files.rlim_max);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &files) == 0);
}

}  // namespace moat::test
