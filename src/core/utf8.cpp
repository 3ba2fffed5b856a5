#include "core/utf8.hpp"

namespace moat {

utf8_step decode_utf8(std::string_view s, std::size_t i) noexcept {
    const unsigned c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) return {1, true};
    std::size_t need = 0;
    unsigned low = 0x80;
    unsigned high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c == 0xE0) {
        need = 2;
        low = 0xA0;
    } else if (c == 0xED) {
        need = 2;
        high = 0x9F;
    } else if (c >= 0xE1 && c <= 0xEF) {
        need = 2;
    } else if (c == 0xF0) {
        need = 3;
        low = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
        need = 3;
    } else if (c == 0xF4) {
        need = 3;
        high = 0x8F;
    } else {
        return {1, false};
    }
    for (std::size_t k = 1; k <= need; ++k) {
        if (i + k >= s.size()) return {k, false};
        const unsigned d = static_cast<unsigned char>(s[i + k]);
        if (d < low || d > high) return {k, false};
        low = 0x80;
        high = 0xBF;
    }
    return {need + 1, true};
}

}  // namespace moat
