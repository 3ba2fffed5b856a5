#include "http/message.hpp"

#include <algorithm>
#include <array>

namespace moat::http {

namespace {

std::string_view trim(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

bool is_valid_target(std::string_view s) noexcept {
    if (s.empty()) return false;
    return std::all_of(s.begin(), s.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u > 0x20 && u != 0x7f;
    });
}

bool append_headers(std::string& out, const header_list& headers) {
    for (const auto& h : headers) {
        if (!is_token(h.name) || !is_valid_header_value(h.value)) return false;
    }
    for (const auto& h : headers) {
        out.append(h.name).append(": ").append(h.value).append("\r\n");
    }
    out.append("\r\n");
    return true;
}

}  // namespace

bool is_secret_header(std::string_view name) noexcept {
    static constexpr std::array<std::string_view, 6> secrets = {
        "authorization", "proxy-authorization", "x-api-key", "x-access-token",
        "cookie",        "set-cookie"};
    return std::any_of(secrets.begin(), secrets.end(),
                       [name](std::string_view s) { return iequals(s, name); });
}

void header_list::add(std::string name, std::string value) {
    items_.push_back(header{std::move(name), std::move(value)});
}

void header_list::set(std::string_view name, std::string value) {
    remove(name);
    items_.push_back(header{std::string(name), std::move(value)});
}

std::size_t header_list::remove(std::string_view name) {
    const auto before = items_.size();
    std::erase_if(items_, [name](const header& h) { return iequals(h.name, name); });
    return before - items_.size();
}

std::optional<std::string_view> header_list::find(std::string_view name) const {
    for (const auto& h : items_) {
        if (iequals(h.name, name)) return std::string_view(h.value);
    }
    return std::nullopt;
}

std::vector<std::string_view> header_list::find_all(std::string_view name) const {
    std::vector<std::string_view> values;
    for (const auto& h : items_) {
        if (iequals(h.name, name)) values.emplace_back(h.value);
    }
    return values;
}

bool header_list::has_token(std::string_view name, std::string_view token) const {
    for (const auto& h : items_) {
        if (!iequals(h.name, name)) continue;
        std::string_view rest = h.value;
        while (!rest.empty()) {
            const auto comma = rest.find(',');
            const auto element = trim(rest.substr(0, comma));
            if (iequals(element, token)) return true;
            if (comma == std::string_view::npos) break;
            rest.remove_prefix(comma + 1);
        }
    }
    return false;
}

std::string_view request_head::path() const noexcept {
    const std::string_view t = target;
    return t.substr(0, t.find('?'));
}

std::string_view request_head::query() const noexcept {
    const std::string_view t = target;
    const auto q = t.find('?');
    if (q == std::string_view::npos) return {};
    return t.substr(q + 1);
}

std::string_view reason_phrase(int status) noexcept {
    switch (status) {
        case 100:
            return "Continue";
        case 101:
            return "Switching Protocols";
        case 200:
            return "OK";
        case 201:
            return "Created";
        case 202:
            return "Accepted";
        case 204:
            return "No Content";
        case 206:
            return "Partial Content";
        case 301:
            return "Moved Permanently";
        case 302:
            return "Found";
        case 304:
            return "Not Modified";
        case 307:
            return "Temporary Redirect";
        case 308:
            return "Permanent Redirect";
        case 400:
            return "Bad Request";
        case 401:
            return "Unauthorized";
        case 403:
            return "Forbidden";
        case 404:
            return "Not Found";
        case 405:
            return "Method Not Allowed";
        case 408:
            return "Request Timeout";
        case 409:
            return "Conflict";
        case 411:
            return "Length Required";
        case 413:
            return "Content Too Large";
        case 414:
            return "URI Too Long";
        case 415:
            return "Unsupported Media Type";
        case 421:
            return "Misdirected Request";
        case 422:
            return "Unprocessable Content";
        case 429:
            return "Too Many Requests";
        case 431:
            return "Request Header Fields Too Large";
        case 500:
            return "Internal Server Error";
        case 501:
            return "Not Implemented";
        case 502:
            return "Bad Gateway";
        case 503:
            return "Service Unavailable";
        case 504:
            return "Gateway Timeout";
        case 505:
            return "HTTP Version Not Supported";
        default:
            return "Unknown";
    }
}

bool is_token(std::string_view s) noexcept {
    if (s.empty()) return false;
    return std::all_of(s.begin(), s.end(), [](char c) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
            return true;
        }
        return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    });
}

bool is_valid_header_value(std::string_view s) noexcept {
    return std::all_of(s.begin(), s.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u == '\t' || (u >= 0x20 && u != 0x7f);
    });
}

bool append_request_head(std::string& out, const request_head& head) {
    if (!is_token(head.method) || !is_valid_target(head.target)) return false;
    std::string text;
    text.append(head.method).append(" ").append(head.target);
    text.append(head.version_minor == 0 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n");
    if (!append_headers(text, head.headers)) return false;
    out.append(text);
    return true;
}

bool append_response_head(std::string& out, const response_head& head) {
    if (head.status < 100 || head.status > 999) return false;
    std::string_view reason = head.reason;
    if (reason.empty()) reason = reason_phrase(head.status);
    if (!is_valid_header_value(reason)) return false;
    std::string text;
    text.append(head.version_minor == 0 ? "HTTP/1.0 " : "HTTP/1.1 ");
    text.append(std::to_string(head.status)).append(" ").append(reason).append("\r\n");
    if (!append_headers(text, head.headers)) return false;
    out.append(text);
    return true;
}

}  // namespace moat::http
