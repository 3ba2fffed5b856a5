#include "core/json_writer.hpp"

#include "core/utf8.hpp"

#include <cmath>
#include <cstdio>

namespace moat {

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
        // An invalid byte becomes U+FFFD on its own (one per byte), so the string stays JSON.
        const utf8_step step = decode_utf8(s, i);
        if (!step.is_valid) {
            out += "\xEF\xBF\xBD";
            ++i;
        } else {
            out.append(s.substr(i, step.length));
            i += step.length;
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

json_writer& json_writer::open(char bracket) {
    separate();
    out_ += bracket;
    first_.push_back(true);
    return *this;
}

json_writer& json_writer::close(char bracket) {
    out_ += bracket;
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

json_writer& json_writer::raw_value(std::string_view json) {
    separate();
    out_ += json;
    return *this;
}

}  // namespace moat
