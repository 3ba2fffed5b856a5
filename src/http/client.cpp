#include "http/client.hpp"

#include <moat/log.hpp>

#include "core/exception_boundary.hpp"
#include "core/loopback.hpp"
#include "http/connection_pool.hpp"
#include "http/message_parser.hpp"
#include "http/tls.hpp"

#include <asio/ssl/error.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>

namespace moat::http {
namespace {

constexpr std::size_t read_buffer_size = 64 * 1024;

bool starts_with_ci(std::string_view s, std::string_view prefix) {
    return s.size() >= prefix.size() && iequals(s.substr(0, prefix.size()), prefix);
}

bool is_idempotent(std::string_view method) {
    return method == "GET" || method == "HEAD" || method == "PUT" || method == "DELETE" ||
           method == "OPTIONS";
}

// "GET https://h:443/path": the query is left out (it may carry a token).
std::string describe(std::string_view method, const origin& where, std::string_view target) {
    const auto query = target.find('?');
    std::string out(method);
    out += ' ';
    out += where.to_string();
    out += target.substr(0, query);
    return out;
}

void log_debug(const std::string& message) {
    if (moat::detail::log_enabled()) moat::detail::log(log_level::debug, "http", message);
}

}  // namespace

result<parsed_url> parse_url(std::string_view url) {
    parsed_url out;
    std::string_view rest;
    if (starts_with_ci(url, "https://")) {
        out.is_tls = true;
        out.port = 443;
        rest = url.substr(8);
    } else if (starts_with_ci(url, "http://")) {
        out.port = 80;
        rest = url.substr(7);
    } else {
        return make_error(errc::invalid_argument, "a URL must start with http:// or https://");
    }
    const auto authority_end = rest.find_first_of("/?#");
    const auto authority = rest.substr(0, authority_end);
    std::string_view target =
        authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);
    if (const auto fragment = target.find('#'); fragment != std::string_view::npos) {
        target = target.substr(0, fragment);
    }
    if (authority.find('@') != std::string_view::npos) {
        return make_error(errc::invalid_argument,
                          "a URL with user info is refused (send credentials in a header)");
    }
    std::string_view host = authority;
    std::string_view port;
    if (host.starts_with('[')) {
        const auto close = host.find(']');
        if (close == std::string_view::npos) {
            return make_error(errc::invalid_argument, "a URL's IPv6 address lacks its ']'");
        }
        port = host.substr(close + 1);
        host = host.substr(1, close - 1);
        if (!port.empty() && !port.starts_with(':')) {
            return make_error(errc::invalid_argument, "a URL's port must follow a ':'");
        }
        if (!port.empty()) port.remove_prefix(1);
    } else if (const auto colon = host.rfind(':'); colon != std::string_view::npos) {
        port = host.substr(colon + 1);
        host = host.substr(0, colon);
    }
    if (host.empty()) return make_error(errc::invalid_argument, "a URL needs a host");
    for (const char c : host) {
        const auto u = static_cast<unsigned char>(c);
        if (u <= 0x20 || u == 0x7f || c == '/' || c == '\\') {
            return make_error(errc::invalid_argument, "a URL's host has a byte it cannot hold");
        }
    }
    if (!port.empty()) {
        unsigned value = 0;
        const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
        if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
            return make_error(errc::invalid_argument, "a URL's port must be 1 to 65535");
        }
        out.port = static_cast<std::uint16_t>(value);
    }
    out.host.assign(host);
    std::transform(out.host.begin(), out.host.end(), out.host.begin(), [](char c) {
        return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    });
    if (target.empty()) {
        out.target = "/";
    } else if (target.front() == '?') {
        out.target = "/" + std::string(target);
    } else {
        out.target.assign(target);
    }
    return out;
}

std::optional<std::chrono::seconds> parse_retry_after(const header_list& headers) {
    const auto value = headers.find("retry-after");
    if (!value) return std::nullopt;
    std::string_view text = *value;
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
    unsigned long seconds = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || seconds > 86'400) {
        return std::nullopt;
    }
    return std::chrono::seconds(seconds);
}

status_error error_for_status(int status, const header_list& headers, std::string_view what) {
    errc code = errc::backend_failure;
    if (status == 401) {
        code = errc::unauthorized;
    } else if (status == 429) {
        code = errc::rate_limited;
    } else if (status == 403) {
        code = errc::permission_denied;
    } else if (status == 404) {
        code = errc::file_not_found;
    } else if (status == 413) {
        code = errc::too_large;
    } else if (status >= 400 && status < 500) {
        code = errc::invalid_argument;
    }
    status_error out;
    std::string detail(what);
    detail += ": HTTP ";
    detail += std::to_string(status);
    if (status == 429) {
        out.retry_after = parse_retry_after(headers);
        if (out.retry_after)
            detail += "; retry after " + std::to_string(out.retry_after->count()) + " s";
    }
    out.error = make_error(code, std::move(detail));
    return out;
}

