#include "http/server_connection.hpp"

#include "core/asio_compat.hpp"
#include "core/cancellation.hpp"
#include "core/json_writer.hpp"

#include <moat/log.hpp>

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <exception>
#include <utility>

namespace moat::http {

namespace {

constexpr std::size_t max_linger_bytes = 256 * 1024;
constexpr std::chrono::milliseconds max_linger{1000};

std::string json_error_body(int status, std::string_view message) {
    json_writer w;
    w.begin_object().key("code").value(status).key("message").value(message).end_object();
    return w.take();
}

bool wants_close(const request_head& head) {
    if (head.version_minor == 0) return !head.headers.has_token("connection", "keep-alive");
    return head.headers.has_token("connection", "close");
}

bool status_has_body(int status) {
    return status >= 200 && status != 204 && status != 304;
}

}  // namespace

// Closes the stream when the armed deadline passes. Shared with the timer's handler, which may
// run after the connection is gone (it then finds no target).
struct server_connection::watchdog {
    explicit watchdog(const asio::any_io_executor& ex) : timer(ex) {}
    asio::steady_timer timer;
    stream* target = nullptr;
    std::uint64_t generation = 0;
    bool fired = false;
};

namespace {

// The timer's completion handler (a plain handler, not a coroutine: nothing to own or await).
struct watchdog_expiry {
    std::shared_ptr<server_connection::watchdog> dog;
    std::uint64_t generation;
    void operator()(const std::error_code& ec) const {
        if (ec || generation != dog->generation || dog->target == nullptr) return;
        dog->fired = true;
        dog->target->close();
    }
};

}  // namespace

server_connection::server_connection(std::shared_ptr<server::state> state,
                                     std::unique_ptr<stream> s, clock::time_point first_deadline,
                                     server::state::admitted& record)
    : state_(std::move(state)),
      record_(&record),
      stream_(std::move(s)),
      watchdog_(std::make_shared<watchdog>(state_->executor)),
      parser_(message_parser::mode::request, state_->options.limits),
      buffer_(state_->options.read_buffer_bytes == 0 ? 1 : state_->options.read_buffer_bytes),
      first_deadline_(first_deadline) {
    watchdog_->target = stream_.get();
    state_->connections.push_front(this);
    registration_ = state_->connections.begin();
    record_->connection = this;
}

server_connection::~server_connection() {
    record_->connection = nullptr;
    watchdog_->target = nullptr;
    watchdog_->timer.cancel();
    stream_->close();
    state_->connections.erase(registration_);
}

void server_connection::arm(clock::time_point deadline) {
    auto& dog = *watchdog_;
    ++dog.generation;
    dog.fired = false;
    dog.timer.expires_at(deadline);
    dog.timer.async_wait(watchdog_expiry{watchdog_, dog.generation});
}

void server_connection::disarm() noexcept {
    ++watchdog_->generation;
    watchdog_->timer.cancel();
}

void server_connection::on_stop() noexcept {
    if (phase_ == phase::waiting) stream_->close();
}

void server_connection::close_now() noexcept {
    stream_->close();
}

bool server_connection::is_idle() const noexcept {
    return phase_ == phase::waiting && pending_.empty() && stream_->is_open() &&
           clock::now() - waiting_since_ >= state_->options.unauthenticated_grace &&
           stream_->unread_bytes() == 0;
}

void server_connection::mark_authenticated() noexcept {
    state_->forget_unauthenticated(*record_);
    record_->authenticated = true;
}

asio::awaitable<void> server_connection::async_run() {
    bool idle = false;  // the first head is timed from the accept
    for (;;) {
        phase_ = phase::waiting;
        waiting_since_ = clock::now();
        if (state_->stopping) break;
        const auto outcome = co_await async_read_head(idle);
        if (outcome == head_outcome::closed) break;
        phase_ = phase::in_request;
        if (outcome == head_outcome::failed) {
            co_await async_answer_parse_error();
            break;
        }
        co_await async_handle_request();
        if (close_after_ || !stream_->is_open()) break;
        idle = true;
    }
    phase_ = phase::closing;
    if (stream_->is_open() && !write_failed_) co_await async_linger_close();
    stream_->close();
}

asio::awaitable<server_connection::head_outcome> server_connection::async_read_head(bool idle) {
    const auto& options = state_->options;
    if (idle) {
        auto idle_timeout = options.idle_timeout;
        if (!record_->authenticated)
            idle_timeout = std::min(idle_timeout, options.unauthenticated_idle_timeout);
        arm(clock::now() + idle_timeout);
    } else {
        arm(first_deadline_);
    }
    for (;;) {
        const auto e = parser_.feed(pending_);
        pending_.remove_prefix(e.consumed);
        if (e.what == parse_event::kind::head) {
            disarm();
            co_return head_outcome::head;
        }
        if (e.what == parse_event::kind::error) {
            disarm();
            co_return head_outcome::failed;
        }
        if (e.what != parse_event::kind::need_more) continue;
        const auto ec = co_await async_read_more();
        if (ec) {
            disarm();
            if (!parser_.is_between_messages() && !watchdog_->fired) {
                detail::log(log_level::debug, "http", "a client closed in the middle of a head");
            }
            co_return head_outcome::closed;
        }
        if (idle) {  // the first byte of the next request: its head has head_timeout from now
            idle = false;
            arm(clock::now() + options.head_timeout);
        }
    }
}

asio::awaitable<std::error_code> server_connection::async_read_more() {
    const auto buffer = asio::buffer(buffer_);
    auto [ec, n] = co_await stream_->async_read_some(buffer);
    if (!ec) pending_ = std::string_view(buffer_.data(), n);
    co_return ec;
}

asio::awaitable<void> server_connection::async_answer_parse_error() {
    begin_request();  // the previous request's state must not leak into this answer
    body_done_ = true;
    const auto error = parser_.error();
    int status = 400;
    std::string message = "malformed request: " + parser_.error_detail();
    if (error == parse_error::head_too_large || error == parse_error::too_many_headers) {
        status = 431;
        message = "request head too large: " + parser_.error_detail();
    } else if (error == parse_error::unsupported) {
        status = parser_.error_detail().find("version") != std::string::npos ? 505 : 501;
        message = "not supported: " + parser_.error_detail();
    }
    detail::log(log_level::debug, "http", std::to_string(status) + ": " + message);
    co_await async_answer_error(status, message);
}

void server_connection::begin_request() noexcept {
    ++state_->counters.requests;
    close_after_ = false;
    response_started_ = streaming_ = stream_ended_ = chunked_ = head_only_ = aborted_ = false;
    body_done_ = !parser_.has_body();
    continue_sent_ = false;
    body_read_started_ = false;
    body_error_status_ = 0;
}

asio::awaitable<void> server_connection::async_handle_request() {
    begin_request();
    auto& head = parser_.request();
    close_after_ = wants_close(head) || state_->stopping;
    head_only_ = head.method == "HEAD";

    const auto host = head.headers.find("host");
    if (!host && head.version_minor == 1) {
        co_await async_answer_error(400, "the request has no Host header");
        co_return;
    }
    if (host && !state_->is_host_allowed(*host)) {
        co_await async_answer_error(421, "this server does not serve that host");
        co_return;
    }
    if (state_->intercepts && state_->intercepts(head)) {
        (void)parser_.set_body_limit(state_->interceptor.max_body_bytes);
        const path_params none;
        co_await async_run_handler(state_->interceptor, none);
        co_return;
    }
    auto match = state_->routes.match(head.method, head.path());
    if (head_only_ && match.result != route_match::outcome::found) {
        auto as_get = state_->routes.match("GET", head.path());  // HEAD is GET without the body
        if (as_get.result == route_match::outcome::found) match = std::move(as_get);
    }
    if (match.result == route_match::outcome::not_found) {
        co_await async_answer_error(404, "no route for this path");
        co_return;
    }
    if (match.result == route_match::outcome::method_not_allowed) {
        header_list headers;
        headers.add("Allow", match.allow);
        headers.add("Content-Type", "application/json; charset=utf-8");
        close_after_ = close_after_ || !body_done_;
        auto body = json_error_body(405, "method not allowed");
        (void)co_await async_send(405, std::move(headers), std::move(body));
        co_return;
    }
    const auto& route = state_->handlers[match.route_index];
    if (!parser_.set_body_limit(route.max_body_bytes)) {
        const auto message = "request body past " + std::to_string(route.max_body_bytes) + " bytes";
        co_await async_answer_error(413, message);
        co_return;
    }
    co_await async_run_handler(route, match.params);
}

asio::awaitable<void> server_connection::async_run_handler(const server::state::route_entry& route,
                                                           const path_params& params) {
    server_request request(*this, parser_.request(), params);
    server_response response(*this);
    std::exception_ptr failure;
    try {
        auto task = route.run(request, response);
        co_await std::move(task);
    } catch (...) {
        failure = std::current_exception();
    }
    if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
        close_after_ = true;
        stream_->close();  // stopped past the grace: no answer
        co_return;
    }
    if (failure) {
        std::string what = "a handler failed";
        try {
            std::rethrow_exception(failure);
        } catch (const std::exception& e) {
            what += std::string(": ") + e.what();
        } catch (...) {
        }
        detail::log(log_level::warning, "http",
                    what + " (" + std::string(parser_.request().path()) + ")");
        if (response_started_) {
            close_after_ = true;
            stream_->close();
            co_return;
        }
        co_await async_answer_error(500, "internal error");
        co_return;
    }
    if (taken_over_ || (aborted_ && response_started_)) {
        close_after_ = true;
        stream_->close();
        co_return;
    }
    if (!response_started_) {
        if (body_error_status_ != 0) {
            std::string message = "request body past the limit";
            if (body_error_status_ == 400) message = "malformed request body";
            co_await async_answer_error(body_error_status_, message);
        } else {
            co_await async_answer_error(500, "the handler sent no response");
        }
        co_return;
    }
    if (streaming_ && !stream_ended_ && !write_failed_) (void)co_await async_end();
    if (!body_done_) close_after_ = true;
}

