#include "http/connection_pool.hpp"

#include "core/asio_compat.hpp"

#include <asio/connect.hpp>
#include <asio/ip/address.hpp>
#include <asio/read.hpp>
#include <asio/ssl/error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>

namespace moat::http {
namespace {

constexpr auto use_tuple = as_tuple(asio::use_awaitable);

}  // namespace

std::string describe_socket_error(const std::error_code& ec) {
    if (ec == asio::error::connection_refused) return "connection refused";
    if (ec == asio::error::connection_reset) return "connection reset";
    if (ec == asio::error::eof) return "the peer closed the connection";
    if (ec == asio::error::host_unreachable || ec == asio::error::network_unreachable) {
        return "unreachable";
    }
    return ec.message();
}

std::string origin::to_string() const {
    std::string out = is_tls ? "https://" : "http://";
    if (host.find(':') != std::string::npos) {
        out += '[' + host + ']';
    } else {
        out += host;
    }
    out += ':' + std::to_string(port);
    return out;
}

pooled_connection::~pooled_connection() = default;

connection_watchdog::connection_watchdog(const asio::any_io_executor& executor)
    : timer_(executor) {}

void connection_watchdog::arm(deadline limit, std::weak_ptr<pooled_connection> connection) {
    ++state_->generation;
    state_->timed_out = false;
    if (limit.is_never()) {
        timer_.cancel();
        return;
    }
    timer_.expires_at(limit.when());
    // A completion handler, not a coroutine: it holds the connection weakly and ignores a wait
    // that was replaced (re-armed) or cancelled.
    timer_.async_wait([weak = std::move(connection), state = std::weak_ptr<state>(state_),
                       generation = state_->generation](const std::error_code& ec) {
        if (ec) return;
        const auto self = weak.lock();
        const auto watched = state.lock();
        if (!self || !watched || watched->generation != generation) return;
        watched->timed_out = true;
        self->close();
    });
}

void connection_watchdog::disarm() {
    ++state_->generation;
    timer_.cancel();
}

client_connection::client_connection(asio::any_io_executor executor, origin where,
                                     std::shared_ptr<asio::ssl::context> tls)
    : executor_(executor),
      origin_(std::move(where)),
      tls_context_(std::move(tls)),
      resolver_(executor),
      plain_(executor),
      watchdog_(executor_) {
    if (tls_context_) tls_ = std::make_unique<tls_stream>(executor, *tls_context_);
}

client_connection::~client_connection() {
    close();
}

asio::ip::tcp::socket& client_connection::socket() noexcept {
    if (tls_) return tls_->next_layer();
    return plain_;
}

bool client_connection::is_open() const noexcept {
    if (tls_) return tls_->next_layer().is_open();
    return plain_.is_open();
}

void client_connection::close() noexcept {
    std::error_code ignored;
    resolver_.cancel();
    socket().shutdown(asio::socket_base::shutdown_both, ignored);
    socket().close(ignored);
}

void client_connection::arm(deadline limit) {
    watchdog_.arm(limit, weak_from_this());
}

void client_connection::disarm() {
    watchdog_.disarm();
}

bool client_connection::is_reusable() const noexcept {
    if (!is_open() || timed_out()) return false;
    const int fd = const_cast<client_connection*>(this)->socket().native_handle();
    char byte = 0;
    const auto n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    // 0: the peer closed; > 0: bytes nobody asked for (a broken peer); EAGAIN: idle and open.
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

asio::awaitable<result<void>> client_connection::async_open(bool loopback_only) {
    const auto where = origin_.to_string();
    const auto port = std::to_string(origin_.port);
    auto resolved = co_await resolver_.async_resolve(origin_.host, port, use_tuple);
    auto& [resolve_error, results] = resolved;
    if (timed_out()) {
        co_return make_error(errc::deadline_exceeded,
                             "the deadline passed resolving " + origin_.host);
    }
    if (resolve_error) {
        co_return make_error(errc::invalid_argument,
                             "cannot resolve " + origin_.host + ": " + resolve_error.message());
    }
    std::vector<asio::ip::tcp::endpoint> endpoints;
    for (const auto& entry : results) {
        if (loopback_only && !entry.endpoint().address().is_loopback()) continue;
        endpoints.push_back(entry.endpoint());
    }
    if (endpoints.empty()) {
        co_return make_error(errc::invalid_argument,
                             origin_.host +
                                 " resolves to no loopback address (plain http:// is "
                                 "allowed only to loopback unless the host is opted in)");
    }
    auto connected = co_await asio::async_connect(socket(), endpoints, use_tuple);
    const auto connect_error = std::get<0>(connected);
    if (timed_out())
        co_return make_error(errc::deadline_exceeded, "the deadline passed connecting to " + where);
    if (connect_error) {
        co_return make_error(errc::backend_failure,
                             "connect to " + where + ": " + describe_socket_error(connect_error));
    }
    std::error_code ignored;
    socket().set_option(asio::ip::tcp::no_delay(true), ignored);
    if (!tls_) co_return result<void>{};

    if (auto prepared = prepare_client_stream(*tls_, origin_.host); !prepared) {
        co_return prepared.error();
    }
    auto handshake = co_await tls_->async_handshake(asio::ssl::stream_base::client, use_tuple);
    const auto handshake_error = std::get<0>(handshake);
    if (timed_out()) {
        co_return make_error(errc::deadline_exceeded,
                             "the deadline passed in the TLS handshake with " + where);
    }
    if (handshake_error) {
        co_return make_error(errc::backend_failure,
                             "TLS handshake with " + where + ": " +
                                 describe_handshake_failure(*tls_, handshake_error));
    }
    co_return result<void>{};
}

asio::awaitable<std::tuple<std::error_code, std::size_t>> client_connection::async_read_some(
    asio::mutable_buffer into) {
    if (timed_out()) co_return std::tuple{asio::error::timed_out, std::size_t{0}};
    std::tuple<std::error_code, std::size_t> outcome;
    if (tls_) {
        outcome = co_await tls_->async_read_some(into, use_tuple);
    } else {
        outcome = co_await plain_.async_read_some(into, use_tuple);
    }
    if (timed_out()) std::get<0>(outcome) = asio::error::timed_out;
    co_return outcome;
}

asio::awaitable<std::error_code> client_connection::async_write(
    std::array<asio::const_buffer, 3> buffers) {
    if (timed_out()) co_return asio::error::timed_out;
    std::tuple<std::error_code, std::size_t> outcome;
    if (tls_) {
        outcome = co_await asio::async_write(*tls_, buffers, use_tuple);
    } else {
        outcome = co_await asio::async_write(plain_, buffers, use_tuple);
    }
    if (timed_out()) co_return asio::error::timed_out;
    co_return std::get<0>(outcome);
}

// --- the pool ---

// A lease waiting for a connection: a node of its key's intrusive list, in the waiting
// coroutine's frame. Woken by cancelling its timer. Unlinks itself however the frame ends, and
// passes on a wake it did not use.
struct pool_waiter {
    pool_waiter* prev = nullptr;
    pool_waiter* next = nullptr;
    asio::steady_timer* timer = nullptr;
    lease_kind kind = lease_kind::call;
    bool woken = false;
};

struct pooled_origin {
    std::string key;
    std::vector<std::shared_ptr<pooled_connection>> idle;
    std::size_t calls = 0;    // busy short-call leases (and ones being opened)
    std::size_t streams = 0;  // busy stream leases
    bool is_dropped = false;
    pool_waiter* first = nullptr;  // oldest first
    pool_waiter* last = nullptr;

    bool is_empty() const noexcept { return idle.empty() && calls == 0 && streams == 0 && !first; }

    void link(pool_waiter& w) noexcept {
        w.prev = last;
        if (last) {
            last->next = &w;
        } else {
            first = &w;
        }
        last = &w;
    }
    void unlink(pool_waiter& w) noexcept {
        if (w.prev) {
            w.prev->next = w.next;
        } else {
            first = w.next;
        }
        if (w.next) {
            w.next->prev = w.prev;
        } else {
            last = w.prev;
        }
        w.prev = w.next = nullptr;
    }
    void wake_all() noexcept {
        for (auto* w = first; w; w = w->next) {
            if (w->woken) continue;
            w->woken = true;
            w->timer->cancel();
        }
    }
    void wake_one(lease_kind kind) noexcept {
        for (auto* w = first; w; w = w->next) {
            if (w->woken || w->kind != kind) continue;
            w->woken = true;
            w->timer->cancel();
            return;
        }
    }
};

struct connection_pool::impl : std::enable_shared_from_this<impl> {
    impl(asio::any_io_executor on, pool_options o)
        : executor(std::move(on)), options(o), sweeper(executor) {}

    asio::any_io_executor executor;
    pool_options options;
    std::map<std::string, std::shared_ptr<pooled_origin>, std::less<>> origins;
    std::uint64_t opened = 0;
    asio::steady_timer sweeper;
    bool is_sweep_armed = false;

    std::shared_ptr<pooled_origin> slot(const std::string& key) {
        auto& s = origins[key];
        if (!s) {
            s = std::make_shared<pooled_origin>();
            s->key = key;
        }
        return s;
    }

    void forget_if_empty(const pooled_origin& s) {
        if (!s.is_empty()) return;
        const auto it = origins.find(s.key);
        if (it != origins.end() && it->second.get() == &s) origins.erase(it);
    }

    bool has_call_room(const pooled_origin& s) const noexcept {
        return s.calls + s.idle.size() < options.max_per_origin;
    }

    // Past idle_timeout, or no longer reusable (the peer closed it, or sent something).
    bool is_stale(const pooled_connection& c, std::chrono::steady_clock::time_point now) const {
        const bool is_fresh = !has_idle_timeout() || now - c.idle_since_ < options.idle_timeout;
        return !is_fresh || !c.is_reusable();
    }

    // Closes the key's stale idle connections.
    void close_stale(pooled_origin& s, std::chrono::steady_clock::time_point now) {
        const auto stale = [&](const std::shared_ptr<pooled_connection>& c) {
            if (!is_stale(*c, now)) return false;
            c->close();
            return true;
        };
        if (std::erase_if(s.idle, stale) != 0) s.wake_one(lease_kind::call);
    }

    bool has_idle_timeout() const noexcept { return options.idle_timeout.count() > 0; }

    void arm_sweep() {
        if (is_sweep_armed || !has_idle_timeout()) return;
        std::optional<std::chrono::steady_clock::time_point> oldest;
        for (const auto& [key, s] : origins) {
            for (const auto& c : s->idle) {
                if (!oldest || c->idle_since_ < *oldest) oldest = c->idle_since_;
            }
        }
        if (!oldest) return;
        is_sweep_armed = true;
        sweeper.expires_at(*oldest + options.idle_timeout);
        sweeper.async_wait([weak = weak_from_this()](const std::error_code& ec) {
            const auto self = weak.lock();
            if (!self) return;
            self->is_sweep_armed = false;
            if (ec) return;
            self->sweep();
        });
    }

    void sweep() {
        const auto now = std::chrono::steady_clock::now();
        std::vector<std::shared_ptr<pooled_origin>> all;
        for (const auto& [key, s] : origins) all.push_back(s);
        for (const auto& s : all) {
            close_stale(*s, now);
            forget_if_empty(*s);
        }
        arm_sweep();
    }

    void cancel_sweep() {
        if (!is_sweep_armed) return;
        is_sweep_armed = false;
        sweeper.cancel();
    }

    void close_idle_of(pooled_origin& s) {
        for (auto& c : s.idle) c->close();
        const bool had_idle = !s.idle.empty();
        s.idle.clear();
        if (had_idle) s.wake_one(lease_kind::call);
    }
};

connection_pool::connection_pool(asio::any_io_executor executor, pool_options options) {
    if (options.max_per_origin == 0) options.max_per_origin = 1;
    if (options.max_streams_per_origin == 0) options.max_streams_per_origin = 1;
    impl_ = std::make_shared<impl>(std::move(executor), options);
}

connection_pool::~connection_pool() {
    close_idle();
}

std::uint64_t connection_pool::connections_opened() const noexcept {
    return impl_->opened;
}

std::size_t connection_pool::idle_count() const noexcept {
    std::size_t n = 0;
    for (const auto& [key, s] : impl_->origins) n += s->idle.size();
    return n;
}

std::size_t connection_pool::origin_count() const noexcept {
    return impl_->origins.size();
}

void connection_pool::close_idle() noexcept {
    auto& p = *impl_;
    p.cancel_sweep();
    std::vector<std::shared_ptr<pooled_origin>> all;
    for (const auto& [key, s] : p.origins) all.push_back(s);
    for (const auto& s : all) {
        p.close_idle_of(*s);
        p.forget_if_empty(*s);
    }
}

void connection_pool::drop_origin(const std::string& key) noexcept {
    auto& p = *impl_;
    const auto it = p.origins.find(key);
    if (it == p.origins.end()) return;
    const auto s = it->second;
    s->is_dropped = true;
    p.close_idle_of(*s);
    p.origins.erase(it);
    s->wake_all();  // they look again, under a fresh state for the key
}

asio::awaitable<result<connection_pool::lease>> connection_pool::async_acquire(
    acquire_request request) {
    // The pool is held for the whole wait: a release or a sweep can then never see it gone.
    const auto p = impl_;
    for (;;) {
        const auto s = p->slot(request.key);
        auto& budget = request.kind == lease_kind::call ? s->calls : s->streams;
        const auto now = std::chrono::steady_clock::now();
        while (!s->idle.empty()) {
            auto taken = std::move(s->idle.back());
            s->idle.pop_back();
            if (p->is_stale(*taken, now)) {
                taken->close();
                continue;
            }
            taken->kind_ = request.kind;
            ++budget;
            // A stream taking an idle connection leaves room in the call budget.
            if (request.kind == lease_kind::stream) s->wake_one(lease_kind::call);
            co_return lease{std::move(taken), true};
        }
        const bool has_room = request.kind == lease_kind::call
                                  ? p->has_call_room(*s)
                                  : s->streams < p->options.max_streams_per_origin;
        if (has_room) {
            auto fresh = request.make();
            fresh->origin_ = s;
            fresh->kind_ = request.kind;
            ++budget;
            ++p->opened;
            co_return lease{std::move(fresh), false};
        }
        if (request.limit.has_expired()) {
            const auto cap = request.kind == lease_kind::call ? p->options.max_per_origin
                                                              : p->options.max_streams_per_origin;
            p->forget_if_empty(*s);
            co_return make_error(errc::deadline_exceeded,
                                 "the deadline passed waiting for " + request.what +
                                     " (the pool is at its cap of " + std::to_string(cap) + ")");
        }
        // Wait for a release. The node unlinks itself whatever ends the wait (a cancellation, or
        // the frame destroyed while suspended); a wake it got but did not use is passed on.
        // On the waiting coroutine's executor: its frame owns the wait.
        auto on = co_await asio::this_coro::executor;
        asio::steady_timer timer(on, request.limit.when());
        struct registration {
            std::shared_ptr<pooled_origin> at;
            pool_waiter node;
            ~registration() {
                at->unlink(node);
                if (node.woken) at->wake_one(node.kind);
            }
        };
        bool is_cancelled = false;
        {
            registration me{s, pool_waiter{}};
            me.node.timer = &timer;
            me.node.kind = request.kind;
            s->link(me.node);
            auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
            if (me.node.woken) {
                me.node.woken = false;  // used: this lease looks again
                continue;
            }
            is_cancelled = ec == asio::error::operation_aborted;
        }
        if (is_cancelled) {
            p->forget_if_empty(*s);
            co_return make_error(errc::cancelled, "cancelled waiting for " + request.what);
        }
    }
}

void connection_pool::hand_over(pooled_connection& from, pooled_connection& to) noexcept {
    to.origin_ = std::move(from.origin_);
    to.kind_ = from.kind_;
    from.origin_.reset();
    from.close();
}

void connection_pool::release(std::shared_ptr<pooled_connection> connection,
                              bool reusable) noexcept {
    if (!connection) return;
    const auto s = connection->origin_.lock();
    if (!s) {
        connection->close();
        return;
    }
    const auto kind = connection->kind_;
    auto& budget = kind == lease_kind::call ? s->calls : s->streams;
    if (budget > 0) --budget;
    auto& p = *impl_;
    const bool keep =
        reusable && !s->is_dropped && p.has_call_room(*s) && connection->is_reusable();
    if (keep) {
        connection->idle_since_ = std::chrono::steady_clock::now();
        s->idle.push_back(std::move(connection));
        s->wake_one(lease_kind::call);
        s->wake_one(lease_kind::stream);
        p.arm_sweep();
        return;
    }
    connection->close();
    connection->origin_.reset();
    s->wake_one(kind);
    p.forget_if_empty(*s);
}

}  // namespace moat::http
