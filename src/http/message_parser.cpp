#include "http/message_parser.hpp"

#include <llhttp.h>

#include <string>
#include <utility>

namespace moat::http {

namespace {

enum class phase { idle, head, body, done };

std::string_view trim_trailing_space(std::string_view s) noexcept {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

// Line ends and folds in a head, which llhttp 8.1 lets through even in strict mode: a bare LF
// after the start line or as the blank line, and a field line that starts with whitespace when the
// field's first line was empty ("Content-Length:\r\n 2"), which it joins silently. Fed every byte
// of a message's head, in order and once, however the head is split across feeds; it stops at the
// blank line, before the body.
class head_line_scanner {
  public:
    // Looks at `input` up to the end of the head: false, with `why` set, at a bare LF or a folded
    // line.
    bool scan(std::string_view input, std::string& why) {
        for (std::size_t i = 0; i < input.size() && !is_done_; ++i) {
            const char c = input[i];
            if (c == '\n') {
                if (previous_ != '\r') {
                    why = "bare LF line end (lines end with CRLF)";
                    return false;
                }
                if (line_bytes_ == 0 && has_start_line_) is_done_ = true;  // the blank line
                if (line_bytes_ > 0) has_start_line_ = true;  // empty lines before it are skipped
                line_bytes_ = 0;
            } else if (c != '\r') {
                if (line_bytes_ == 0 && has_start_line_ && (c == ' ' || c == '\t')) {
                    why = "obsolete line folding (a header line starts with whitespace)";
                    return false;
                }
                ++line_bytes_;
            }
            previous_ = c;
        }
        return true;
    }

    // The next message's head starts.
    void reset() noexcept { *this = head_line_scanner{}; }

  private:
    char previous_ = 0;
    std::size_t line_bytes_ = 0;
    bool has_start_line_ = false;
    bool is_done_ = false;
};

}  // namespace

const char* to_string(parse_error e) noexcept {
    switch (e) {
        case parse_error::none:
            return "none";
        case parse_error::malformed:
            return "malformed";
        case parse_error::head_too_large:
            return "head_too_large";
        case parse_error::too_many_headers:
            return "too_many_headers";
        case parse_error::body_too_large:
            return "body_too_large";
        case parse_error::truncated:
            return "truncated";
        case parse_error::unsupported:
            return "unsupported";
    }
    return "unknown";
}

struct message_parser::state {
    llhttp_t parser{};
    llhttp_settings_t settings{};
    mode which;
    parser_limits limits;

    request_head request;
    response_head response;
    std::string field;  // the header field being parsed
    std::string value;
    // Where the current feed's input starts and ends, and whether the last value span ended at the
    // end of its feed: llhttp strips an obsolete line fold and calls on_header_value again, which
    // only a split feed may do legitimately.
    const char* feed_begin = nullptr;
    const char* feed_end = nullptr;
    bool value_started = false;
    bool value_split = false;
    head_line_scanner lines;

    phase at = phase::idle;
    std::size_t head_bytes = 0;     // wire bytes of the current head (line ends included)
    std::size_t stored_bytes = 0;   // bytes kept of the current head (target, names, values)
    std::size_t trailer_bytes = 0;  // trailer bytes seen (dropped)
    std::size_t header_count = 0;
    std::optional<std::uint64_t> declared_length;
    bool chunked = false;
    bool body_expected = false;
    std::uint64_t body_bytes = 0;
    std::optional<std::uint64_t> body_limit;
    bool skip_next_body = false;
    bool keep_alive = false;
    bool closed = false;  // finish() was called

    // The event a callback paused on, and an end that follows a head at once (a skipped body).
    parse_event::kind event = parse_event::kind::need_more;
    std::string_view piece;
    bool end_pending = false;
    bool head_delivered = false;

    parse_error failure = parse_error::none;
    std::string detail;

    state(mode m, parser_limits l) : which(m), limits(l) {}

    // Records our own error; the callback then returns an error code to stop llhttp.
    int fail(parse_error e, std::string why) {
        if (failure == parse_error::none) {
            failure = e;
            detail = std::move(why);
        }
        return HPE_USER;
    }

