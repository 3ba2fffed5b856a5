// Independent UTF-8 checks for tests and fuzzers of text moat writes (deliberately not moat's own
// decoder: a check must not share the code it checks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moat::test {

// Strict UTF-8: no overlongs, surrogates, code points past U+10FFFF or truncated sequences.
inline bool is_valid_utf8(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        std::size_t n = 0;
        std::uint32_t cp = 0;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            n = 2;
            cp = c & 0x1FU;
        } else if ((c & 0xF0) == 0xE0) {
            n = 3;
            cp = c & 0x0FU;
        } else if ((c & 0xF8) == 0xF0) {
            n = 4;
            cp = c & 0x07U;
        } else {
            return false;
        }
        if (i + n > s.size()) return false;
        for (std::size_t k = 1; k < n; ++k) {
            const auto d = static_cast<unsigned char>(s[i + k]);
            if ((d & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (d & 0x3FU);
        }
        constexpr std::uint32_t min_for_length[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_for_length[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return false;
        }
        i += n;
    }
    return true;
}

// Whether valid UTF-8 `s` holds a C1 control character (U+0080..U+009F).
inline bool has_c1_control(std::string_view s) {
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        const auto d = static_cast<unsigned char>(s[i + 1]);
        if (c == 0xC2 && d >= 0x80 && d <= 0x9F) return true;
    }
    return false;
}

// Code points in valid UTF-8 `s`.
inline std::size_t count_chars(std::string_view s) {
    std::size_t n = 0;
    for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    return n;
}

}  // namespace moat::test