result<taken_connection> server_connection::take_over() {
    if (response_started_ || continue_sent_ || taken_over_ || body_read_started_) {
        return make_error(errc::invalid_argument,
                          "the connection cannot be taken over once its body or response started");
    }
    taken_over_ = true;
    close_after_ = true;
    taken_connection taken;
    taken.connection = stream_.get();
    taken.read_ahead = pending_;
    pending_ = {};
    return taken;
}

asio::awaitable<void> server_connection::async_answer_error(int status, std::string_view message) {
    close_after_ = close_after_ || !body_done_ || status == 400 || status == 431 || status >= 500;
    if (response_started_ || write_failed_ || !stream_->is_open()) co_return;
    header_list headers;
    headers.add("Content-Type", "application/json; charset=utf-8");
    auto body = json_error_body(status, message);
    (void)co_await async_send(status, std::move(headers), std::move(body));
}

asio::awaitable<result<void>> server_connection::async_write_buffers(
    std::span<const asio::const_buffer> buffers) {
    if (write_failed_ || !stream_->is_open()) {
        co_return make_error(errc::backend_failure, "the connection is closed");
    }
    arm(clock::now() + state_->options.write_timeout);
    auto [ec, n] = co_await stream_->async_write(buffers);
    const bool timed_out = watchdog_->fired;
    disarm();
    if (!ec) co_return result<void>{};
    write_failed_ = true;
    close_after_ = true;
    stream_->close();
    if (timed_out) {
        co_return make_error(errc::deadline_exceeded,
                             "the client did not read the response within the write timeout");
    }
    co_return make_error(errc::backend_failure, "writing the response failed: " + ec.message());
}

