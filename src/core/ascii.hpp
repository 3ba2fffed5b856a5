// Locale-independent ASCII helpers for protocol text (header names, tokens, metadata keys):
// std::tolower and std::isalnum follow the application's locale, which must not change what a
// parser accepts.
#pragma once

#include <string>
#include <string_view>

namespace moat::detail {

constexpr char ascii_lower(char c) noexcept {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
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
