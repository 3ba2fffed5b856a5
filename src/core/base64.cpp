#include "core/base64.hpp"

#include <cstdint>

namespace moat {
namespace {

constexpr std::string_view standard_alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr std::string_view url_alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string encode(std::string_view bytes, std::string_view alphabet, bool pad) {
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    std::size_t i = 0;
    for (; i + 2 < bytes.size(); i += 3) {
        const std::uint32_t n = static_cast<std::uint8_t>(bytes[i]) << 16 |
                                static_cast<std::uint8_t>(bytes[i + 1]) << 8 |
                                static_cast<std::uint8_t>(bytes[i + 2]);
        out.push_back(alphabet[n >> 18 & 63]);
        out.push_back(alphabet[n >> 12 & 63]);
        out.push_back(alphabet[n >> 6 & 63]);
        out.push_back(alphabet[n & 63]);
    }
    if (i < bytes.size()) {
        std::uint32_t n = static_cast<std::uint8_t>(bytes[i]) << 16;
        const bool two = i + 1 < bytes.size();
        if (two) n |= static_cast<std::uint8_t>(bytes[i + 1]) << 8;
        out.push_back(alphabet[n >> 18 & 63]);
        out.push_back(alphabet[n >> 12 & 63]);
        if (two) out.push_back(alphabet[n >> 6 & 63]);
        if (pad) out.append(two ? "=" : "==");
    }
    return out;
}

bool is_space(char c) {
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

std::optional<std::string> decode(std::string_view text, std::string_view alphabet,
                                  base64_padding padding) {
    const bool required = padding == base64_padding::required;
    if (required && text.size() % 4 != 0) return std::nullopt;
    std::string out;
    out.reserve(text.size() / 4 * 3 + 3);
    std::uint32_t bits = 0;
    int count = 0;  // sextets in `bits`
    std::size_t pads = 0;
    for (const char c : text) {
        if (c == '=') {
            ++pads;
            continue;
        }
        if (!required && is_space(c)) continue;
        const auto value = alphabet.find(c);
        if (value == std::string_view::npos || pads != 0) return std::nullopt;
        bits = (bits << 6) | static_cast<std::uint32_t>(value);
        if (++count == 4) {
            out.push_back(static_cast<char>((bits >> 16) & 0xff));
            out.push_back(static_cast<char>((bits >> 8) & 0xff));
            out.push_back(static_cast<char>(bits & 0xff));
            bits = 0;
            count = 0;
        }
    }
    if (count == 1 || pads > 2) return std::nullopt;
    if (pads != 0 && (count + pads) % 4 != 0) return std::nullopt;
    if (count == 2) {
        out.push_back(static_cast<char>((bits >> 4) & 0xff));
    } else if (count == 3) {
        out.push_back(static_cast<char>((bits >> 10) & 0xff));
        out.push_back(static_cast<char>((bits >> 2) & 0xff));
    }
    return out;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
    return encode(bytes, standard_alphabet, true);
}

std::string base64url_encode(std::string_view bytes) {
    return encode(bytes, url_alphabet, false);
}

std::optional<std::string> base64_decode(std::string_view text, base64_padding padding) {
    return decode(text, standard_alphabet, padding);
}

std::optional<std::string> base64url_decode(std::string_view text) {
    return decode(text, url_alphabet, base64_padding::optional);
}

}  // namespace moat