result<std::string> server_connection::make_head(int status, header_list& headers, bool chunked,
                                                 std::uint64_t length) {
    if (response_started_)
        return make_error(errc::invalid_argument, "the response was already sent");
    headers.remove("content-length");
    headers.remove("transfer-encoding");
    headers.remove("connection");
    const auto& request = parser_.request();
    if (state_->stopping || (parser_.has_body() && !body_done_)) close_after_ = true;
    if (status_has_body(status)) {
        if (chunked) {
            if (request.version_minor == 0) {
                close_after_ = true;  // HTTP/1.0 has no chunking: the body runs to the close
            } else {
                headers.add("Transfer-Encoding", "chunked");
            }
        } else {
            headers.add("Content-Length", std::to_string(length));
        }
    }
    if (close_after_) {
        headers.add("Connection", "close");
    } else if (request.version_minor == 0) {
        headers.add("Connection", "keep-alive");
    }
    response_head head;
    head.status = status;
    head.headers = headers;
    std::string out;
    if (!append_response_head(out, head)) {
        return make_error(errc::invalid_argument, "a response header name or value is invalid");
    }
    return out;
}

asio::awaitable<result<void>> server_connection::async_send(int status, header_list headers,
                                                            std::string body) {
    auto head = make_head(status, headers, false, body.size());
    if (!head) co_return head.error();
    response_started_ = true;
    if (head_only_ || !status_has_body(status)) body.clear();
    const std::array<asio::const_buffer, 2> buffers = {asio::buffer(*head), asio::buffer(body)};
    co_return co_await async_write_buffers(buffers);
}

