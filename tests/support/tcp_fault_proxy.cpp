#include "support/tcp_fault_proxy.hpp"

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

namespace moat::test {
namespace {

using asio::ip::tcp;
constexpr auto token = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::size_t buffer_bytes = 16 * 1024;

// The request line at the start of `data` ("GET /x HTTP/1.1"), or "" if `data` does not start
// one.
std::string request_line(const std::string& data) {
    std::size_t i = 0;
    while (i < data.size() && data[i] >= 'A' && data[i] <= 'Z') ++i;
    if (i == 0 || i > 16 || i >= data.size() || data[i] != ' ') return "";
    const std::size_t end = data.find("\r\n");
    if (end == std::string::npos) return "";
    std::string line = data.substr(0, end);
    if (line.find(" HTTP/1.") == std::string::npos) return "";
    return line;
}

bool starts_with_icase(const std::string& s, std::size_t at, const char* prefix) {
    for (std::size_t k = 0; prefix[k] != 0; ++k) {
        if (at + k >= s.size()) return false;
        char c = s[at + k];
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
        if (c != prefix[k]) return false;
    }
    return true;
}

// Replaces the Host header's value in the head at the start of `data` (if the whole head is there).
void rewrite_host(std::string& data, const std::string& host) {
    const std::size_t head_end = data.find("\r\n\r\n");
    if (head_end == std::string::npos) return;
    std::size_t line = data.find("\r\n");
    while (line != std::string::npos && line < head_end) {
        const std::size_t start = line + 2;
        const std::size_t end = data.find("\r\n", start);
        if (starts_with_icase(data, start, "host:")) {
            data.replace(start, end - start, "Host: " + host);
            return;
        }
        line = end;
    }
}

struct connection {
    explicit connection(tcp::socket accepted)
        : client(std::move(accepted)), upstream(client.get_executor()) {}
    tcp::socket client;
    tcp::socket upstream;
    // The fault bound to the response in flight, and how far it has counted.
    std::optional<tcp_fault_proxy::fault> bound;
    std::size_t counted = 0;
    bool head_done = false;
    std::string head_tail;
    // A stall_after() in force since resume generation `stall_generation`.
    bool stalled = false;
    std::uint64_t stall_generation = 0;
    // A canned answer was sent: what the client still sends is discarded.
    bool answered = false;
    bool closed = false;
};

struct log_escape {
    void operator()(std::exception_ptr e) const {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& x) {
            std::fprintf(stderr, "tcp_fault_proxy: a connection task threw: %s\n", x.what());
        } catch (...) {
            std::fprintf(stderr, "tcp_fault_proxy: a connection task threw\n");
        }
    }
};

}  // namespace

struct tcp_fault_proxy::state {
    asio::io_context io;
    tcp::acceptor acceptor{io};
    tcp::endpoint upstream;
    std::string upstream_host_port;
    asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};

    std::mutex mutex;  // guards armed
    std::deque<std::pair<fault, int>> armed;

    std::atomic<bool> stopping{false};
    std::atomic<bool> stalled{false};
    std::atomic<std::uint64_t> resume_generation{0};
    std::atomic<std::uint64_t> fired{0};
    std::atomic<std::uint64_t> accepted{0};
    std::atomic<std::uint64_t> requests{0};
    std::atomic<std::size_t> open{0};
    std::atomic<std::size_t> delaying{0};
    std::atomic<std::size_t> peak_delaying{0};
    std::atomic<bool> finished{false};

    // The io thread's only.
    std::set<std::shared_ptr<connection>> connections;

    std::optional<fault> take_fault(const std::string& line) {
        std::lock_guard lock(mutex);
        for (auto it = armed.begin(); it != armed.end(); ++it) {
            if (!it->first.match.empty() && line.find(it->first.match) == std::string::npos) {
                continue;
            }
            fault f = it->first;
            if (--it->second <= 0) armed.erase(it);
            return f;
        }
        return std::nullopt;
    }

    void close(const std::shared_ptr<connection>& c, bool reset) {
        if (c->closed) return;
        c->closed = true;
        std::error_code ignored;
        if (reset) c->client.set_option(asio::socket_base::linger(true, 0), ignored);
        c->client.close(ignored);
        c->upstream.close(ignored);
        if (connections.erase(c) > 0) --open;
    }

    bool is_stalled(const connection& c, bool downstream) const {
        if (stalled) return true;
        return downstream && c.stalled && c.stall_generation == resume_generation.load();
    }
};

