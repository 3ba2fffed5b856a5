#include "egress/name_resolver.hpp"

#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>

#include "core/async_event.hpp"

#include <ares.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <optional>

namespace moat::egress {

namespace {

using clock = std::chrono::steady_clock;
using addresses = std::vector<asio::ip::address>;

int library_status() {
    static std::once_flag once;
    static int status = ARES_SUCCESS;
    std::call_once(once, [] { status = ares_library_init(ARES_LIB_INIT_ALL); });
    return status;
}

// A lookup waiting for one of its key's slots; `granted` is set when it got one (has_slot) or
// when the resolver closed (it did not).
struct waiter {
    waiter(asio::any_io_executor executor, std::string owner)
        : key(std::move(owner)), granted(std::move(executor)) {}
    std::string key;
    async_event granted;
    bool is_queued = false;
    bool has_slot = false;
};

// Where c-ares' answer lands: shared by the lookup and its query, so that an answer arriving
// after the lookup gave up writes into memory that is still there.
struct answer_state {
    explicit answer_state(asio::any_io_executor executor) : done(std::move(executor)) {}
    async_event done;
    std::optional<result<addresses>> answer;
};

// A socket c-ares asked to have watched. The descriptor does not own the socket (c-ares closes
// it): it is released, never closed, when c-ares stops watching it or the resolver goes.
struct watched_socket {
    explicit watched_socket(asio::any_io_executor executor) : descriptor(std::move(executor)) {}
    ~watched_socket() { (void)descriptor.release(); }
    watched_socket(const watched_socket&) = delete;
    watched_socket& operator=(const watched_socket&) = delete;
    asio::posix::stream_descriptor descriptor;
    bool wants_read = false;
    bool wants_write = false;
    bool is_reading = false;
    bool is_writing = false;
};

std::string why(int status) {
    switch (status) {
        case ARES_ENOTFOUND:
            return "name not found";
        case ARES_ENODATA:
            return "no addresses";
        case ARES_ESERVFAIL:
            return "the DNS server failed";
        case ARES_EREFUSED:
            return "the DNS server refused the query";
        case ARES_ETIMEOUT:
            return "no DNS server answered";
        case ARES_ECONNREFUSED:
            return "could not reach a DNS server";
        case ARES_EBADNAME:
            return "not a valid name";
        case ARES_EBADRESP:
            return "a malformed DNS answer";
        case ARES_EDESTRUCTION:
        case ARES_ECANCELLED:
            return "the resolver was shut down";
        default:
            return ares_strerror(status);
    }
}

result<addresses> to_answer(int status, const ares_addrinfo* info, const std::string& host) {
    if (status != ARES_SUCCESS) {
        return make_error(errc::backend_failure,
                          "could not resolve " + host + " (" + why(status) + ")");
    }
    addresses out;
    for (const auto* node = info != nullptr ? info->nodes : nullptr; node != nullptr;
         node = node->ai_next) {
        asio::ip::address address;
        if (node->ai_family == AF_INET && node->ai_addrlen >= sizeof(sockaddr_in)) {
            sockaddr_in v4{};
            std::memcpy(&v4, node->ai_addr, sizeof v4);
            asio::ip::address_v4::bytes_type bytes{};
            std::memcpy(bytes.data(), &v4.sin_addr, bytes.size());
            address = asio::ip::address_v4(bytes);
        } else if (node->ai_family == AF_INET6 && node->ai_addrlen >= sizeof(sockaddr_in6)) {
            sockaddr_in6 v6{};
            std::memcpy(&v6, node->ai_addr, sizeof v6);
            asio::ip::address_v6::bytes_type bytes{};
            std::memcpy(bytes.data(), &v6.sin6_addr, bytes.size());
            address = asio::ip::address_v6(bytes, v6.sin6_scope_id);
        } else {
            continue;
        }
        if (std::find(out.begin(), out.end(), address) == out.end()) out.push_back(address);
    }
    if (out.empty()) {
        return make_error(errc::backend_failure, "could not resolve " + host + " (no addresses)");
    }
    return out;
}

}  // namespace

struct name_resolver::core : std::enable_shared_from_this<core> {
    core(asio::any_io_executor ex, resolver_options opts)
        : executor(ex), options(std::move(opts)), timer(ex) {}
    core(const core&) = delete;
    core& operator=(const core&) = delete;
    ~core() { close(); }

