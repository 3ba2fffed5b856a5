#include "core/json_writer.hpp"

#include <cmath>
#include <cstdio>

namespace moat {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 if invalid.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t min = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0)
        n = 2, min = 0x80, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0)
        n = 3, min = 0x800, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0)
        n = 4, min = 0x10000, cp = c & 0x07;
    else
        return 0;
    if (i + n > s.size()) return 0;
    for (std::size_t k = 1; k < n; ++k) {
        const auto d = static_cast<unsigned char>(s[i + k]);
        if ((d & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
    out += '"';
    for (std::size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        switch (c) {
            case '"':
                out += "\\\"";
                ++i;
                continue;
            case '\\':
                out += "\\\\";
                ++i;
                continue;
            case '\n':
                out += "\\n";
                ++i;
                continue;
            case '\r':
                out += "\\r";
                ++i;
                continue;
            case '\t':
                out += "\\t";
                ++i;
                continue;
            default:
                break;
        }
        if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
            ++i;
            continue;
        }
        const std::size_t n = utf8_sequence_length(s, i);
        if (n == 0) {
            out += "\xEF\xBF\xBD";
            ++i;
        } else {
            out.append(s.substr(i, n));
            i += n;
        }
    }
    out += '"';
}

void json_writer::separate() {
    if (after_key_) {
        after_key_ = false;
        return;
    }
    if (!first_.empty()) {
        if (!first_.back()) out_ += ',';
        first_.back() = false;
    }
}

json_writer& json_writer::begin_object() {
    separate();
    out_ += '{';
    first_.push_back(true);
    return *this;
}

json_writer& json_writer::end_object() {
    out_ += '}';
    first_.pop_back();
    return *this;
}

json_writer& json_writer::begin_array() {
    separate();
    out_ += '[';
    first_.push_back(true);
    return *this;
}

json_writer& json_writer::end_array() {
    out_ += ']';
    first_.pop_back();
    return *this;
}

json_writer& json_writer::key(std::string_view name) {
    separate();
    append_json_string(out_, name);
    out_ += ':';
    after_key_ = true;
    return *this;
}

json_writer& json_writer::value(std::string_view s) {
    separate();
    append_json_string(out_, s);
    return *this;
}

json_writer& json_writer::value(bool b) {
    separate();
    out_ += b ? "true" : "false";
    return *this;
}

json_writer& json_writer::value(std::int64_t n) {
    separate();
    out_ += std::to_string(n);
    return *this;
}

json_writer& json_writer::value(std::uint64_t n) {
    separate();
    out_ += std::to_string(n);
    return *this;
}

json_writer& json_writer::value(double d) {
    separate();
    if (!std::isfinite(d)) {
        out_ += "null";
        return *this;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", d);
    out_ += buf;
    return *this;
}

json_writer& json_writer::null() {
    separate();
    out_ += "null";
    return *this;
}

}  // namespace moat