namespace {

using state = tcp_fault_proxy::state;

asio::awaitable<void> wait_while_stalled(state* s, std::shared_ptr<connection> c, bool downstream) {
    asio::steady_timer timer(s->io);
    while (!s->stopping && !c->closed && s->is_stalled(*c, downstream)) {
        timer.expires_after(std::chrono::milliseconds(5));
        auto [ec] = co_await timer.async_wait(token);
        (void)ec;
    }
}

asio::awaitable<bool> write_all(tcp::socket& socket, std::string_view data) {
    if (data.empty()) co_return true;
    auto buffer = asio::buffer(data.data(), data.size());
    auto [ec, n] = co_await asio::async_write(socket, buffer, token);
    (void)n;
    co_return !ec;
}

// Client to upstream: recognises requests, binds faults, answers canned responses.
asio::awaitable<void> pump_up(state* s, std::shared_ptr<connection> c) {
    std::array<char, buffer_bytes> buffer{};
    for (;;) {
        auto target = asio::buffer(buffer);
        auto [ec, n] = co_await c->client.async_read_some(target, token);
        if (ec) break;
        if (c->answered) continue;
        std::string data(buffer.data(), n);
        co_await wait_while_stalled(s, c, false);
        if (c->closed) break;
        const std::string line = request_line(data);
        if (!line.empty()) {
            ++s->requests;
            rewrite_host(data, s->upstream_host_port);
            std::optional<tcp_fault_proxy::fault> f = s->take_fault(line);
            if (f && f->kind == tcp_fault_proxy::fault_kind::answer) {
                ++s->fired;
                c->answered = true;
                const bool written = co_await write_all(c->client, f->bytes);
                std::error_code ignored;
                c->client.shutdown(tcp::socket::shutdown_send, ignored);
                if (!written) break;
                continue;  // discard until the client closes
            }
            c->bound = std::move(f);
            c->counted = 0;
            c->head_done = false;
            c->head_tail.clear();
        }
        if (!co_await write_all(c->upstream, data)) break;
    }
    s->close(c, false);
}

// Upstream to client: applies the bound fault.
asio::awaitable<void> pump_down(state* s, std::shared_ptr<connection> c) {
    std::array<char, buffer_bytes> buffer{};
    for (;;) {
        auto target = asio::buffer(buffer);
        auto [ec, n] = co_await c->upstream.async_read_some(target, token);
        if (ec) break;
        std::string data(buffer.data(), n);
        co_await wait_while_stalled(s, c, true);
        if (c->closed) break;
        if (!c->bound) {
            if (!co_await write_all(c->client, data)) break;
            continue;
        }
        const tcp_fault_proxy::fault f = *c->bound;
        std::size_t start = 0;  // where counting starts in `data`
        if (f.from_body && !c->head_done) {
            const std::string combined = c->head_tail + data;
            const std::size_t end = combined.find("\r\n\r\n");
            if (end == std::string::npos) {
                c->head_tail =
                    combined.size() > 3 ? combined.substr(combined.size() - 3) : combined;
                start = data.size();
            } else {
                c->head_done = true;
                start = end + 4 - c->head_tail.size();
            }
        }
        const bool counting = !f.from_body || c->head_done;
        const std::size_t remaining = f.after_bytes - c->counted;
        if (!counting || start + remaining > data.size()) {
            c->counted += data.size() - start;
            if (!co_await write_all(c->client, data)) break;
            continue;
        }
        const std::size_t cut = start + remaining;
        const std::string_view view(data);
        if (!co_await write_all(c->client, view.substr(0, cut))) break;
        ++s->fired;
        c->bound.reset();
        if (f.kind == tcp_fault_proxy::fault_kind::reset) {
            s->close(c, true);
            break;
        }
        if (f.kind == tcp_fault_proxy::fault_kind::truncate) {
            s->close(c, false);
            break;
        }
        if (f.kind == tcp_fault_proxy::fault_kind::stall) {
            c->stalled = true;
            c->stall_generation = s->resume_generation.load();
            co_await wait_while_stalled(s, c, true);
            if (c->closed) break;
        }
        if (f.kind == tcp_fault_proxy::fault_kind::inject) {
            if (!co_await write_all(c->client, f.bytes)) break;
        }
        if (f.kind == tcp_fault_proxy::fault_kind::delay) {
            const std::size_t now = ++s->delaying;
            if (now > s->peak_delaying) s->peak_delaying = now;
            asio::steady_timer timer(s->io, f.delay);
            auto [timer_ec] = co_await timer.async_wait(token);
            (void)timer_ec;
            --s->delaying;
            if (c->closed) break;
        }
        if (!co_await write_all(c->client, view.substr(cut))) break;
    }
    s->close(c, false);
}

asio::awaitable<void> run_connection(state* s, std::shared_ptr<connection> c) {
    auto [ec] = co_await c->upstream.async_connect(s->upstream, token);
    if (ec || c->closed) {
        s->close(c, true);
        co_return;
    }
    asio::co_spawn(s->io, pump_up(s, c), log_escape{});
    asio::co_spawn(s->io, pump_down(s, c), log_escape{});
}

asio::awaitable<void> accept_loop(state* s) {
    for (;;) {
        auto [ec, socket] = co_await s->acceptor.async_accept(token);
        if (ec) {
            if (s->stopping || ec == asio::error::operation_aborted) co_return;
            continue;  // e.g. EMFILE: keep serving what is open
        }
        ++s->accepted;
        auto c = std::make_shared<connection>(std::move(socket));
        s->connections.insert(c);
        ++s->open;
        asio::co_spawn(s->io, run_connection(s, c), log_escape{});
    }
}

void close_everything(state* s) {
    std::error_code ignored;
    s->acceptor.close(ignored);
    auto open = s->connections;
    for (const auto& c : open) s->close(c, true);
}

}  // namespace