namespace detail {

// One request and its response on one leased connection. Gives the connection back when
// destroyed: to the pool when the response ended cleanly with keep-alive, closed otherwise.
struct exchange {
    std::shared_ptr<connection_pool> pool;
    std::shared_ptr<client_connection> connection;
    message_parser parser{message_parser::mode::response};
    response_head head;
    std::string what;  // "GET https://h:443/path", for details
    std::string buffer = std::string(read_buffer_size, '\0');
    std::size_t begin = 0;  // unparsed bytes are buffer[begin, end)
    std::size_t end = 0;
    std::uint64_t bytes_read = 0;
    bool saw_eof = false;
    bool ended = false;
    bool reusable = false;

    exchange(std::shared_ptr<connection_pool> p, std::shared_ptr<client_connection> c,
             parser_limits limits)
        : pool(std::move(p)),
          connection(std::move(c)),
          parser(message_parser::mode::response, limits) {}
    exchange(const exchange&) = delete;
    exchange& operator=(const exchange&) = delete;
    ~exchange() { give_back(ended && reusable); }

    void give_back(bool is_reusable) {
        if (!connection) return;
        connection->disarm();
        pool->release(std::move(connection), is_reusable);
    }

    error failure(errc code, std::string_view step, std::string_view why) const {
        std::string detail(step);
        detail += " (";
        detail += what;
        detail += "): ";
        detail += why;
        log_debug(detail);
        return make_error(code, std::move(detail));
    }

    error io_failure(std::string_view step, const std::error_code& ec) const {
        if (ec == asio::error::timed_out || connection->timed_out()) {
            return failure(errc::deadline_exceeded, step, "the deadline passed");
        }
        if (ec == asio::error::operation_aborted)
            return failure(errc::cancelled, step, "cancelled");
        if (ec == asio::error::connection_reset) {
            return failure(errc::backend_failure, step, "connection reset by the server");
        }
        if (ec == asio::error::broken_pipe) {
            return failure(errc::backend_failure, step, "the server closed the connection");
        }
        return failure(errc::backend_failure, step, ec.message());
    }

    error parse_failure(std::string_view step) const {
        switch (parser.error()) {
            case parse_error::head_too_large:
            case parse_error::too_many_headers:
                return failure(errc::protocol_error, step,
                               "the response head is too large: " + parser.error_detail());
            case parse_error::body_too_large:
                return failure(errc::protocol_error, step,
                               "the response body is past its cap: " + parser.error_detail());
            case parse_error::truncated:
                return failure(errc::protocol_error, step,
                               "the response was truncated (the server closed the connection "
                               "inside it)");
            default:
                return failure(errc::protocol_error, step,
                               "malformed response: " + parser.error_detail());
        }
    }

    // The parser's next event, reading from the connection as needed.
    asio::awaitable<result<parse_event>> async_next_event(std::string_view step) {
        for (;;) {
            const std::string_view available(buffer.data() + begin, end - begin);
            parse_event e = parser.feed(available);
            begin += e.consumed;
            if (e.what == parse_event::kind::error) co_return parse_failure(step);
            if (e.what != parse_event::kind::need_more) co_return e;
            if (saw_eof) {
                e = parser.finish();
                if (e.what == parse_event::kind::error) co_return parse_failure(step);
                if (e.what == parse_event::kind::need_more) {
                    co_return failure(errc::backend_failure, step,
                                      "the server closed the connection before responding");
                }
                co_return e;
            }
            if (begin == end) {
                begin = end = 0;
            } else if (end == buffer.size()) {
                if (begin == 0) {
                    co_return failure(errc::protocol_error, step, "the parser made no progress");
                }
                std::memmove(buffer.data(), buffer.data() + begin, end - begin);
                end -= begin;
                begin = 0;
            }
            const auto into = asio::buffer(buffer.data() + end, buffer.size() - end);
            auto outcome = co_await connection->async_read_some(into);
            const auto ec = std::get<0>(outcome);
            end += std::get<1>(outcome);
            bytes_read += std::get<1>(outcome);
            if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) {
                saw_eof = true;
            } else if (ec) {
                co_return io_failure(step, ec);
            }
        }
    }

    asio::awaitable<result<std::string_view>> async_read_some() {
        if (ended) co_return std::string_view();
        auto next = co_await async_next_event("reading the response body");
        if (!next) co_return std::move(next).error();
        if (next->what == parse_event::kind::end) {
            ended = true;
            reusable = parser.keep_alive() && begin == end && !saw_eof;
            give_back(reusable);
            co_return std::string_view();
        }
        if (next->what != parse_event::kind::body) {
            co_return failure(errc::protocol_error, "reading the response body",
                              "an unexpected event");
        }
        co_return next->body;
    }
};

}  // namespace detail