asio::awaitable<result<void>> server_connection::async_begin(int status, header_list headers) {
    auto head = make_head(status, headers, true, 0);
    if (!head) co_return head.error();
    response_started_ = true;
    streaming_ = true;
    chunked_ = parser_.request().version_minor == 1 && status_has_body(status);
    if (head_only_ || !status_has_body(status)) stream_ended_ = true;  // nothing more goes out
    const std::array<asio::const_buffer, 1> buffers = {asio::buffer(*head)};
    co_return co_await async_write_buffers(buffers);
}

asio::awaitable<result<void>> server_connection::async_write_frame(std::string_view frame) {
    if (!streaming_) co_return make_error(errc::invalid_argument, "async_begin was not called");
    if (stream_ended_) {
        if (head_only_) co_return result<void>{};
        co_return make_error(errc::invalid_argument, "the stream has ended");
    }
    if (frame.empty()) co_return result<void>{};  // an empty chunk would end the body
    if (!chunked_) {
        const std::array<asio::const_buffer, 1> raw = {asio::buffer(frame)};
        co_return co_await async_write_buffers(raw);
    }
    std::array<char, 20> size_line{};
    const int n = std::snprintf(size_line.data(), size_line.size(), "%zx\r\n", frame.size());
    const std::array<asio::const_buffer, 3> buffers = {
        asio::buffer(size_line.data(), static_cast<std::size_t>(n)), asio::buffer(frame),
        asio::buffer("\r\n", 2)};
    co_return co_await async_write_buffers(buffers);
}

asio::awaitable<result<void>> server_connection::async_end() {
    if (!streaming_) co_return make_error(errc::invalid_argument, "async_begin was not called");
    if (stream_ended_) co_return result<void>{};
    stream_ended_ = true;
    if (!chunked_) co_return result<void>{};  // HTTP/1.0: the close ends the body
    const std::array<asio::const_buffer, 1> buffers = {asio::buffer("0\r\n\r\n", 5)};
    co_return co_await async_write_buffers(buffers);
}

asio::awaitable<result<void>> server_connection::async_send_continue_if_asked() {
    if (continue_sent_ || response_started_) co_return result<void>{};
    continue_sent_ = true;
    const auto& request = parser_.request();
    if (request.version_minor == 0 || !request.headers.has_token("expect", "100-continue")) {
        co_return result<void>{};
    }
    const std::array<asio::const_buffer, 1> buffers = {
        asio::buffer("HTTP/1.1 100 Continue\r\n\r\n", 25)};
    co_return co_await async_write_buffers(buffers);
}

