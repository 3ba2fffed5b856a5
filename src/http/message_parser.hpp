// Incremental HTTP/1.1 framing over llhttp, for requests (the server) and responses (the client).
//
// A pure parser of untrusted bytes: no I/O, no allocation beyond the head it keeps, bounded by
// parser_limits. The caller feeds whatever it has read; each feed() stops at the first event and
// says how many bytes it used, so the caller keeps the rest and feeds it again (after acting on the
// event). Body bytes are not copied: a body event is a view into the caller's input, valid until
// the caller reuses that buffer, so a reader that stops asking for body pieces stops reading the
// socket (backpressure).
//
//     message_parser p(message_parser::mode::request);
//     for (;;) {
//         parse_event e = p.feed(buffered);            // buffered: bytes read, not yet used
//         buffered.remove_prefix(e.consumed);
//         switch (e.what) {
//             case parse_event::kind::need_more: read more, then feed again
//             case parse_event::kind::head:      p.request() is complete; p.set_body_limit(...)
//             case parse_event::kind::body:      e.body is the next piece of the body
//             case parse_event::kind::end:       the message is complete; p.keep_alive()
//             case parse_event::kind::error:     p.error(), p.error_detail(); framing is lost
//         }
//     }
//
// Framing: Content-Length and chunked bodies (chunk extensions ignored, trailers parsed and
// dropped, their size capped like a head), a response body read to the end of the connection
// (finish()), keep-alive per HTTP/1.0 and 1.1 rules, pipelined messages one after another. Strict:
// Content-Length with Transfer-Encoding, a duplicate differing Content-Length, an unknown transfer
// coding, a bare LF line end anywhere in a head (the blank line included), obsolete line folding
// (any field line that starts with a space or tab, whether or not the line it continues was empty)
// and, in a request, more than one Host are errors (request smuggling, a proxy and moat reading
// different values). Empty lines (CRLF) before a request line are skipped, as RFC 9112 asks.
// CONNECT and protocol upgrades are not supported (error unsupported), nor is HTTP/0.9.
//
// After an error the parser stays failed: every later feed returns the same error. Error details
// come from llhttp's reasons and our caps; they never quote header values.
#pragma once

#include "http/message.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace moat::http {

struct parser_limits {
    // The request or status line plus the headers and their line ends, per message: past it, error
    // head_too_large (a server answers 431).
    std::size_t max_head_bytes = 64 * 1024;
    // Header fields per message: past it, error too_many_headers (431).
    std::size_t max_header_count = 128;
    // A chunked body's trailer section (parsed, then dropped): past it, error head_too_large.
    std::size_t max_trailer_bytes = 16 * 1024;
};

enum class parse_error {
    none,
    malformed,         // the bytes are not HTTP/1.1 (a server answers 400; framing is lost)
    head_too_large,    // past max_head_bytes or max_trailer_bytes (431)
    too_many_headers,  // past max_header_count (431)
    body_too_large,    // past the limit given to set_body_limit() (413)
    truncated,         // the peer closed in the middle of a message (finish())
    unsupported,       // CONNECT, an upgrade, a version other than HTTP/1.0 or 1.1 (501/505)
};

// The name of a parse_error ("head_too_large"), for details and logs.
const char* to_string(parse_error e) noexcept;

struct parse_event {
    enum class kind { need_more, head, body, end, error };
    kind what = kind::need_more;
    // Bytes of the input this call used. The rest was not looked at: feed it again.
    std::size_t consumed = 0;
    // kind::body only: the next piece of the body, a view into the input given to feed().
    std::string_view body;
};

class message_parser {
  public:
    enum class mode { request, response };

    explicit message_parser(mode m, parser_limits limits = {});
    ~message_parser();
    message_parser(message_parser&&) noexcept;
    message_parser& operator=(message_parser&&) noexcept;
    message_parser(const message_parser&) = delete;
    message_parser& operator=(const message_parser&) = delete;

    // Parses `input` up to the next event (see the example above). After a head or body event,
    // call it again with what is left even when nothing is: a message without a body ends with
    // no further byte.
    parse_event feed(std::string_view input);

    // The peer closed its side. Ends a response whose body runs to the end of the connection
    // (kind::end); between messages it returns need_more (a clean close); in the middle of a
    // message it is error truncated.
    parse_event finish();

    // The head of the current message: complete from its kind::head event until the next
    // message begins (the first byte fed after kind::end). Moving out of it is allowed.
    request_head& request() noexcept;
    response_head& response() noexcept;

    // Once the head is complete: the declared body length (none for chunked or read-to-close
    // bodies), whether the body is chunked, and whether the message has a body at all.
    std::optional<std::uint64_t> content_length() const noexcept;
    bool is_chunked() const noexcept;
    bool has_body() const noexcept;

    // After the head event: a body past `max_bytes` is error body_too_large. Returns false when the
    // declared Content-Length is already past it (the error is then set).
    bool set_body_limit(std::uint64_t max_bytes);

    // Response mode, before the response's head is fed: the response has no body whatever its
    // headers say (the answer to a HEAD request). Applies to that one response.
    void expect_no_body() noexcept;

    // After kind::end: whether another message may follow on this connection (keep-alive rules of
    // the version and Connection header).
    bool keep_alive() const noexcept;

    // True when no byte of a next message has been seen: the connection can close cleanly here.
    bool is_between_messages() const noexcept;
    // True once the current message's head is complete, until its end.
    bool is_in_body() const noexcept;

    // Body bytes of the current message delivered so far.
    std::uint64_t body_bytes() const noexcept;

    parse_error error() const noexcept;
    // One line: what was wrong ("invalid header token", "head past 65536 bytes").
    const std::string& error_detail() const noexcept;

  private:
    struct state;
    std::unique_ptr<state> state_;
};

}  // namespace moat::http
