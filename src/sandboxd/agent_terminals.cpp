// The agent's terminals (agent_impl.hpp is the contract between pid 1's files): a command started
// with exec_terminal runs on a pseudo-terminal of the sandbox's own devpts instance (mounted at
// create, /dev/ptmx names its multiplexer). pid 1 keeps the master until the command is reaped and
// hands a duplicate to the connection that started it (with `started`) and to each pty_attach.
#include "sandboxd/agent_impl.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

namespace moat::sandboxd {

bool agent::open_terminal(std::uint16_t rows, std::uint16_t cols, int& master, int& slave) {
    master = ::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0) return false;
    int unlock = 0;
    winsize size{};
    size.ws_row = rows;
    size.ws_col = cols;
    // TIOCGPTPEER opens the slave through the master, never by a path another process could
    // have replaced.
    if (::ioctl(master, TIOCSPTLCK, &unlock) != 0 || ::ioctl(master, TIOCSWINSZ, &size) != 0 ||
        (slave = ::ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0) {
        const int err = errno;
        ::close(master);
        errno = err;
        return false;
    }
    // The command's user owns its terminal (as login does), so `mesg`, `tty` and a reopen work.
    (void)::fchown(slave, wire::sandbox_user_id, wire::sandbox_group_id);
    (void)::fchmod(slave, 0620);
    return true;
}

void agent::send_started(const command& c) {
    auto started = wire::make_message<wire::started_message>(wire::message_type::started);
    started.exec_id = c.exec_id;
    started.pid = c.pid;
    if (c.connection < 0) return;
    const int master[1] = {c.pty_master};
    std::span<const int> fds;
    if (c.pty_master >= 0) fds = master;
    const auto bytes = std::as_bytes(std::span(&started, 1));
    if (wire::send_record(c.connection, bytes, fds, MSG_DONTWAIT) < 0) mark_closing(c.connection);
}

void agent::handle_pty_attach(int fd, const wire::pty_attach_message& m) {
    auto reply = wire::make_message<wire::pty_attached_message>(wire::message_type::pty_attached);
    reply.exec_id = m.exec_id;
    command* target = nullptr;
    for (auto& c : commands_) {
        const bool same_id = c.connection == fd && c.exec_id == m.exec_id;
        bool attached_id = false;
        for (const auto& [peer, id] : c.attached) {
            attached_id = attached_id || (peer == fd && id == m.exec_id);
        }
        if (same_id || attached_id) reply.attach_errno = EBUSY;
        // Only once it runs the program (not while the child is on its way to exec).
        if (c.pid == m.pid && c.pty_master >= 0 && c.started) target = &c;
    }
    if (reply.attach_errno == 0 && target == nullptr) reply.attach_errno = ESRCH;
    int master = -1;
    if (reply.attach_errno == 0) {
        master = ::fcntl(target->pty_master, F_DUPFD_CLOEXEC, 0);
        if (master < 0) reply.attach_errno = EMFILE;
    }
    if (master >= 0) target->attached.emplace_back(fd, m.exec_id);
    send_attached(fd, std::as_bytes(std::span(&reply, 1)), master);
}

}  // namespace moat::sandboxd