    // Adds `length` to `total`; head_too_large naming `what` once it passes `cap`.
    int count_against(std::size_t& total, std::size_t length, std::size_t cap, const char* what) {
        total += length;
        if (total > cap) {
            return fail(parse_error::head_too_large,
                        std::string(what) + " past " + std::to_string(cap) + " bytes");
        }
        return HPE_OK;
    }
    int keep(std::size_t length) {
        return count_against(stored_bytes, length, limits.max_head_bytes, "head");
    }
    int count_trailer(std::size_t length) {
        return count_against(trailer_bytes, length, limits.max_trailer_bytes, "trailers");
    }

    static state& of(llhttp_t* p) { return *static_cast<state*>(p->data); }

    static int on_message_begin(llhttp_t* p) {
        auto& s = of(p);
        s.at = phase::head;
        s.request = request_head{};
        s.response = response_head{};
        s.field.clear();
        s.value.clear();
        s.value_started = false;
        s.head_bytes = 0;
        s.stored_bytes = 0;
        s.trailer_bytes = 0;
        s.header_count = 0;
        s.declared_length.reset();
        s.chunked = false;
        s.body_expected = false;
        s.body_bytes = 0;
        s.body_limit.reset();
        s.keep_alive = false;
        s.head_delivered = false;
        return HPE_OK;
    }

    static int on_url(llhttp_t* p, const char* at, std::size_t length) {
        auto& s = of(p);
        s.request.target.append(at, length);
        return s.keep(length);
    }

    static int on_status(llhttp_t* p, const char* at, std::size_t length) {
        auto& s = of(p);
        s.response.reason.append(at, length);
        return s.keep(length);
    }

    static int on_header_field(llhttp_t* p, const char* at, std::size_t length) {
        auto& s = of(p);
        if (s.at != phase::head) return s.count_trailer(length);
        s.field.append(at, length);
        return s.keep(length);
    }

    static int on_header_value(llhttp_t* p, const char* at, std::size_t length) {
        auto& s = of(p);
        if (s.at != phase::head) return s.count_trailer(length);
        if (s.value_started && !(s.value_split && at == s.feed_begin)) {
            return s.fail(parse_error::malformed, "obsolete line folding in a header value");
        }
        s.value_started = true;
        s.value_split = at + length == s.feed_end;
        s.value.append(at, length);
        return s.keep(length);
    }

    static int on_header_value_complete(llhttp_t* p) {
        auto& s = of(p);
        s.value_started = false;
        if (s.at != phase::head) return HPE_OK;  // a trailer: dropped
        if (++s.header_count > s.limits.max_header_count) {
            return s.fail(parse_error::too_many_headers,
                          "more than " + std::to_string(s.limits.max_header_count) + " headers");
        }
        // llhttp 8.1 (loose mode) lets a space into a name: refused, as RFC 9112 asks.
        if (!is_token(s.field)) return s.fail(parse_error::malformed, "invalid header name");
        if (!is_valid_header_value(s.value)) {
            return s.fail(parse_error::malformed, "invalid header value character");
        }
        const auto value_length = trim_trailing_space(s.value).size();
        s.value.resize(value_length);
        auto& headers = s.which == mode::request ? s.request.headers : s.response.headers;
        headers.add(std::exchange(s.field, {}), std::exchange(s.value, {}));
        return HPE_OK;
    }