    struct key_counts {
        std::size_t running = 0;
        std::size_t waiting = 0;
    };

    asio::any_io_executor executor;
    resolver_options options;
    ares_channel channel = nullptr;
    std::string startup_error;
    bool is_closed = false;
    asio::steady_timer timer;
    std::map<ares_socket_t, std::shared_ptr<watched_socket>> sockets;
    std::map<std::string, key_counts, std::less<>> keys;
    std::list<std::shared_ptr<waiter>> queue;  // arrival order, every key
    std::size_t running_total = 0;

    void start() {
        if (const int status = library_status(); status != ARES_SUCCESS) {
            startup_error = std::string("c-ares did not initialise: ") + ares_strerror(status);
            return;
        }
        ares_options settings{};
        int mask = ARES_OPT_SOCK_STATE_CB | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES | ARES_OPT_DOMAINS;
        settings.sock_state_cb = &core::on_socket_state;
        settings.sock_state_cb_data = this;
        settings.timeout = static_cast<int>(std::clamp<std::int64_t>(
            options.attempt_timeout.count(), 1, std::numeric_limits<int>::max()));
        settings.tries = std::max(1, options.tries);
        // No search domains: the name resolved is exactly the name the caller checked.
        settings.domains = nullptr;
        settings.ndomains = 0;
        if (const int status = ares_init_options(&channel, &settings, mask);
            status != ARES_SUCCESS) {
            channel = nullptr;
            startup_error = std::string("c-ares could not start: ") + ares_strerror(status);
            return;
        }
        if (options.servers.empty()) return;
        std::string csv;
        for (const auto& server : options.servers) csv += (csv.empty() ? "" : ",") + server;
        if (const int status = ares_set_servers_ports_csv(channel, csv.c_str());
            status != ARES_SUCCESS) {
            startup_error =
                "the DNS servers \"" + csv + "\" are not addresses (" + ares_strerror(status) + ")";
            ares_destroy(channel);
            channel = nullptr;
        }
    }

    void close() {
        if (is_closed) return;
        is_closed = true;
        for (const auto& w : queue) w->granted.set();  // each leaves the queue itself
        timer.cancel();
        if (channel != nullptr) {
            // Every pending query's callback runs now, with ARES_EDESTRUCTION, and c-ares stops
            // watching (then closes) each of its sockets.
            auto* doomed = channel;
            channel = nullptr;
            ares_destroy(doomed);
        }
        sockets.clear();
    }

    // ---- slots

    bool has_free_slot(const key_counts& counts) const {
        return counts.running < options.max_in_flight_per_key &&
               running_total < options.max_in_flight;
    }

    void release_slot(const std::string& key) {
        auto it = keys.find(key);
        if (it == keys.end() || it->second.running == 0) return;
        --it->second.running;
        --running_total;
        forget_if_idle(it);
        grant();
    }

    void forget_if_idle(std::map<std::string, key_counts, std::less<>>::iterator it) {
        if (it->second.running == 0 && it->second.waiting == 0) keys.erase(it);
    }

    // Gives free slots to waiters, oldest first, skipping the ones whose key is at its limit.
    void grant() {
        if (is_closed) return;
        for (auto it = queue.begin(); it != queue.end() && running_total < options.max_in_flight;) {
            auto& counts = keys[(*it)->key];
            if (counts.running >= options.max_in_flight_per_key) {
                ++it;
                continue;
            }
            ++counts.running;
            ++running_total;
            --counts.waiting;
            (*it)->is_queued = false;
            (*it)->has_slot = true;
            (*it)->granted.set();
            it = queue.erase(it);
        }
    }

    // The lookup `w` ends or starts its query: whatever of the queue or a slot it still holds is
    // given back.
    void leave(waiter& w) {
        if (w.has_slot) {
            w.has_slot = false;
            release_slot(w.key);
        } else if (w.is_queued) {
            w.is_queued = false;
            std::erase_if(queue, [&w](const auto& queued) { return queued.get() == &w; });
            auto it = keys.find(w.key);
            if (it != keys.end()) {
                --it->second.waiting;
                forget_if_idle(it);
            }
        }
    }

