// The agent's sudo socket (agent.hpp): the sandbox's sudo shim (sudo_shim.cpp) asks pid 1 here to
// start a command as the sandbox's root; pid 1 runs it like any exec (agent_commands.cpp) with
// exec_as_root and a cgroup of its own, reporting to that connection.
#include "sandboxd/agent_impl.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>

namespace moat::sandboxd {
namespace {

constexpr std::size_t max_sudo_running = 8;  // sudo commands running at once
// Connections held at once: those past max_sudo_running are answered EAGAIN and close soon after
// (their shim exits); beyond this many, a connection is closed unanswered.
constexpr std::size_t max_sudo_connections = 32;
constexpr std::uint64_t sudo_request_us = 5'000'000;  // from connect to the exec record

}  // namespace

bool agent::listen_sudo() {
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    // Abstract: the name lives in this sandbox's network namespace, so nothing outside reaches
    // it, and pid 1 binds it before any command could.
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, wire::sudo_socket_name.data(), wire::sudo_socket_name.size());
    const auto length =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + wire::sudo_socket_name.size());
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
        ::listen(fd, 16) != 0) {
        ::close(fd);
        return false;
    }
    sudo_fd_ = fd;
    return true;
}

agent::connection* agent::find_connection(int fd) {
    for (auto& c : connections_) {
        if (c.fd == fd) return &c;
    }
    return nullptr;
}

void agent::accept_sudo() {
    ucred peer{};
    const int fd = accept_with_peer(sudo_fd_, peer);
    if (fd < 0) return;
    // Only processes of this sandbox: a peer outside its pid namespace has no pid here.
    if (peer.pid <= 0) {
        ::close(fd);
        return;
    }
    const auto held = std::count_if(connections_.begin(), connections_.end(),
                                    [](const connection& c) { return c.sudo; });
    if (static_cast<std::size_t>(held) >= max_sudo_connections) {
        ::close(fd);
        return;
    }
    connection c{fd, false};
    c.sudo = true;
    c.request_deadline_us = now_us() + sudo_request_us;
    connections_.push_back(c);
}

void agent::handle_sudo_exec(connection& c, std::span<const std::byte> record, std::span<int> fds) {
    wire::exec_request_view request;
    const bool decoded = wire::decode_exec(record, request);
    const auto running = std::count_if(connections_.begin(), connections_.end(),
                                       [](const connection& other) { return other.running; });
    int refused = 0;
    if (!allow_sudo_) {
        refused = EPERM;
    } else if (!decoded || fds.size() != 3 || (request.flags & wire::exec_terminal) != 0) {
        refused = EINVAL;
    } else if (c.request_deadline_us == 0) {
        refused = EBUSY;  // one command per connection
    } else if (static_cast<std::size_t>(running) >= max_sudo_running) {
        refused = EAGAIN;  // the shim says so and exits, which closes this connection
    }
    c.request_deadline_us = 0;
    if (refused != 0) {
        for (const int f : fds) ::close(f);
        send_exited(c.fd, request.exec_id, 0, wire::exited_spawn_failed, refused, now_us());
        return;
    }
    // Root, in a cgroup of its own, without a wall limit: it ends with its connection (the shim,
    // itself inside the calling command's limits) like any command of a connection.
    request.flags = wire::exec_as_root | wire::exec_own_cgroup;
    request.wall_limit_ms = 0;
    c.running = true;
    run_exec(c.fd, request, fds);
}

}  // namespace moat::sandboxd
