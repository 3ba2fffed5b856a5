#include "egress/proxy_request.hpp"

#include "core/ascii.hpp"

#include <array>

namespace moat::egress {
namespace {

bool is_token_char(char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    constexpr std::string_view extra = "!#$%&'*+-.^_`|~";
    return extra.find(c) != std::string_view::npos;
}

bool is_target_char(char c) {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7F;
}

using detail::iequals;

bool is_hop_by_hop(std::string_view name) {
    for (std::string_view h :
         {"connection", "keep-alive", "proxy-connection", "proxy-authorization",
          "proxy-authenticate", "te", "upgrade", "trailer", "host"}) {
        if (iequals(name, h)) return true;
    }
    return false;
}

parse_outcome refuse(int status, std::string reason) {
    parse_outcome out;
    out.state = parse_outcome::state::refused;
    out.status = status;
    out.reason = std::move(reason);
    return out;
}

// host[:port] or [v6][:port]; `port_required` for CONNECT. Sets host/port or returns a reason.
std::string parse_authority(std::string_view authority, bool port_required, proxy_request& out) {
    if (authority.empty()) return "the request names no host";
    if (authority.find('@') != std::string_view::npos) {
        return "the request's URL carries credentials (user@host), which the proxy does not pass";
    }
    std::string_view host;
    std::string_view rest;
    if (authority.front() == '[') {
        const auto close = authority.find(']');
        if (close == std::string_view::npos) return "the request's IPv6 host has no closing ']'";
        host = authority.substr(1, close - 1);
        rest = authority.substr(close + 1);
        out.host_is_ipv6_literal = true;
        if (host.empty()) return "the request names no host";
    } else {
        const auto colon = authority.find(':');
        host = authority.substr(0, colon);
        rest = colon == std::string_view::npos ? std::string_view{} : authority.substr(colon);
        if (host.empty()) return "the request names no host";
    }
    if (rest.empty()) {
        if (port_required) return "a CONNECT target needs host:port";
        out.port = 80;
    } else {
        if (rest.front() != ':')
            return "the request's host is followed by something other than a port";
        auto port = detail::parse_port(rest.substr(1));
        if (!port) return "the request's port is not 1-65535";
        out.port = *port;
    }
    out.host = std::string(host);
    return {};
}

}  // namespace

const char* status_phrase(int status) noexcept {
    switch (status) {
        case 200:
            return "Connection established";
        case 400:
            return "Bad Request";
        case 403:
            return "Forbidden";
        case 408:
            return "Request Timeout";
        case 414:
            return "URI Too Long";
        case 429:
            return "Too Many Requests";
        case 431:
            return "Request Header Fields Too Large";
        case 502:
            return "Bad Gateway";
        case 504:
            return "Gateway Timeout";
    }
    return "Error";
}

parse_outcome parse_proxy_request(std::string_view buffered, const request_caps& caps) {
    const auto line_end = buffered.find("\r\n");
    if (line_end == std::string_view::npos) {
        if (buffered.size() > caps.max_request_line_bytes) {
            return refuse(414, "the request line is longer than " +
                                   std::to_string(caps.max_request_line_bytes) + " bytes");
        }
        if (buffered.find('\n') != std::string_view::npos) {
            return refuse(400, "the request line does not end in CRLF");
        }
        return {};
    }
    if (line_end > caps.max_request_line_bytes) {
        return refuse(414, "the request line is longer than " +
                               std::to_string(caps.max_request_line_bytes) + " bytes");
    }
    const auto head_end = buffered.find("\r\n\r\n");
    if (head_end == std::string_view::npos) {
        if (buffered.size() > caps.max_head_bytes) {
            return refuse(431, "the request head is larger than " +
                                   std::to_string(caps.max_head_bytes) + " bytes");
        }
        // Count headers as they arrive so a flood of small ones is refused early.
        std::size_t lines = 0;
        for (std::size_t at = line_end + 2;
             (at = buffered.find("\r\n", at)) != std::string_view::npos; at += 2) {
            if (++lines > caps.max_headers) {
                return refuse(431, "the request has more than " + std::to_string(caps.max_headers) +
                                       " headers");
            }
        }
        return {};
    }
    if (head_end + 4 > caps.max_head_bytes) {
        return refuse(431, "the request head is larger than " +
                               std::to_string(caps.max_head_bytes) + " bytes");
    }

    // Request line: METHOD SP target SP HTTP/1.x
    const auto line = buffered.substr(0, line_end);
    const auto sp1 = line.find(' ');
    const auto sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
        line.find(' ', sp2 + 1) != std::string_view::npos) {
        return refuse(400, "the request line is not METHOD TARGET HTTP/1.x");
    }
    const auto method = line.substr(0, sp1);
    const auto target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const auto version = line.substr(sp2 + 1);
    if (method.empty()) return refuse(400, "the request line has no method");
    for (char c : method) {
        if (!is_token_char(c)) return refuse(400, "the request method has a bad character");
    }
    if (version != "HTTP/1.1" && version != "HTTP/1.0") {
        return refuse(400, "the request is not HTTP/1.0 or HTTP/1.1");
    }
    if (target.empty()) return refuse(400, "the request line has no target");
    for (char c : target) {
        if (!is_target_char(c)) return refuse(400, "the request target has a bad character");
    }

