#include "cli/terminal_safe.hpp"

#include "core/ascii.hpp"

#include <unistd.h>

namespace moat::cli {

namespace {

void render_c1(std::string& out, unsigned char byte) {
    out += "\\x";
    detail::append_hex(out, std::span(&byte, 1));
}

// Continuation bytes a UTF-8 lead byte announces; 0 for ASCII, -1 for a byte that is no lead.
int expected_continuations(unsigned char byte) {
    if (byte < 0x80) return 0;
    if (byte >= 0xc2 && byte <= 0xdf) return 1;
    if (byte >= 0xe0 && byte <= 0xef) return 2;
    if (byte >= 0xf0 && byte <= 0xf4) return 3;
    return -1;
}

}  // namespace

std::string terminal_safe::filter(std::string_view data) {
    std::string out;
    out.reserve(data.size());
    for (const char c : data) {
        const auto byte = static_cast<unsigned char>(c);
        if (held_c2_) {
            held_c2_ = false;
            if (byte >= 0x80 && byte <= 0x9f) {
                render_c1(out, byte);  // U+0080..U+009F: a C1 control in UTF-8
                continue;
            }
            out += '\xc2';
            if (byte >= 0xa0 && byte <= 0xbf) {
                out += c;
                continue;
            }
            // Not a continuation: the C2 stood alone; this byte is judged on its own below.
        }
        if (continuation_ > 0) {
            if (byte >= 0x80 && byte <= 0xbf) {
                --continuation_;
                out += c;
                continue;
            }
            continuation_ = 0;  // a broken sequence: judge this byte on its own
        }
        if (byte < 0x20 || byte == 0x7f) {
            if (byte == '\n' || byte == '\t' || byte == '\r') {
                out += c;
            } else {
                out += '^';
                out += static_cast<char>(byte ^ 0x40);  // ESC -> '[', BEL -> 'G', DEL -> '?'
            }
            continue;
        }
        if (byte == 0xc2) {
            held_c2_ = true;
            continue;
        }
        const int expected = expected_continuations(byte);
        if (expected < 0 && byte <= 0x9f) {
            render_c1(out, byte);  // a lone 0x80..0x9F: a C1 control on an 8-bit terminal
            continue;
        }
        if (expected > 0) continuation_ = expected;
        out += c;
    }
    return out;
}

std::string terminal_safe::finish() {
    std::string out;
    if (held_c2_) out += '\xc2';
    held_c2_ = false;
    continuation_ = 0;
    return out;
}

bool is_terminal(int fd) noexcept {
    return ::isatty(fd) == 1;
}

}  // namespace moat::cli
