#include "local/seqpacket_channel.hpp"

#include "core/asio_compat.hpp"
#include "core/cancellation.hpp"
#include "core/descriptor_wait.hpp"
#include "wire/fd_passing.hpp"
#include "wire/protocol.hpp"

#include <asio/use_awaitable.hpp>

#include <sys/socket.h>
#include <cerrno>
#include <cstring>
#include <string>

namespace moat {

seqpacket_channel::seqpacket_channel(const asio::any_io_executor& executor, unique_fd socket,
                                     std::size_t max_record)
    // One spare byte: a record that fills the buffer exactly is still recognised as too large
    // through MSG_TRUNC.
    : socket_(executor, socket.release()), buffer_(max_record + 1) {}

result<void> seqpacket_channel::try_send(std::span<const std::byte> record,
                                         std::span<const int> fds) {
    if (!socket_.is_open()) return make_error(errc::backend_failure, "control socket is closed");
    const ssize_t n = wire::send_record(socket_.native_handle(), record, fds, MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(record.size())) return {};
    return make_error(errc::backend_failure,
                      std::string("control socket send: ") + std::strerror(errno));
}

asio::awaitable<result<void>> seqpacket_channel::async_send(std::span<const std::byte> record,
                                                            std::span<const int> fds,
                                                            deadline limit) {
    for (;;) {
        if (!socket_.is_open()) {
            co_return make_error(errc::backend_failure, "control socket is closed");
        }
        const ssize_t n = wire::send_record(socket_.native_handle(), record, fds, MSG_DONTWAIT);
        if (n == static_cast<ssize_t>(record.size())) co_return result<void>{};
        if (n < 0 && errno != EAGAIN) {
            co_return make_error(errc::backend_failure,
                                 std::string("control socket send: ") + std::strerror(errno));
        }
        if (limit.has_expired()) {
            co_return make_error(errc::backend_failure,
                                 "control socket full: the peer is not reading its messages");
        }
        const auto waited =
            co_await async_wait_until(socket_, asio::posix::descriptor_base::wait_write, limit);
        if (waited == wait_result::cancelled) {
            co_return make_error(errc::cancelled, "cancelled before the message was sent");
        }
    }
}

asio::awaitable<result<received_record>> seqpacket_channel::async_receive() {
    for (;;) {
        if (!socket_.is_open()) co_return received_record{};
        int fds[wire::max_fds_per_message];
        std::size_t fd_count = 0;
        bool descriptors_lost = false;
        const ssize_t n = wire::receive_record(socket_.native_handle(), buffer_, fds, fd_count,
                                               descriptors_lost, MSG_DONTWAIT);
        if (n >= 0) {
            received_record record;
            record.descriptors_lost = descriptors_lost;
            record.data.assign(buffer_.begin(), buffer_.begin() + n);
            for (std::size_t i = 0; i < fd_count; ++i) record.fds.emplace_back(fds[i]);
            co_return record;
        }
        if (errno == EMSGSIZE) {
            co_return make_error(errc::protocol_error, "control socket: record too large");
        }
        if (errno == ECONNRESET) co_return received_record{};
        if (errno != EAGAIN) {
            co_return make_error(errc::backend_failure,
                                 std::string("control socket receive: ") + std::strerror(errno));
        }
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            co_return make_error(errc::cancelled, "control socket receive was cancelled");
        }
        auto token = as_tuple(asio::use_awaitable);
        auto [ec] = co_await socket_.async_wait(asio::posix::descriptor_base::wait_read, token);
        if (ec) {
            co_await asio::this_coro::reset_cancellation_state();
            co_return make_error(errc::cancelled, "control socket receive was cancelled");
        }
    }
}

void seqpacket_channel::close() {
    std::error_code ignored;
    socket_.close(ignored);
}

}  // namespace moat