    static int on_headers_complete(llhttp_t* p) {
        auto& s = of(p);
        if (p->http_major != 1 || p->http_minor > 1) {
            s.fail(parse_error::unsupported, "HTTP version " + std::to_string(p->http_major) + "." +
                                                 std::to_string(p->http_minor));
            return -1;
        }
        s.at = phase::body;
        if (s.which == mode::request) {
            if (p->method == HTTP_CONNECT) {
                s.fail(parse_error::unsupported, "CONNECT is not supported");
                return -1;
            }
            // RFC 9112 3.2: a server answers 400 to more than one Host; two proxies could each
            // route by a different one.
            if (s.request.headers.find_all("host").size() > 1) {
                s.fail(parse_error::malformed, "more than one Host header");
                return -1;
            }
            s.request.method = llhttp_method_name(static_cast<llhttp_method_t>(p->method));
            s.request.version_minor = p->http_minor;
        } else {
            // llhttp 8.1 accepts a status of fewer than three digits ("HTTP/1.1 20 OK").
            if (p->status_code < 100 || p->status_code > 999) {
                s.fail(parse_error::malformed, "status code is not three digits");
                return -1;
            }
            if (p->status_code == 101) {
                s.fail(parse_error::unsupported, "protocol upgrade (101) is not supported");
                return -1;
            }
            s.response.status = p->status_code;
            s.response.version_minor = p->http_minor;
        }
        // An Upgrade request is answered as plain HTTP/1.1 (the upgrade is declined), so llhttp
        // must not hand the bytes after it to "another protocol".
        p->upgrade = 0;
        s.chunked = (p->flags & F_CHUNKED) != 0;
        if ((p->flags & F_CONTENT_LENGTH) != 0 && !s.chunked) s.declared_length = p->content_length;
        const bool final_status = s.which == mode::request || p->status_code >= 200;
        const bool skip = s.which == mode::response && final_status && s.skip_next_body;
        if (final_status) s.skip_next_body = false;
        const bool no_body_status =
            s.which == mode::response &&
            (p->status_code < 200 || p->status_code == 204 || p->status_code == 304);
        if (skip || no_body_status) {
            s.body_expected = false;
            s.declared_length.reset();
            s.chunked = false;
            // No body, whatever Content-Length says (llhttp would read one after a 204 or 304):
            // 1 tells llhttp so; it completes the message at once, and on_message_complete holds
            // the end back until the head has been delivered.
            return 1;
        }
        if (s.which == mode::request) {
            s.body_expected = s.chunked || (s.declared_length && *s.declared_length > 0);
        } else {
            s.body_expected = !s.declared_length || *s.declared_length > 0;
        }
        s.event = parse_event::kind::head;
        s.head_delivered = true;
        return HPE_PAUSED;
    }

    static int on_body(llhttp_t* p, const char* at, std::size_t length) {
        auto& s = of(p);
        if (length == 0) return HPE_OK;
        s.body_bytes += length;
        if (s.body_limit && s.body_bytes > *s.body_limit) {
            return s.fail(parse_error::body_too_large,
                          "body past " + std::to_string(*s.body_limit) + " bytes");
        }
        s.event = parse_event::kind::body;
        s.piece = std::string_view(at, length);
        return HPE_PAUSED;
    }

    static int on_message_complete(llhttp_t* p) {
        auto& s = of(p);
        s.at = phase::done;
        s.lines.reset();
        s.keep_alive = llhttp_should_keep_alive(p) != 0;
        if (!s.head_delivered) {
            s.event = parse_event::kind::head;
            s.head_delivered = true;
            s.end_pending = true;
        } else {
            s.event = parse_event::kind::end;
        }
        return HPE_PAUSED;
    }

    parse_event error_event() const {
        parse_event e;
        e.what = parse_event::kind::error;
        return e;
    }

