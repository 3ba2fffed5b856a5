// One end of a SOCK_SEQPACKET socket on an Asio executor: whole records in, whole records out,
// with descriptors attached. Used for both the helper's and each agent's control socket.
#pragma once

#include <moat/deadline.hpp>
#include <moat/result.hpp>

#include "core/unique_fd.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace moat {

struct received_record {
    std::vector<std::byte> data;  // empty at end of stream
    std::vector<unique_fd> fds;
    // The record came with descriptors that could not be received (this process had none free);
    // `fds` is empty then.
    bool descriptors_lost = false;
};

class seqpacket_channel {
  public:
    // `max_record`: the largest record accepted from the peer (larger ones are protocol errors).
    seqpacket_channel(const asio::any_io_executor& executor, unique_fd socket,
                      std::size_t max_record);

    // Sends one record; waits while the socket buffer is full, until `limit` (then
    // backend_failure: the peer is not reading). Cancellation: terminal; a record is either sent
    // whole or not at all.
    asio::awaitable<result<void>> async_send(std::span<const std::byte> record,
                                             std::span<const int> fds, deadline limit);

    // Sends without waiting; fails with backend_failure if the buffer is full. For small records
    // that must go out from non-coroutine code (kill on destruction).
    result<void> try_send(std::span<const std::byte> record, std::span<const int> fds = {});

    // Receives the next record; an empty record means the peer closed. Errors: protocol_error for a
    // record over max_record bytes. Cancellation: terminal.
    asio::awaitable<result<received_record>> async_receive();

    void close();
    bool is_open() const { return socket_.is_open(); }

  private:
    asio::posix::stream_descriptor socket_;
    std::vector<std::byte> buffer_;
};

}  // namespace moat