    parse_outcome out;
    auto& request = out.request;
    std::string_view path;
    if (method == "CONNECT") {
        request.is_connect = true;
        if (target.size() > caps.max_connect_target_bytes) {
            return refuse(400, "the CONNECT target is longer than " +
                                   std::to_string(caps.max_connect_target_bytes) + " bytes");
        }
        if (auto why = parse_authority(target, true, request); !why.empty())
            return refuse(400, why);
    } else {
        constexpr std::string_view http = "http://";
        if (target.front() == '/' || target == "*") {
            return refuse(400,
                          "this is a proxy: send an absolute URL (http://host/path) or CONNECT");
        }
        if (target.size() >= 8 && iequals(target.substr(0, 8), "https://")) {
            return refuse(400, "an https:// URL goes through CONNECT, not a plain request");
        }
        if (target.size() < http.size() || !iequals(target.substr(0, http.size()), http)) {
            return refuse(400, "the request URL is not http://");
        }
        auto rest = target.substr(http.size());
        const auto slash = rest.find_first_of("/?#");
        const auto authority = rest.substr(0, slash);
        path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash);
        if (auto why = parse_authority(authority, false, request); !why.empty()) {
            return refuse(400, why);
        }
        if (const auto hash = path.find('#'); hash != std::string_view::npos) {
            path = path.substr(0, hash);
        }
    }

    // Headers.
    std::string forwarded;
    std::size_t count = 0;
    std::size_t at = line_end + 2;
    while (at < head_end + 2) {
        const auto end = buffered.find("\r\n", at);
        const auto header = buffered.substr(at, end - at);
        at = end + 2;
        if (++count > caps.max_headers) {
            return refuse(
                431, "the request has more than " + std::to_string(caps.max_headers) + " headers");
        }
        if (header.empty()) break;
        if (header.front() == ' ' || header.front() == '\t') {
            return refuse(400, "the request has a folded header line");
        }
        const auto colon = header.find(':');
        if (colon == std::string_view::npos || colon == 0) {
            return refuse(400, "the request has a header line without a name");
        }
        const auto name = header.substr(0, colon);
        for (char c : name) {
            if (!is_token_char(c)) return refuse(400, "a request header name has a bad character");
        }
        for (char c : header.substr(colon + 1)) {
            const auto u = static_cast<unsigned char>(c);
            if ((u < 0x20 && c != '\t') || u == 0x7F || c == '\n') {
                return refuse(400, "a request header value has a control byte");
            }
        }
        if (!request.is_connect && !is_hop_by_hop(name)) {
            forwarded.append(header);
            forwarded += "\r\n";
        }
    }
    request.head_bytes = head_end + 4;

    if (!request.is_connect) {
        std::string head;
        head.reserve(head_end + 64);
        head.append(method);
        head += ' ';
        if (path.empty() || path.front() == '?') head += '/';
        head.append(path);
        head += ' ';
        head.append(version);
        head += "\r\nHost: ";
        if (request.host_is_ipv6_literal) {
            head += '[' + request.host + ']';
        } else {
            head += request.host;
        }
        if (request.port != 80) head += ':' + std::to_string(request.port);
        head += "\r\n";
        head += forwarded;
        head += "Connection: close\r\n\r\n";
        request.upstream_head = std::move(head);
    }
    out.state = parse_outcome::state::complete;
    return out;
}

}  // namespace moat::egress
