// Sending and receiving one SOCK_SEQPACKET record with file descriptors attached (SCM_RIGHTS).
// Plain POSIX, shared by the library, the helper and the agent. Received descriptors are always
// close-on-exec.
#pragma once

#include <sys/types.h>
#include <cstddef>
#include <span>

namespace moat::wire {

inline constexpr std::size_t max_fds_per_message = 4;

// Sends `data` as one record with `fds` attached. Returns bytes sent or -1 with errno set.
// Never raises SIGPIPE. `flags` is passed to sendmsg (e.g. MSG_DONTWAIT).
ssize_t send_record(int socket, std::span<const std::byte> data, std::span<const int> fds,
                    int flags) noexcept;

// Receives one record into `buffer`. `fds` receives up to fds.size() descriptors and `fd_count`
// how many arrived. Returns the record length (0 on EOF) or -1 with errno set; a record larger
// than `buffer` fails with EMSGSIZE. When the record's descriptors did not all arrive (the
// receiver ran out of descriptors: MSG_CTRUNC, or more came than `fds` holds), the record is still
// returned, every descriptor that did arrive is closed, fd_count is 0 and `descriptors_lost` is
// set, so the receiver can fail that one request instead of the whole channel.
ssize_t receive_record(int socket, std::span<std::byte> buffer, std::span<int> fds,
                       std::size_t& fd_count, bool& descriptors_lost, int flags) noexcept;

}  // namespace moat::wire