tcp_fault_proxy::fault tcp_fault_proxy::reset_after(std::size_t bytes, std::string match,
                                                    bool from_body) {
    return fault{fault_kind::reset, bytes, from_body, "", std::move(match)};
}
tcp_fault_proxy::fault tcp_fault_proxy::truncate_after(std::size_t bytes, std::string match,
                                                       bool from_body) {
    return fault{fault_kind::truncate, bytes, from_body, "", std::move(match)};
}
tcp_fault_proxy::fault tcp_fault_proxy::stall_after(std::size_t bytes, std::string match,
                                                    bool from_body) {
    return fault{fault_kind::stall, bytes, from_body, "", std::move(match)};
}
tcp_fault_proxy::fault tcp_fault_proxy::inject_after(std::size_t bytes, std::string garbage,
                                                     std::string match, bool from_body) {
    return fault{fault_kind::inject, bytes, from_body, std::move(garbage), std::move(match)};
}
tcp_fault_proxy::fault tcp_fault_proxy::answer(std::string raw_response, std::string match) {
    return fault{fault_kind::answer, 0, false, std::move(raw_response), std::move(match)};
}
tcp_fault_proxy::fault tcp_fault_proxy::delay_after(std::size_t bytes,
                                                    std::chrono::milliseconds delay,
                                                    std::string match, bool from_body) {
    return fault{fault_kind::delay, bytes, from_body, "", std::move(match), delay};
}

