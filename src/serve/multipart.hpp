// An incremental multipart/form-data parser (RFC 7578 over RFC 2046) for envd's `POST /files`.
//
// The body arrives in pieces (server_request::async_read_some); each piece is fed to the parser,
// which appends what it found to a vector of events: the start of a part (its parsed headers),
// pieces of the part's data, the end of the part, and the closing boundary. The caller acts on
// the events (writes the data into the sandbox) before feeding the next piece, so however large a
// part is, the parser holds at most one boundary's length of it between calls.
//
//     auto boundary = multipart_boundary(content_type);        // result<std::string>
//     multipart_parser parser(*boundary);
//     std::vector<multipart_event> events;
//     while (piece = co_await request.async_read_some(), !piece->empty()) {
//         events.clear();
//         if (auto fed = parser.feed(*piece, events); !fed) ... 400
//         for (auto& e : events) ...                           // part_begin / data / part_end
//     }
//     if (auto done = parser.finish(); !done) ... 400          // no closing boundary
//
// Bounded: the boundary is at most limits.max_boundary_bytes (RFC 2046: 70), a part's header block
// at most limits.max_header_bytes, the preamble before the first boundary at most as long, and a
// body at most limits.max_parts parts. Anything past a bound, malformed headers, or bytes that are
// not a delimiter where one must be, is protocol_error with a one-line detail; the parser then
// refuses every later feed. After the closing boundary the epilogue is ignored.
//
// Line breaks are CRLF as RFC 2046 requires; a delimiter is CRLF "--" boundary, so a part's data
// is exactly the bytes between its header block and the CRLF before the next delimiter. Transport
// padding (spaces and tabs) after a boundary is accepted, as Go's mime/multipart (envd) does.
//
// A pure state machine over bytes: no I/O, unit-tested (tests/multipart_test.cpp) and fuzzed
// (fuzz/multipart_fuzzer.cpp).
#pragma once

#include <moat/result.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moat::serve {

struct multipart_limits {
    std::size_t max_boundary_bytes = 70;
    std::size_t max_header_bytes = 8 * 1024;  // one part's header block, and the preamble
    std::size_t max_parts = 64;
};

// One part's headers. Names as sent; `name` and `filename` from Content-Disposition's parameters
// (quoted strings unescaped; a filename is taken as sent, never percent-decoded, as Go does).
struct multipart_part_head {
    std::vector<std::pair<std::string, std::string>> headers;
    std::string disposition;  // "form-data", lower-cased; empty without Content-Disposition
    std::string name;
    std::string filename;
    bool has_filename = false;
    std::string content_type;  // as sent; empty when absent
};

struct multipart_event {
    enum class kind {
        part_begin,  // head is set
        data,        // data holds the next bytes of the current part (never empty)
        part_end,
        finished,  // the closing boundary: no more parts
    };
    kind type = kind::data;
    multipart_part_head head;
    std::string data;
};

// The boundary parameter of a multipart Content-Type ("multipart/form-data; boundary=xyz", the
// value possibly quoted). invalid_argument when the type is not multipart/form-data, or the
// boundary is missing, empty, longer than `max_boundary_bytes` or has a byte RFC 2046 forbids.
result<std::string> multipart_boundary(std::string_view content_type,
                                       std::size_t max_boundary_bytes = 70);

class multipart_parser {
  public:
    explicit multipart_parser(std::string boundary, multipart_limits limits = {});

    // Parses `piece`, appending events to `out`. protocol_error (see above) leaves `out` with the
    // events before the fault and the parser failed.
    result<void> feed(std::string_view piece, std::vector<multipart_event>& out);
    // The end of the body: protocol_error unless the closing boundary was seen.
    result<void> finish() const;

    bool is_finished() const noexcept { return state_ == state::epilogue; }
    // Bytes held between feeds (a possible delimiter's prefix, an unfinished header block).
    std::size_t buffered() const noexcept { return buffer_.size(); }
    std::size_t parts() const noexcept { return parts_; }

  private:
    enum class state { preamble, after_delimiter, headers, body, epilogue, failed };
    result<void> fail(std::string detail);
    result<void> parse_head(std::string_view block, multipart_part_head& head);

    std::string delimiter_;  // CRLF "--" boundary
    multipart_limits limits_;
    state state_ = state::preamble;
    std::string buffer_;
    std::size_t preamble_bytes_ = 0;
    std::size_t parts_ = 0;
};

}  // namespace moat::serve
