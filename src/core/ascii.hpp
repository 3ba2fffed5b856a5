// Locale-independent ASCII helpers for protocol text (header names, tokens, metadata keys):
// std::tolower and std::isalnum follow the application's locale, which must not change what a
// parser accepts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace moat::detail {

constexpr char ascii_lower(char c) noexcept {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

// Equal but for ASCII case (header names, tokens, schemes).
constexpr bool iequals(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
    return true;
}

// The value of a hexadecimal digit, or -1.
constexpr int hex_digit_value(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// `in` with its %XX escapes decoded (and, for a form-encoded query, '+' as a space); nullopt at
// a '%' not followed by two hexadecimal digits.
inline std::optional<std::string> percent_decoded(std::string_view in, bool plus_is_space) {
    std::string out;
    out.reserve(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
        const char c = in[i];
        if (c == '+' && plus_is_space) {
            out.push_back(' ');
        } else if (c == '%') {
            if (i + 2 >= in.size()) return std::nullopt;
            const int hi = hex_digit_value(in[i + 1]);
            const int lo = hex_digit_value(in[i + 2]);
            if (hi < 0 || lo < 0) return std::nullopt;
            out.push_back(static_cast<char>(hi * 16 + lo));
            i += 2;
        } else {
            out.push_back(c);
        }
    }
    return out;
}

// `in` with every byte but RFC 3986's unreserved characters (ALPHA DIGIT - . _ ~) written as
// %XX (upper-case hex): safe as a query value or a path segment.
inline std::string percent_encoded(std::string_view in) {
    static constexpr char hex[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(in.size());
    for (const char c : in) {
        const auto u = static_cast<unsigned char>(c);
        const bool unreserved = (u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') ||
                                (u >= '0' && u <= '9') || u == '-' || u == '.' || u == '_' ||
                                u == '~';
        if (unreserved) {
            out.push_back(c);
        } else {
            out.push_back('%');
            out.push_back(hex[u >> 4]);
            out.push_back(hex[u & 15]);
        }
    }
    return out;
}

// A TCP port in decimal (1 to 65535, at most five digits, nothing else); nullopt otherwise.
constexpr std::optional<std::uint16_t> parse_port(std::string_view digits) noexcept {
    if (digits.empty() || digits.size() > 5) return std::nullopt;
    unsigned value = 0;
    for (char c : digits) {
        if (c < '0' || c > '9') return std::nullopt;
        value = value * 10 + static_cast<unsigned>(c - '0');
    }
    if (value == 0 || value > 65535) return std::nullopt;
    return static_cast<std::uint16_t>(value);
}

// Appends `bytes` as lower-case hexadecimal, two digits a byte.
inline void append_hex(std::string& out, std::span<const unsigned char> bytes) {
    static constexpr char digits[] = "0123456789abcdef";
    for (const unsigned char b : bytes) {
        out += digits[b >> 4];
        out += digits[b & 15];
    }
}
inline std::string hex_encoded(std::span<const unsigned char> bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    append_hex(out, bytes);
    return out;
}
inline std::string hex_encoded(std::string_view bytes) {
    return hex_encoded(
        std::span(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()));
}

inline std::string ascii_lowered(std::string_view s) {
    std::string out(s);
    for (auto& c : out) c = ascii_lower(c);
    return out;
}

// RFC 9110 tchar: a character of a token (a header name, a media type).
constexpr bool is_token_char(char c) noexcept {
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
    return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

}  // namespace moat::detail