response::response(std::unique_ptr<detail::exchange> state) : state_(std::move(state)) {}
response::response(response&&) noexcept = default;
response& response::operator=(response&&) noexcept = default;
response::~response() = default;

int response::status() const noexcept {
    return state_->head.status;
}
const response_head& response::head() const noexcept {
    return state_->head;
}
const header_list& response::headers() const noexcept {
    return state_->head.headers;
}
bool response::has_ended() const noexcept {
    return state_->ended;
}

namespace {

asio::awaitable<result<std::string_view>> read_some(detail::exchange* x) {
    co_return co_await x->async_read_some();
}

asio::awaitable<result<std::string>> read_body(detail::exchange* x, std::size_t max_bytes) {
    if (!x->ended && !x->parser.set_body_limit(x->parser.body_bytes() + max_bytes)) {
        co_return x->parse_failure("reading the response body");
    }
    std::string body;
    for (;;) {
        auto piece = co_await x->async_read_some();
        if (!piece) co_return std::move(piece).error();
        if (piece->empty()) break;
        if (body.size() + piece->size() > max_bytes) {
            co_return x->failure(errc::protocol_error, "reading the response body",
                                 "past the cap of " + std::to_string(max_bytes) + " bytes");
        }
        body.append(*piece);
    }
    co_return body;
}

}  // namespace

asio::awaitable<result<std::string_view>> response::async_read_some() {
    return guarded(read_some(state_.get()));
}

asio::awaitable<result<std::string>> response::async_read_body(std::size_t max_bytes) {
    return guarded(read_body(state_.get(), max_bytes));
}

struct client::state {
    asio::any_io_executor executor;
    client_options options;
    std::shared_ptr<connection_pool> pool;
    std::shared_ptr<asio::ssl::context> tls;  // made on the first https request
};

client::client(asio::any_io_executor executor, client_options options)
    : state_(std::make_shared<state>()) {
    state_->executor = executor;
    pool_options pool;
    pool.max_per_origin = options.max_connections_per_origin;
    pool.max_streams_per_origin = options.max_streams_per_origin;
    pool.idle_timeout = options.idle_timeout;
    state_->pool = std::make_shared<connection_pool>(executor, pool);
    state_->options = std::move(options);
}

client::~client() {
    state_->pool->close_idle();
}

std::uint64_t client::connections_opened() const noexcept {
    return state_->pool->connections_opened();
}
std::size_t client::idle_connections() const noexcept {
    return state_->pool->idle_count();
}
std::size_t client::origins_held() const noexcept {
    return state_->pool->origin_count();
}

void client::drop_origin(std::string_view url) noexcept {
    auto parsed = parse_url(url);
    if (!parsed) return;
    const origin where{parsed->is_tls, parsed->host, parsed->port};
    state_->pool->drop_origin(where.to_string());
}

asio::awaitable<result<response>> client::async_send(request req) {
    return guarded(send(std::move(req)));
}

asio::awaitable<result<full_response>> client::async_fetch(request req,
                                                           std::size_t max_body_bytes) {
    return guarded(fetch(std::move(req), max_body_bytes));
}

asio::awaitable<result<full_response>> client::fetch(request req, std::size_t max_body_bytes) {
    auto sent = co_await send(std::move(req));
    if (!sent) co_return std::move(sent).error();
    auto body = co_await read_body(sent->state_.get(), max_body_bytes);
    if (!body) co_return std::move(body).error();
    full_response out;
    out.head = std::move(sent->state_->head);
    out.body = std::move(*body);
    co_return out;
}