asio::awaitable<result<std::string_view>> server_connection::async_read_some() {
    body_read_started_ = true;
    if (body_done_) co_return std::string_view{};
    if (body_error_status_ != 0 || !stream_->is_open()) {
        co_return make_error(errc::protocol_error, "the request body already failed");
    }
    auto sent = co_await async_send_continue_if_asked();
    if (!sent) co_return sent.error();
    for (;;) {
        const auto e = parser_.feed(pending_);
        pending_.remove_prefix(e.consumed);
        if (e.what == parse_event::kind::body) co_return e.body;
        if (e.what == parse_event::kind::end) {
            body_done_ = true;
            co_return std::string_view{};
        }
        if (e.what == parse_event::kind::error) {
            close_after_ = true;
            if (parser_.error() == parse_error::body_too_large) {
                body_error_status_ = 413;
                co_return make_error(errc::too_large, parser_.error_detail());
            }
            body_error_status_ = 400;
            co_return make_error(errc::protocol_error,
                                 "malformed request body: " + parser_.error_detail());
        }
        if (e.what != parse_event::kind::need_more) continue;
        arm(clock::now() + state_->options.body_read_timeout);
        const auto ec = co_await async_read_more();
        const bool timed_out = watchdog_->fired;
        disarm();
        if (ec) {
            close_after_ = true;
            stream_->close();
            if (timed_out) {
                co_return make_error(errc::deadline_exceeded,
                                     "the client sent no body bytes within the body read timeout");
            }
            co_return make_error(errc::backend_failure,
                                 "the client closed in the middle of the body");
        }
    }
}

asio::awaitable<result<std::string>> server_connection::async_read_body() {
    std::string body;
    for (;;) {
        auto piece = co_await async_read_some();
        if (!piece) co_return piece.error();
        if (piece->empty()) co_return body;
        body.append(*piece);
    }
}

asio::awaitable<void> server_connection::async_linger_close() {
    auto linger = state_->options.head_timeout;
    if (linger > max_linger) linger = max_linger;
    arm(clock::now() + linger);  // bounds the shutdown too (TLS waits for the peer's close_notify)
    co_await stream_->async_shutdown();
    std::size_t drained = 0;
    while (drained < max_linger_bytes) {
        const auto buffer = asio::buffer(buffer_);
        auto [ec, n] = co_await stream_->async_read_some(buffer);
        if (ec) break;
        drained += n;
    }
    disarm();
}

// server_request and server_response forward to their connection.

std::string_view server_request::param(std::string_view name) const noexcept {
    return params_->get(name);
}
bool server_request::has_body() const noexcept {
    return connection_->has_body();
}
std::optional<std::uint64_t> server_request::content_length() const noexcept {
    return connection_->content_length();
}
void server_request::mark_authenticated() noexcept {
    connection_->mark_authenticated();
}

result<taken_connection> server_request::take_over() {
    return connection_->take_over();
}

asio::awaitable<result<std::string_view>> server_request::async_read_some() {
    return connection_->async_read_some();
}
asio::awaitable<result<std::string>> server_request::async_read_body() {
    return connection_->async_read_body();
}

asio::awaitable<result<void>> server_response::async_send(int status, header_list headers,
                                                          std::string body) {
    return connection_->async_send(status, std::move(headers), std::move(body));
}
asio::awaitable<result<void>> server_response::async_send_error(int status,
                                                                std::string_view message) {
    header_list headers;
    headers.add("Content-Type", "application/json; charset=utf-8");
    return connection_->async_send(status, std::move(headers), json_error_body(status, message));
}
asio::awaitable<result<void>> server_response::async_begin(int status, header_list headers) {
    return connection_->async_begin(status, std::move(headers));
}
asio::awaitable<result<void>> server_response::async_write(std::string_view frame) {
    return connection_->async_write_frame(frame);
}
asio::awaitable<result<void>> server_response::async_end() {
    return connection_->async_end();
}
void server_response::abort() noexcept {
    connection_->abort_response();
}
bool server_response::is_started() const noexcept {
    return connection_->is_response_started();
}

}  // namespace moat::http