    // ---- c-ares on the executor

    static void on_socket_state(void* data, ares_socket_t fd, int readable, int writable) {
        static_cast<core*>(data)->watch(fd, readable != 0, writable != 0);
    }

    void watch(ares_socket_t fd, bool read, bool write) {
        if (!read && !write) {
            sockets.erase(fd);  // released before c-ares closes it
            return;
        }
        auto& entry = sockets[fd];
        if (!entry) {
            entry = std::make_shared<watched_socket>(executor);
            std::error_code ec;
            entry->descriptor.assign(fd, ec);
            if (ec) {
                // Unwatchable: c-ares' own timeout ends the query.
                sockets.erase(fd);
                return;
            }
        }
        entry->wants_read = read;
        entry->wants_write = write;
        arm(fd, entry);
    }

    void arm(ares_socket_t fd, const std::shared_ptr<watched_socket>& entry) {
        if (entry->wants_read && !entry->is_reading) {
            entry->is_reading = true;
            entry->descriptor.async_wait(asio::posix::descriptor_base::wait_read,
                                         ready_handler{weak_from_this(), entry, fd, true});
        }
        if (entry->wants_write && !entry->is_writing) {
            entry->is_writing = true;
            entry->descriptor.async_wait(asio::posix::descriptor_base::wait_write,
                                         ready_handler{weak_from_this(), entry, fd, false});
        }
    }

    struct ready_handler {
        std::weak_ptr<core> owner;
        std::weak_ptr<watched_socket> socket;
        ares_socket_t fd;
        bool is_read;
        void operator()(std::error_code ec) const {
            auto entry = socket.lock();
            if (!entry) return;  // c-ares stopped watching it
            (is_read ? entry->is_reading : entry->is_writing) = false;
            auto self = owner.lock();
            if (!self || ec || self->channel == nullptr) return;
            ares_process_fd(self->channel, is_read ? fd : ARES_SOCKET_BAD,
                            is_read ? ARES_SOCKET_BAD : fd);
            auto it = self->sockets.find(fd);
            if (it != self->sockets.end() && it->second == entry) self->arm(fd, entry);
            self->schedule_timeout();
        }
    };