asio::awaitable<result<response>> client::send(request req) {
    auto url = parse_url(req.url);
    if (!url) co_return std::move(url).error();
    origin where{url->is_tls, url->host, url->port};
    const bool opted_in =
        std::find(state_->options.plain_http_hosts.begin(), state_->options.plain_http_hosts.end(),
                  url->host) != state_->options.plain_http_hosts.end();
    const bool loopback_only = !where.is_tls && !opted_in;
    if (loopback_only && !moat::detail::is_loopback_host(where.host)) {
        co_return make_error(errc::invalid_argument,
                             "plain http:// to " + where.host +
                                 " is refused: only loopback, or a host the client options "
                                 "allow by name (use https://)");
    }
    static constexpr std::array<const char*, 3> framing_headers = {
        "content-length", "transfer-encoding", "connection"};
    for (const auto* framing : framing_headers) {
        if (req.headers.contains(framing)) {
            co_return make_error(errc::invalid_argument,
                                 std::string("the client sets the ") + framing +
                                     " header itself: leave it out of the request");
        }
    }

    request_head head;
    head.method = req.method;
    head.target = url->target;
    head.headers = std::move(req.headers);
    if (!head.headers.contains("host")) {
        std::string host =
            where.host.find(':') != std::string::npos ? "[" + where.host + "]" : where.host;
        if (where.port != (where.is_tls ? 443 : 80)) host += ':' + std::to_string(where.port);
        head.headers.add("Host", std::move(host));
    }
    const bool is_streamed = static_cast<bool>(req.body_stream);
    if (is_streamed) {
        head.headers.add("Transfer-Encoding", "chunked");
    } else if (!req.body.empty() || req.method == "POST" || req.method == "PUT" ||
               req.method == "PATCH") {
        head.headers.add("Content-Length", std::to_string(req.body.size()));
    }
    std::string head_bytes;
    if (!append_request_head(head_bytes, head)) {
        co_return make_error(errc::invalid_argument,
                             "the request has a method, target or header that would break HTTP "
                             "framing (a CR, LF or NUL, or a name that is not a token)");
    }
    const auto what = describe(req.method, where, url->target);

    if (where.is_tls && !state_->tls) {
        tls_client_options tls;
        tls.use_system_store = state_->options.use_system_ca_store;
        tls.ca_file = state_->options.ca_file;
        auto context = make_client_context(tls);
        if (!context) co_return std::move(context).error();
        state_->tls = std::move(*context);
    }
    std::shared_ptr<asio::ssl::context> tls;
    if (where.is_tls) tls = state_->tls;
    parser_limits limits;
    limits.max_head_bytes = state_->options.max_head_bytes;
    const bool may_retry = is_idempotent(req.method) && !is_streamed;

    for (int attempt = 0;; ++attempt) {
        connection_pool::acquire_request wanted;
        wanted.key = where.to_string();
        if (req.is_stream) wanted.kind = lease_kind::stream;
        wanted.make = [executor = state_->executor, where, tls] {
            return std::make_shared<client_connection>(executor, where, tls);
        };
        wanted.limit = req.limit;
        wanted.what = "a connection to " + wanted.key;
        auto leased = co_await state_->pool->async_acquire(std::move(wanted));
        if (!leased) co_return std::move(leased).error();
        auto x = std::make_unique<detail::exchange>(
            state_->pool, std::static_pointer_cast<client_connection>(leased->connection), limits);
        x->what = what;
        if (req.method == "HEAD") x->parser.expect_no_body();
        x->connection->arm(req.limit);
        if (!leased->is_reused) {
            auto opened = co_await x->connection->async_open(loopback_only);
            if (!opened) {
                log_debug(opened.error().detail);
                co_return std::move(opened).error();
            }
        }
        const bool retry_on_stale = leased->is_reused && may_retry && attempt == 0;

        const std::array<asio::const_buffer, 3> first = {
            asio::buffer(head_bytes), asio::buffer(req.body), asio::const_buffer()};
        auto written = co_await x->connection->async_write(first);
        if (written && retry_on_stale) continue;
        if (written) co_return x->io_failure("sending the request", written);
        if (is_streamed) {
            for (;;) {
                auto next = req.body_stream();
                auto piece = co_await std::move(next);
                if (!piece) co_return std::move(piece).error();
                char size_line[24];
                const int n = std::snprintf(size_line, sizeof size_line, "%zx\r\n", piece->size());
                const std::string_view line(size_line, static_cast<std::size_t>(n));
                const std::array<asio::const_buffer, 3> chunk = {
                    asio::buffer(line.data(), line.size()), asio::buffer(*piece),
                    asio::buffer("\r\n", 2)};
                if (piece->empty()) {
                    const std::array<asio::const_buffer, 3> last = {
                        asio::buffer("0\r\n\r\n", 5), asio::const_buffer(), asio::const_buffer()};
                    auto ended = co_await x->connection->async_write(last);
                    if (ended) co_return x->io_failure("sending the request body", ended);
                    break;
                }
                auto sent_chunk = co_await x->connection->async_write(chunk);
                if (sent_chunk) co_return x->io_failure("sending the request body", sent_chunk);
            }
        }

        // The head; interim 1xx responses (100 Continue, 103 Early Hints) are skipped.
        bool stale = false;
        for (;;) {
            auto event = co_await x->async_next_event("reading the response head");
            if (!event) {
                if (retry_on_stale && x->bytes_read == 0) {
                    stale = true;
                    break;
                }
                co_return std::move(event).error();
            }
            if (event->what != parse_event::kind::head) continue;  // the end of a 1xx
            const int status = x->parser.response().status;
            if (status >= 100 && status < 200 && status != 101) continue;
            x->head = std::move(x->parser.response());
            break;
        }
        if (stale) continue;
        co_return response(std::move(x));
    }
}

}  // namespace moat::http