    void map_llhttp_error(llhttp_errno_t code) {
        if (failure != parse_error::none) return;  // ours, set by a callback
        failure = parse_error::malformed;
        if (code == HPE_INVALID_EOF_STATE) failure = parse_error::truncated;
        if (code == HPE_PAUSED_UPGRADE) failure = parse_error::unsupported;
        if (code == HPE_PAUSED_H2_UPGRADE) {
            failure = parse_error::unsupported;
            detail = "HTTP version 2 (connection preface)";
            return;
        }
        const char* reason = llhttp_get_error_reason(&parser);
        detail = reason != nullptr && *reason != '\0' ? reason : llhttp_errno_name(code);
    }
};

message_parser::message_parser(mode m, parser_limits limits)
    : state_(std::make_unique<state>(m, limits)) {
    auto& s = *state_;
    llhttp_settings_init(&s.settings);
    s.settings.on_message_begin = &state::on_message_begin;
    s.settings.on_url = &state::on_url;
    s.settings.on_status = &state::on_status;
    s.settings.on_header_field = &state::on_header_field;
    s.settings.on_header_value = &state::on_header_value;
    s.settings.on_header_value_complete = &state::on_header_value_complete;
    s.settings.on_headers_complete = &state::on_headers_complete;
    s.settings.on_body = &state::on_body;
    s.settings.on_message_complete = &state::on_message_complete;
    llhttp_init(&s.parser, m == mode::request ? HTTP_REQUEST : HTTP_RESPONSE, &s.settings);
    s.parser.data = &s;
}

message_parser::~message_parser() = default;
message_parser::message_parser(message_parser&&) noexcept = default;
message_parser& message_parser::operator=(message_parser&&) noexcept = default;

parse_event message_parser::feed(std::string_view input) {
    auto& s = *state_;
    if (s.failure != parse_error::none) return s.error_event();
    if (s.end_pending) {
        s.end_pending = false;
        parse_event e;
        e.what = parse_event::kind::end;
        return e;
    }
    if (s.closed) {
        s.fail(parse_error::malformed, "bytes after the end of the connection");
        return s.error_event();
    }
    // An empty input still runs llhttp: after a head without a body the end needs no bytes.
    if (input.data() == nullptr) input = std::string_view("", 0);

    const bool counting_head = s.at != phase::body;
    if (std::string why; !s.lines.scan(input, why)) {
        s.fail(parse_error::malformed, std::move(why));
        return s.error_event();
    }
    s.event = parse_event::kind::need_more;
    s.feed_begin = input.data();
    s.feed_end = input.data() + input.size();
    const auto code = llhttp_execute(&s.parser, input.data(), input.size());
    parse_event e;
    if (code == HPE_OK) {
        e.consumed = input.size();
    } else if (code == HPE_PAUSED) {
        e.consumed = static_cast<std::size_t>(llhttp_get_error_pos(&s.parser) - input.data());
        llhttp_resume(&s.parser);
    } else {
        s.map_llhttp_error(code);
        return s.error_event();
    }
    if (counting_head) {
        s.head_bytes += e.consumed;
        if (s.head_bytes > s.limits.max_head_bytes) {
            s.fail(parse_error::head_too_large,
                   "head past " + std::to_string(s.limits.max_head_bytes) + " bytes");
            return s.error_event();
        }
    }
    e.what = s.event;
    if (e.what == parse_event::kind::body) e.body = s.piece;
    return e;
}

parse_event message_parser::finish() {
    auto& s = *state_;
    if (s.failure != parse_error::none) return s.error_event();
    if (s.end_pending) return feed({});
    if (s.closed) return parse_event{};
    s.closed = true;
    if (s.at == phase::idle || s.at == phase::done) return parse_event{};
    s.event = parse_event::kind::need_more;
    const auto code = llhttp_finish(&s.parser);
    if (code == HPE_PAUSED) {  // on_message_complete: a body that ran to the end of the stream
        llhttp_resume(&s.parser);
        parse_event e;
        e.what = s.event;
        return e;
    }
    if (code == HPE_OK) {
        s.fail(parse_error::truncated, "the peer closed before the message ended");
    } else {
        s.map_llhttp_error(code);
        if (s.failure == parse_error::malformed) s.failure = parse_error::truncated;
        s.detail = "the peer closed before the message ended";
    }
    return s.error_event();
}

request_head& message_parser::request() noexcept {
    return state_->request;
}
response_head& message_parser::response() noexcept {
    return state_->response;
}

std::optional<std::uint64_t> message_parser::content_length() const noexcept {
    return state_->declared_length;
}
bool message_parser::is_chunked() const noexcept {
    return state_->chunked;
}
bool message_parser::has_body() const noexcept {
    return state_->body_expected;
}

bool message_parser::set_body_limit(std::uint64_t max_bytes) {
    auto& s = *state_;
    s.body_limit = max_bytes;
    if ((s.declared_length && *s.declared_length > max_bytes) || s.body_bytes > max_bytes) {
        s.fail(parse_error::body_too_large, "body past " + std::to_string(max_bytes) + " bytes");
        return false;
    }
    return true;
}

void message_parser::expect_no_body() noexcept {
    state_->skip_next_body = true;
}
bool message_parser::keep_alive() const noexcept {
    return state_->keep_alive;
}

bool message_parser::is_between_messages() const noexcept {
    return state_->at == phase::idle || state_->at == phase::done;
}
bool message_parser::is_in_body() const noexcept {
    return state_->at == phase::body;
}
std::uint64_t message_parser::body_bytes() const noexcept {
    return state_->body_bytes;
}
parse_error message_parser::error() const noexcept {
    return state_->failure;
}
const std::string& message_parser::error_detail() const noexcept {
    return state_->detail;
}

}  // namespace moat::http