    // One timer for every query's retransmission and timeout: the earliest c-ares asks for.
    void schedule_timeout() {
        if (channel == nullptr) return;
        timeval wait{};
        if (ares_timeout(channel, nullptr, &wait) == nullptr) {
            timer.cancel();
            return;
        }
        timer.expires_after(std::chrono::seconds(wait.tv_sec) +
                            std::chrono::microseconds(wait.tv_usec));
        timer.async_wait([owner = weak_from_this()](std::error_code ec) {
            auto self = owner.lock();
            if (ec || !self || self->channel == nullptr) return;
            ares_process_fd(self->channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
            self->schedule_timeout();
        });
    }
};

namespace {

using core_ptr = std::shared_ptr<name_resolver::core>;

// A running query, owned by c-ares until its callback (exactly once: answered, out of tries, or
// ARES_EDESTRUCTION): it holds its key's slot until then.
struct pending_query {
    core_ptr owner;
    std::string key;
    std::string host;
    std::shared_ptr<answer_state> state;
    ~pending_query() { owner->release_slot(key); }
};

void on_addrinfo(void* arg, int status, int /*timeouts*/, ares_addrinfo* info) {
    std::unique_ptr<pending_query> query(static_cast<pending_query*>(arg));
    query->state->answer = to_answer(status, info, query->host);
    if (info != nullptr) ares_freeaddrinfo(info);
    query->state->done.set();
}

// Gives back the lookup's place in the queue or its unused slot on every way out, the coroutine
// destroyed mid-wait included.
struct queue_place {
    core_ptr owner;
    std::shared_ptr<waiter> turn;
    ~queue_place() { owner->leave(*turn); }
};

error timed_out(const std::string& host, clock::time_point started, deadline limit) {
    const auto waited =
        std::chrono::round<std::chrono::milliseconds>(limit.when() - started).count();
    return make_error(errc::deadline_exceeded,
                      "resolving " + host + " took longer than " +
                          std::to_string(std::max<std::int64_t>(0, waited)) + " ms");
}

error shut_down(const std::string& host) {
    return make_error(errc::shutting_down,
                      "could not resolve " + host + " (the resolver was shut down)");
}

error cancelled(const std::string& host) {
    return make_error(errc::cancelled, "resolving " + host + " was cancelled");
}

asio::awaitable<result<addresses>> resolve_with(core_ptr c, std::string key, std::string host,
                                                deadline limit) {
    const auto started = clock::now();
    if (host.empty() || host.size() > max_host_name_bytes) {
        co_return make_error(errc::invalid_argument, "could not resolve a host name of " +
                                                         std::to_string(host.size()) +
                                                         " bytes (a name has 1 to 253)");
    }
    if (!c->startup_error.empty()) {
        co_return make_error(errc::backend_failure,
                             "could not resolve " + host + " (" + c->startup_error + ")");
    }
    if (c->is_closed) {
        co_return shut_down(host);
    }

    // 1. One of the key's slots: at once, or after the lookups queued before this one.
    queue_place place{c, std::make_shared<waiter>(c->executor, key)};
    auto& counts = c->keys[key];
    bool is_first_in_line = true;
    for (const auto& queued : c->queue) is_first_in_line = is_first_in_line && queued->key != key;
    if (is_first_in_line && c->has_free_slot(counts)) {
        ++counts.running;
        ++c->running_total;
        place.turn->has_slot = true;
    } else if (counts.waiting >= c->options.max_waiting_per_key) {
        const auto running = counts.running;
        const auto waiting = counts.waiting;
        if (running == 0 && waiting == 0) c->keys.erase(key);
        co_return make_error(errc::limit_exceeded,
                             "resolving " + host + ": key " + key + " has " +
                                 std::to_string(running) + " lookups running and " +
                                 std::to_string(waiting) + " waiting, its limit");
    } else {
        ++counts.waiting;
        place.turn->is_queued = true;
        c->queue.push_back(place.turn);
        const auto outcome = co_await place.turn->granted.async_wait(limit);
        if (outcome == async_event::wait_outcome::cancelled) co_return cancelled(host);
        if (outcome == async_event::wait_outcome::deadline_passed) {
            co_return timed_out(host, started, limit);
        }
        if (!place.turn->has_slot) {
            co_return shut_down(host);
        }
    }

    if (c->is_closed) {  // it closed after granting this lookup its slot
        co_return shut_down(host);
    }
    if (limit.has_expired()) co_return timed_out(host, started, limit);

    // 2. The query: from here its slot belongs to the query, until c-ares ends it.
    auto state = std::make_shared<answer_state>(c->executor);
    place.turn->has_slot = false;
    auto* query = new pending_query{c, key, host, state};
    ares_addrinfo_hints hints{};
    hints.ai_family = AF_UNSPEC;
    ares_getaddrinfo(c->channel, host.c_str(), nullptr, &hints, &on_addrinfo, query);
    c->schedule_timeout();
    if (!state->answer) {
        const auto outcome = co_await state->done.async_wait(limit);
        if (outcome == async_event::wait_outcome::cancelled) co_return cancelled(host);
        if (outcome == async_event::wait_outcome::deadline_passed) {
            co_return timed_out(host, started, limit);
        }
    }
    co_return std::move(*state->answer);
}

}  // namespace

name_resolver::name_resolver(asio::any_io_executor executor, resolver_options options)
    : core_(std::make_shared<core>(std::move(executor), std::move(options))) {
    core_->start();
}

name_resolver::~name_resolver() {
    core_->close();
}

const std::string& name_resolver::startup_error() const noexcept {
    return core_->startup_error;
}

asio::awaitable<result<addresses>> name_resolver::async_resolve(std::string key, std::string host,
                                                                deadline limit) {
    return resolve_with(core_, std::move(key), std::move(host), limit);
}

std::size_t name_resolver::running(const std::string& key) const {
    auto it = core_->keys.find(key);
    return it == core_->keys.end() ? 0 : it->second.running;
}

std::size_t name_resolver::waiting(const std::string& key) const {
    auto it = core_->keys.find(key);
    return it == core_->keys.end() ? 0 : it->second.waiting;
}

}  // namespace moat::egress
