// HTTP/1.1 message heads, shared by the server and the client: a request's method and target, a
// response's status, and the header list (names compared case-insensitively, order and repeats
// kept as on the wire).
//
// The parser (message_parser.hpp) fills these from the wire; the writers below turn them back into
// bytes. A writer refuses a head that would break framing (a CR, LF or NUL in a value, a name that
// is not a token, a method that is not a token, a target with a space or a control byte), so a
// caller's string can never inject a header or a second message.
#pragma once

#include "core/ascii.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat::http {

// ASCII case-insensitive equality (header names, tokens such as "chunked" or "close").
using detail::iequals;

// Headers whose values are credentials (Authorization, Proxy-Authorization, X-API-Key,
// X-Access-Token, Cookie, Set-Cookie): never logged, never put in an error detail.
bool is_secret_header(std::string_view name) noexcept;

struct header {
    std::string name;
    std::string value;
};

// The headers of one message, in wire order. Lookups are case-insensitive on the name.
class header_list {
  public:
    using const_iterator = std::vector<header>::const_iterator;

    void add(std::string name, std::string value);
    // Replaces every header of that name with one (or adds it).
    void set(std::string_view name, std::string value);
    // Removes every header of that name; returns how many there were.
    std::size_t remove(std::string_view name);

    // The first value of that name, if any.
    std::optional<std::string_view> find(std::string_view name) const;
    bool contains(std::string_view name) const { return find(name).has_value(); }
    // Every value of that name, in order.
    std::vector<std::string_view> find_all(std::string_view name) const;
    // True when a header of that name lists `token` among its comma-separated elements
    // (case-insensitive): has_token("connection", "close").
    bool has_token(std::string_view name, std::string_view token) const;

    std::size_t size() const noexcept { return items_.size(); }
    bool empty() const noexcept { return items_.empty(); }
    const_iterator begin() const noexcept { return items_.begin(); }
    const_iterator end() const noexcept { return items_.end(); }
    void clear() noexcept { items_.clear(); }

  private:
    std::vector<header> items_;
};

struct request_head {
    std::string method;     // as on the wire, upper case: "GET", "POST"
    std::string target;     // the request-target as sent: "/sandboxes/abc?x=1"
    int version_minor = 1;  // HTTP/1.<minor>: 1, or 0 for HTTP/1.0
    header_list headers;

    // The target without its query ("/sandboxes/abc") and the query without its '?' ("x=1").
    std::string_view path() const noexcept;
    std::string_view query() const noexcept;
};

struct response_head {
    int status = 200;
    std::string reason;  // as received; empty means the standard phrase when writing
    int version_minor = 1;
    header_list headers;
};

// The standard reason phrase of a status ("Not Found"), or "Unknown".
std::string_view reason_phrase(int status) noexcept;

// Token characters (RFC 9110 tchar), for header names and methods.
bool is_token(std::string_view s) noexcept;
// A header value that can be written as is: no CR, LF or NUL, no other control byte but HTAB.
bool is_valid_header_value(std::string_view s) noexcept;

// Append the head ("GET /x HTTP/1.1\r\nName: value\r\n...\r\n") to `out`. Return false, and
// append nothing, when a method, target, name or value would break framing (see above).
bool append_request_head(std::string& out, const request_head& head);
bool append_response_head(std::string& out, const response_head& head);

}  // namespace moat::http