std::string tcp_fault_proxy::status_response(int status, std::string extra_headers) {
    const char* reason = "Error";
    if (status == 429) reason = "Too Many Requests";
    if (status == 500) reason = "Internal Server Error";
    if (status == 502) reason = "Bad Gateway";
    if (status == 503) reason = "Service Unavailable";
    const std::string body =
        "{\"code\":" + std::to_string(status) + ",\"message\":\"injected by the test proxy\"}";
    return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n" + extra_headers +
           "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body;
}

std::string tcp_fault_proxy::chunk(const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return size + data + "\r\n";
}

std::string tcp_fault_proxy::envelope_header(std::uint8_t flags, std::uint32_t length) {
    std::string h(5, '\0');
    h[0] = static_cast<char>(flags);
    h[1] = static_cast<char>((length >> 24) & 0xff);
    h[2] = static_cast<char>((length >> 16) & 0xff);
    h[3] = static_cast<char>((length >> 8) & 0xff);
    h[4] = static_cast<char>(length & 0xff);
    return h;
}

tcp_fault_proxy::tcp_fault_proxy(std::string upstream_host, unsigned short upstream_port)
    : state_(std::make_unique<state>()) {
    state_->upstream = tcp::endpoint(asio::ip::make_address(upstream_host), upstream_port);
    state_->upstream_host_port = upstream_host + ":" + std::to_string(upstream_port);
    const tcp::endpoint listen(asio::ip::make_address("127.0.0.1"), 0);
    state_->acceptor.open(listen.protocol());
    state_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    state_->acceptor.bind(listen);
    state_->acceptor.listen();
    port_ = state_->acceptor.local_endpoint().port();
    state* s = state_.get();
    asio::co_spawn(s->io, accept_loop(s), log_escape{});
    thread_ = std::thread([s] {
        s->io.run();
        s->finished = true;
    });
}

tcp_fault_proxy::~tcp_fault_proxy() {
    state* s = state_.get();
    s->stopping = true;
    asio::post(s->io, [s] {
        close_everything(s);
        s->work.reset();
    });
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!s->finished && std::chrono::steady_clock::now() < limit) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!s->finished) {
        std::fprintf(stderr, "tcp_fault_proxy: tasks still running after 5 s: stopping\n");
        s->io.stop();
    }
    thread_.join();
}

std::string tcp_fault_proxy::url(const std::string& scheme) const {
    return scheme + "://127.0.0.1:" + std::to_string(port_);
}

void tcp_fault_proxy::arm(fault f, int times) {
    std::lock_guard lock(state_->mutex);
    state_->armed.emplace_back(std::move(f), times);
}

void tcp_fault_proxy::disarm() {
    std::lock_guard lock(state_->mutex);
    state_->armed.clear();
}

void tcp_fault_proxy::stall() {
    state_->stalled = true;
}

void tcp_fault_proxy::resume() {
    ++state_->resume_generation;
    state_->stalled = false;
}

void tcp_fault_proxy::reset_all() {
    state* s = state_.get();
    asio::post(s->io, [s] {
        auto open = s->connections;
        for (const auto& c : open) s->close(c, true);
    });
}

std::size_t tcp_fault_proxy::armed() const {
    std::lock_guard lock(state_->mutex);
    return state_->armed.size();
}
std::uint64_t tcp_fault_proxy::fired() const {
    return state_->fired.load();
}
std::uint64_t tcp_fault_proxy::connections_accepted() const {
    return state_->accepted.load();
}
std::size_t tcp_fault_proxy::open_connections() const {
    return state_->open.load();
}
std::uint64_t tcp_fault_proxy::requests_seen() const {
    return state_->requests.load();
}
std::size_t tcp_fault_proxy::peak_delayed() const {
    return state_->peak_delaying.load();
}
void tcp_fault_proxy::reset_peak_delayed() {
    state_->peak_delaying = state_->delaying.load();
}

}  // namespace moat::test
