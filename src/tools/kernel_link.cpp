#include "tools/kernel_link.hpp"

#include "core/asio_compat.hpp"

#include <asio/buffer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <utility>

namespace moat {

namespace {

// The most read from a direct connection at once (the relay reads 64 KiB too).
constexpr std::size_t read_size = 64 * 1024;

}  // namespace

kernel_link::kernel_link(process relay) : relay_(std::move(relay)) {}

kernel_link::kernel_link(asio::local::stream_protocol::socket direct) : direct_(std::move(direct)) {
    std::error_code ignored;
    direct_->non_blocking(true, ignored);
}

kernel_link::kernel_link(kernel_link&&) noexcept = default;
kernel_link& kernel_link::operator=(kernel_link&&) noexcept = default;
kernel_link::~kernel_link() = default;

asio::awaitable<result<std::variant<output_chunk, exec_result>>> kernel_link::async_next() {
    using next = std::variant<output_chunk, exec_result>;
    if (relay_) co_return co_await relay_->async_next();
    if (ended_ || !direct_ || !direct_->is_open()) co_return next(exec_result{});
    std::string data(read_size, '\0');
    for (;;) {
        // Wait, then read what is there: a wait can be cancelled without losing a byte.
        auto [waited] = co_await direct_->async_wait(
            asio::local::stream_protocol::socket::wait_read, as_tuple(asio::use_awaitable));
        if (waited == asio::error::operation_aborted) {
            co_return make_error(errc::cancelled, "cancelled while reading from the interpreter");
        }
        std::error_code read_error;
        const auto n = direct_->read_some(asio::buffer(data), read_error);
        if (read_error == asio::error::would_block || read_error == asio::error::try_again) {
            continue;
        }
        if (read_error || n == 0) {
            ended_ = true;  // the supervisor closed the connection (or reset it)
            co_return next(exec_result{});
        }
        data.resize(n);
        co_return next(output_chunk{output_channel::out, std::move(data)});
    }
}

void kernel_link::close() noexcept {
    relay_.reset();  // a process dropped before its end is killed
    if (direct_) {
        std::error_code ignored;
        direct_->close(ignored);
    }
    ended_ = true;
}

asio::awaitable<result<void>> kernel_link::async_write(std::string bytes) {
    if (relay_) co_return co_await relay_->async_write_stdin(std::move(bytes));
    if (!direct_ || !direct_->is_open()) {
        co_return make_error(errc::backend_failure, "the interpreter's connection is closed");
    }
    auto [written, n] =
        co_await asio::async_write(*direct_, asio::buffer(bytes), as_tuple(asio::use_awaitable));
    (void)n;
    if (written == asio::error::operation_aborted) {
        co_return make_error(errc::cancelled, "cancelled while writing to the interpreter");
    }
    if (written) {
        co_return make_error(errc::backend_failure,
                             "writing to the interpreter: " + written.message());
    }
    co_return result<void>{};
}

}  // namespace moat
