#include "egress/relay.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <utility>
#include <vector>

namespace moat::egress::internal {

namespace {

constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::size_t relay_chunk_bytes = 1024 * 1024;

// The host memory a socket holds: its receive queue and its send queue as the kernel counts them
// (with their bookkeeping overhead), 0 for a closed one.
std::uint64_t socket_memory(int fd) {
    if (fd < 0) return 0;
    std::uint32_t info[SK_MEMINFO_VARS] = {};
    socklen_t length = sizeof info;
    if (::getsockopt(fd, SOL_SOCKET, SO_MEMINFO, info, &length) != 0) return 0;
    return std::uint64_t{info[SK_MEMINFO_RMEM_ALLOC]} + info[SK_MEMINFO_WMEM_QUEUED];
}

std::uint64_t pipe_bytes(const relay_pipe& pipe) {
    int n = 0;
    if (!pipe.read_end.is_open() || ::ioctl(pipe.read_end.get(), FIONREAD, &n) != 0 || n < 0)
        return 0;
    return static_cast<std::uint64_t>(n);
}

// ---- Host memory: each connection's share of max_buffered_bytes --------------------------------
//
// A connection with allotment A gets: its upstream socket A/8 (size_upstream: a window clamp
// while it has the whole of max_connection_buffer_bytes), its sandbox-side socket A/16 (SO_RCVBUF
// and SO_SNDBUF; it keeps autotuning while that covers its namespace's maximum), the kernel
// counting up to twice each number, and each pipe A/8 (rounded down to a power of two): with both
// directions stalled its queues hold at most 2*2*A/8 + 2*2*A/16 + 2*A/8 = A. The sandbox's
// allotments never add up to more than max_buffered_bytes: a new connection's target is
// max_buffered_bytes / (connections open, it included), within [min_connection_buffer_bytes,
// max_connection_buffer_bytes], and every open one moves to that target too, but never below what
// it holds now (queued bytes cannot be taken back, so a stalled connection keeps its share until it
// drains). When the total would pass the cap the new connection gets 429. A lone download gets
// max_connection_buffer_bytes; 32 connections that keep reading get 512 KiB each; a sandbox whose
// tunnels stall is refused new ones once they hold its cap.

// SO_RCVBUF / SO_SNDBUF past net.core.rmem_max / wmem_max where the process may (the FORCE options
// need CAP_NET_ADMIN), else up to them: best effort, a socket the kernel refuses keeps its own.
void set_buffer_sizes(int fd, std::uint64_t bytes) {
    if (fd < 0) return;
    const int size = static_cast<int>(std::min<std::uint64_t>(bytes, 1u << 30));
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
        (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
        (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

int pipe_size_for(std::uint64_t allotment) {
    return static_cast<int>(std::bit_floor(std::max<std::uint64_t>(allotment / 8, 4096)));
}

// A pipe's capacity: best effort (a pipe holding more than the new size keeps its size).
void set_pipe_size(const relay_pipe& pipe, std::uint64_t allotment) {
    if (pipe.write_end.is_open())
        (void)::fcntl(pipe.write_end.get(), F_SETPIPE_SZ, pipe_size_for(allotment));
}

void apply_allotment(connection& c, std::uint64_t allotment) {
    c.allotment = allotment;
    // The sandbox-side socket keeps the kernel's autotuning while its part of the allotment (up
    // to twice A/16 each way) covers what autotuning can reach in the sandbox's namespace:
    // fixed buffers cost a fast relay a few percent. Once fixed it stays fixed (the kernel
    // cannot be handed autotuning back).
    const auto autotune = c.sandbox->limits.sandbox_autotune_bytes;
    const bool covered = autotune != 0 && allotment / 8 >= autotune;
    if (!covered || c.client_fixed) {
        c.client_fixed = true;
        set_buffer_sizes(c.client.native_handle(), allotment / 16);
    }
    size_upstream(c);
    set_pipe_size(c.to_upstream, allotment);
    set_pipe_size(c.to_sandbox, allotment);
}

// What each connection of `sandbox` should get with `open` of them (the new one included).
std::uint64_t target_allotment(const egress_limits& limits, std::size_t open) {
    const std::uint64_t even = limits.max_buffered_bytes / std::max<std::size_t>(open, 1);
    return std::clamp(
        even, limits.min_connection_buffer_bytes,
        std::max(limits.min_connection_buffer_bytes, limits.max_connection_buffer_bytes));
}

// After a connection went: the others grow back to the even share.
void regrow(sandbox_entry& sandbox) {
    if (sandbox.connections.empty()) return;
    const auto target = target_allotment(sandbox.limits, sandbox.connections.size());
    for (auto* c : sandbox.connections) {
        if (c->allotment < target) apply_allotment(*c, target);
    }
}

}  // namespace

connection::~connection() {
    sandbox->connections.erase(this);
    regrow(*sandbox);
}

std::uint64_t buffered_bytes(connection& c) {
    return socket_memory(c.client.native_handle()) + socket_memory(c.upstream.native_handle()) +
           pipe_bytes(c.to_upstream) + pipe_bytes(c.to_sandbox);
}

std::uint64_t publish_buffered(sandbox_entry& sandbox) {
    std::uint64_t total = 0;
    for (auto* c : sandbox.connections) total += buffered_bytes(*c);
    sandbox.meter->add_buffered(static_cast<std::int64_t>(total) -
                                static_cast<std::int64_t>(sandbox.published_buffered));
    sandbox.published_buffered = total;
    return total;
}

// The upstream socket. At its full allotment (a lone connection) what it receives is bounded by
// the window it may offer (TCP_WINDOW_CLAMP: what arrives unread stays under about the clamp,
// twice that as the kernel counts it), which leaves the kernel's receive autotuning in place: a
// fixed SO_RCVBUF costs a fast download a few percent. A clamp is not enforced at once when it
// shrinks (a window already offered is honoured), so a connection whose allotment shrinks gets
// fixed buffers too, for good. What it sends always gets a fixed SO_SNDBUF.
void size_upstream(connection& c) {
    const int fd = c.upstream.native_handle();
    if (fd < 0) return;
    const std::uint64_t bytes = c.allotment / 8;
    if (c.allotment < c.sandbox->limits.max_connection_buffer_bytes || c.upstream_fixed) {
        c.upstream_fixed = true;
        set_buffer_sizes(fd, bytes);
        return;
    }
    const int size = static_cast<int>(std::min<std::uint64_t>(bytes, 1u << 30));
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_WINDOW_CLAMP, &size, sizeof size);
    if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
        (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

bool allot(sandbox_entry& sandbox, connection& incoming, std::uint64_t& held_now) {
    const auto target = target_allotment(sandbox.limits, sandbox.connections.size() + 1);
    std::uint64_t total = target;
    held_now = 0;
    std::vector<std::pair<connection*, std::uint64_t>> moved;
    for (auto* c : sandbox.connections) {
        const std::uint64_t held = buffered_bytes(*c);
        held_now += held;
        const std::uint64_t next = std::max(target, held);
        total += next;
        moved.emplace_back(c, next);
    }
    if (total > sandbox.limits.max_buffered_bytes) return false;
    for (auto& [c, next] : moved) {
        if (next != c->allotment) apply_allotment(*c, next);
    }
    apply_allotment(incoming, target);
    return true;
}

bool charge(connection& c, std::size_t n, std::uint64_t& counter) {
    auto& sandbox = *c.sandbox;
    if (!sandbox.meter->try_charge(n, sandbox.limits.max_bytes)) {
        c.close("byte budget");
        return false;
    }
    counter += n;
    c.last_activity = clock::now();
    return true;
}

namespace {

// One direction of a relay through a pipe with splice(2): the kernel moves the pages from one
// socket to the other, nothing is copied through this process. Each step is non-blocking and
// waits for readiness on the executor. The sandbox's byte budget is charged before bytes leave
// the pipe: a direction forwards at most what is left of it, and one byte past it closes the
// connection. A descriptor splice refuses closes the connection ("reset").
template <class From, class To>
asio::awaitable<void> pump(std::shared_ptr<connection> c, From& from, To& to, relay_pipe& pipe,
                           std::uint64_t& counter) {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0) {
        c->close("reset");
        co_return;
    }
    pipe.read_end.reset(ends[0]);
    pipe.write_end.reset(ends[1]);
    const int pipe_out = ends[0];
    const int pipe_in = ends[1];
    set_pipe_size(pipe, c->allotment);
    std::error_code ec;
    from.native_non_blocking(true, ec);
    if (!ec) to.native_non_blocking(true, ec);
    if (ec) {
        c->close("reset");
        co_return;
    }
    while (!c->is_closed) {
        auto& sandbox = *c->sandbox;
        const std::uint64_t used = sandbox.meter->used();
        const std::uint64_t left =
            used < sandbox.limits.max_bytes ? sandbox.limits.max_bytes - used : 0;
        // At the budget, one more byte in shows the connection would pass it.
        const std::size_t want =
            left == 0 ? 1
                      : static_cast<std::size_t>(std::min<std::uint64_t>(relay_chunk_bytes, left));
        const ssize_t in = ::splice(from.native_handle(), nullptr, pipe_in, nullptr, want,
                                    SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (in < 0 && errno == EINTR) continue;
        if (in < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            auto [wait_error] = co_await from.async_wait(asio::socket_base::wait_read, use_tuple);
            if (wait_error) {
                c->close(wait_error == asio::error::operation_aborted ? c->close_reason : "reset");
                co_return;
            }
            continue;
        }
        if (in < 0) {
            c->close("reset");
            co_return;
        }
        if (in == 0) {  // the sender is done: pass the end on
            std::error_code ignored;
            to.shutdown(asio::socket_base::shutdown_send, ignored);
            co_return;
        }
        if (!charge(*c, static_cast<std::size_t>(in), counter)) co_return;
        std::size_t pending = static_cast<std::size_t>(in);
        while (pending > 0 && !c->is_closed) {
            const ssize_t out = ::splice(pipe_out, nullptr, to.native_handle(), nullptr, pending,
                                         SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
            if (out < 0 && errno == EINTR) continue;
            if (out < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                auto [wait_error] =
                    co_await to.async_wait(asio::socket_base::wait_write, use_tuple);
                if (wait_error) {
                    c->close(wait_error == asio::error::operation_aborted ? c->close_reason
                                                                          : "write failed");
                    co_return;
                }
                continue;
            }
            if (out <= 0) {
                c->close("write failed");
                co_return;
            }
            pending -= static_cast<std::size_t>(out);
            c->last_activity = clock::now();
        }
    }
    co_return;
}

}  // namespace

asio::awaitable<void> relay(std::shared_ptr<connection> c) {
    using namespace asio::experimental::awaitable_operators;
    auto up = pump(c, c->client, c->upstream, c->to_upstream, c->bytes_out);
    auto down = pump(c, c->upstream, c->client, c->to_sandbox, c->bytes_in);
    auto both = std::move(up) && std::move(down);
    co_await std::move(both);
}

}  // namespace moat::egress::internal
