#include <moat/model_text.hpp>

#include "core/utf8.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>

namespace moat {
namespace {

constexpr std::string_view replacement_character = "\xEF\xBF\xBD";
constexpr std::size_t npos = std::string_view::npos;

unsigned byte_at(std::string_view s, std::size_t i) noexcept {
    return static_cast<unsigned char>(s[i]);
}

bool is_continuation(char c) noexcept {
    return (static_cast<unsigned char>(c) & 0xC0U) == 0x80U;
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
    return b > std::numeric_limits<std::uint64_t>::max() - a
               ? std::numeric_limits<std::uint64_t>::max()
               : a + b;
}

// Escape sequences (ECMA-48). Each skip_* returns the index just past the sequence.
std::size_t skip_csi(std::string_view s, std::size_t i) {
    while (i < s.size() && byte_at(s, i) >= 0x20 && byte_at(s, i) <= 0x3F) ++i;
    if (i < s.size() && byte_at(s, i) >= 0x40 && byte_at(s, i) <= 0x7E) ++i;
    return i;
}

// OSC, DCS, SOS, PM, APC: up to BEL or ST. A control character other than BEL and tab ends a
// malformed one without being consumed, so a stray "ESC ]" costs at most the rest of its line.
std::size_t skip_control_string(std::string_view s, std::size_t i) {
    for (; i < s.size(); ++i) {
        const unsigned c = byte_at(s, i);
        if (c == 0x07) return i + 1;
        if (c == 0x1B) return i + 1 < s.size() && s[i + 1] == '\\' ? i + 2 : i;
        if (c < 0x20 && c != '\t') return i;
    }
    return i;
}

std::size_t skip_escape(std::string_view s, std::size_t i) {
    if (i + 1 >= s.size()) return s.size();
    const unsigned c = byte_at(s, i + 1);
    if (c == '[') return skip_csi(s, i + 2);
    if (c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_') {
        return skip_control_string(s, i + 2);
    }
    if (c >= 0x20 && c <= 0x2F) {  // nF: intermediate bytes, then a final byte
        i += 2;
        while (i < s.size() && byte_at(s, i) >= 0x20 && byte_at(s, i) <= 0x2F) ++i;
        if (i < s.size() && byte_at(s, i) >= 0x30 && byte_at(s, i) <= 0x7E) ++i;
        return i;
    }
    if (c >= 0x30 && c <= 0x7E) return i + 2;
    return i + 1;
}

bool is_plain(unsigned c) noexcept {
    return (c >= 0x20 && c < 0x7F) || c == '\n' || c == '\t';
}

// Appends the cleaned form of `s` to `out` and returns how many characters it appended.
std::uint64_t append_clean(std::string_view s, std::string& out) {
    out.reserve(out.size() + s.size());
    std::uint64_t chars = 0;
    std::size_t i = 0;
    while (i < s.size()) {
        std::size_t j = i;
        while (j < s.size() && is_plain(byte_at(s, j))) ++j;
        if (j != i) {
            out.append(s, i, j - i);
            chars += j - i;
            i = j;
            continue;
        }
        const unsigned c = byte_at(s, i);
        if (c == 0x1B) {
            i = skip_escape(s, i);
            continue;
        }
        if (c < 0x80) {  // C0 controls (a lone '\r' too; "\r\n" keeps its '\n') and DEL
            ++i;
            continue;
        }
        const utf8_step step = decode_utf8(s, i);
        if (!step.is_valid) {
            out += replacement_character;
            ++chars;
        } else if (c == 0xC2 && byte_at(s, i + 1) < 0xA0) {  // C1 controls, U+0080..U+009F
            const unsigned control = byte_at(s, i + 1);
            if (control == 0x9B) {
                i = skip_csi(s, i + 2);
                continue;
            }
            if (control == 0x9D || control == 0x90 || control == 0x98 || control == 0x9E ||
                control == 0x9F) {
                i = skip_control_string(s, i + 2);
                continue;
            }
        } else {
            out.append(s, i, step.length);
            ++chars;
        }
        i += step.length;
    }
    return chars;
}

// Byte offset after the first `count` characters of valid UTF-8 `s`.
std::size_t offset_after_chars(std::string_view s, std::uint64_t count) {
    std::size_t i = 0;
    for (; count != 0 && i < s.size(); --count) {
        ++i;
        while (i < s.size() && is_continuation(s[i])) ++i;
    }
    return i;
}

// Byte offset where the last `count` characters of valid UTF-8 `s` begin.
std::size_t offset_of_last_chars(std::string_view s, std::uint64_t count) {
    std::size_t i = s.size();
    for (; count != 0 && i != 0; --count) {
        --i;
        while (i != 0 && is_continuation(s[i])) --i;
    }
    return i;
}

std::string with_thousands_separators(std::uint64_t n) {
    const std::string digits = std::to_string(n);
    std::string out;
    out.reserve(digits.size() + digits.size() / 3);
    for (std::size_t k = 0; k < digits.size(); ++k) {
        if (k != 0 && (digits.size() - k) % 3 == 0) out += ',';
        out += digits[k];
    }
    return out;
}

// head + marker line + tail; the marker gets a line of its own without doubling blank lines.
shaped_text join_with_marker(std::string_view head, std::uint64_t omitted, std::string_view tail) {
    shaped_text r;
    r.omitted_chars = omitted;
    r.text.reserve(head.size() + tail.size() + 160);
    r.text.append(head);
    if (!r.text.empty() && r.text.back() != '\n') r.text += '\n';
    r.text += "[... ";
    r.text += with_thousands_separators(omitted);
    r.text += omitted == 1 ? " character" : " characters";
    r.text +=
        " omitted; to see them, print a slice, filter the lines you need, or print a summary "
        "such as len() or head() ...]";
    if (!tail.empty() && tail.front() != '\n') r.text += '\n';
    r.text.append(tail);
    return r;
}

shaped_text clamp(std::string text, std::uint64_t chars, const shaping_limits& limits) {
    const std::uint64_t kept = saturating_add(limits.head_chars, limits.tail_chars);
    if (chars <= limits.max_chars || chars <= kept) return {std::move(text), 0};
    const std::string_view view = text;
    return join_with_marker(view.substr(0, offset_after_chars(view, limits.head_chars)),
                            chars - kept,
                            view.substr(offset_of_last_chars(view, limits.tail_chars)));
}

// --- Python tracebacks -------------------------------------------------------------------------

constexpr std::string_view traceback_header = "Traceback (most recent call last):";
constexpr std::string_view group_traceback_header =
    "Exception Group Traceback (most recent call last):";

// A line of an exception group's box: "  | text", "  + Exception Group ...", "  +-+---- 1 ----".
struct boxed_line {
    std::ptrdiff_t margin = -1;  // column of the '|' or '+', -1 when the line is not boxed
    std::string_view content;
    bool is_separator = false;
};

boxed_line split_margin(std::string_view line) {
    const std::size_t s = line.find_first_not_of(' ');
    if (s == npos || (line[s] != '|' && line[s] != '+')) return {-1, line, false};
    const auto column = static_cast<std::ptrdiff_t>(s);
    if (s + 1 == line.size()) return {column, {}, false};
    const char next = line[s + 1];
    if (next == ' ') return {column, line.substr(s + 2), false};
    if (next == '-' || next == '+') return {column, {}, true};
    return {-1, line, false};
}

bool is_identifier_byte(unsigned c, bool is_first) noexcept {
    if (c == '_' || c >= 0x80 || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) return true;
    return !is_first && ((c >= '0' && c <= '9') || c == '.');
}

// "KeyError" of "KeyError: 'price'" or of a bare "KeyError"; empty if `content` is not an
// exception line.
std::string_view exception_name(std::string_view content) {
    constexpr std::size_t max_name = 200;
    std::size_t k = 0;
    while (k < content.size() && k <= max_name && is_identifier_byte(byte_at(content, k), k == 0))
        ++k;
    if (k == 0 || k > max_name || content[k - 1] == '.') return {};
    if (k < content.size() && content.substr(k, 2) != ": " && content.substr(k) != ":") return {};
    return content.substr(0, k);
}

bool is_syntax_error_name(std::string_view name) {
    const std::size_t dot = name.rfind('.');
    const std::string_view last = dot == npos ? name : name.substr(dot + 1);
    return last == "SyntaxError" || last == "IndentationError" || last == "TabError" ||
           last == "_IncompleteInputError";
}

bool is_file_line(std::string_view content) {
    return content.starts_with("  File \"") && content.find("\", line ") != npos;
}

bool is_chain_connector(std::string_view content) {
    return content == "During handling of the above exception, another exception occurred:" ||
           content == "The above exception was the direct cause of the following exception:";
}

// A marker left by shaping or by captured_output::text() where the middle was dropped.
bool is_omission_marker(std::string_view content) {
    return content.starts_with("[... ") && content.ends_with("...]");
}

struct traceback_span {
    std::size_t start = npos;  // byte offset of the first line (of the whole chain)
    std::string_view name;     // the exception type
};

// Finds the last complete traceback in cleaned text, line by line, in one pass. A candidate
// opens at a header (or a SyntaxError report's "  File" line, or an omission marker), skips
// indented frame lines and completes at the first unindented exception line. Lines nested in an
// exception group's box (a deeper margin) are skipped: the group itself is what was raised.
traceback_span find_last_traceback(std::string_view text) {
    enum class kind { none, traceback, syntax_report, cut };
    traceback_span last;
    kind open = kind::none;
    std::size_t open_start = 0;
    bool open_saw_file = false;
    std::ptrdiff_t group = -1;  // margin column of the exception group being read
    bool is_chained = false;    // a chain connector followed the last complete traceback

    const auto start = [&](kind k, std::size_t line_start) {
        open = k;
        open_saw_file = false;
        open_start = is_chained && last.start != npos ? last.start : line_start;
        is_chained = false;
    };

    for (std::size_t pos = 0; pos < text.size();) {
        std::size_t end = text.find('\n', pos);
        if (end == npos) end = text.size();
        const std::size_t line_start = pos;
        const boxed_line line = split_margin(text.substr(pos, end - pos));
        pos = end + 1;

        if (group >= 0 && line.margin > group) continue;
        if (group >= 0 && line.margin < group) {
            group = -1;
            open = kind::none;
        }
        if (line.margin != group) {  // a boxed line outside any group: a group may begin here
            if (line.content.starts_with(group_traceback_header)) {
                start(kind::traceback, line_start);
                group = line.margin;
            } else if (open == kind::none && !line.is_separator) {
                const std::string_view name = exception_name(line.content);
                if (name.ends_with("ExceptionGroup")) {  // a group printed without frames
                    start(kind::traceback, line_start);
                    last = {open_start, name};
                    open = kind::none;
                    group = line.margin;
                }
            }
            continue;
        }
        if (line.is_separator) continue;
        const std::string_view content = line.content;
        if (is_omission_marker(content)) {
            if (open == kind::none) start(kind::cut, line_start);
            continue;
        }
        if (content.starts_with(traceback_header) || content.starts_with(group_traceback_header)) {
            start(kind::traceback, line_start);
            continue;
        }
        if (is_file_line(content)) {
            if (open == kind::none) start(kind::syntax_report, line_start);
            open_saw_file = true;
            continue;
        }
        if (open != kind::none && content.starts_with(' ')) continue;
        if (is_chain_connector(content)) {
            is_chained = last.start != npos;
            open = kind::none;
            continue;
        }
        if (open == kind::none) continue;
        const std::string_view name = exception_name(content);
        const bool is_accepted =
            !name.empty() && (open == kind::traceback ||
                              (open == kind::syntax_report && is_syntax_error_name(name)) ||
                              (open == kind::cut && open_saw_file));
        if (is_accepted) last = {open_start, name};
        open = kind::none;
    }
    return last;
}

std::string cleaned(std::string_view raw) {
    std::string out;
    append_clean(raw, out);
    return out;
}

}  // namespace

shaped_text shape_for_model(std::string_view raw, const shaping_limits& limits) {
    std::string text;
    const std::uint64_t chars = append_clean(raw, text);
    return clamp(std::move(text), chars, limits);
}

shaped_text shape_for_model(std::string_view raw_head, std::uint64_t uncaptured_bytes,
                            std::string_view raw_tail, const shaping_limits& limits) {
    if (uncaptured_bytes == 0) {  // nothing lost: one stream
        std::string joined;
        joined.reserve(raw_head.size() + raw_tail.size());
        joined.append(raw_head).append(raw_tail);
        return shape_for_model(joined, limits);
    }
    std::string head;
    const std::uint64_t head_chars = append_clean(raw_head, head);
    // The continuation bytes of a character cut by the capture are one U+FFFD, not up to three.
    std::size_t cut = 0;
    while (cut < 3 && cut < raw_tail.size() && is_continuation(raw_tail[cut])) ++cut;
    std::string tail;
    std::uint64_t tail_chars = 0;
    if (cut != 0) {
        tail += replacement_character;
        tail_chars = 1;
    }
    tail_chars += append_clean(raw_tail.substr(cut), tail);

    const std::uint64_t kept_head = std::min<std::uint64_t>(head_chars, limits.head_chars);
    const std::uint64_t kept_tail = std::min<std::uint64_t>(tail_chars, limits.tail_chars);
    const std::uint64_t omitted =
        saturating_add(uncaptured_bytes, (head_chars - kept_head) + (tail_chars - kept_tail));
    const std::string_view head_view = head;
    const std::string_view tail_view = tail;
    return join_with_marker(head_view.substr(0, offset_after_chars(head_view, kept_head)), omitted,
                            tail_view.substr(offset_of_last_chars(tail_view, kept_tail)));
}

shaped_text shape_for_model(const captured_output& output, const shaping_limits& limits) {
    return shape_for_model(output.head, output.omitted_bytes, output.tail, limits);
}

std::string python_error_type(std::string_view stderr_text) {
    const std::string text = cleaned(stderr_text);
    return std::string(find_last_traceback(text).name);
}

std::string python_traceback(std::string_view stderr_text) {
    const std::string text = cleaned(stderr_text);
    const traceback_span span = find_last_traceback(text);
    if (span.start == npos) return {};
    return shape_for_model(std::string_view(text).substr(span.start), {1000, 2000, 3000}).text;
}

}  // namespace moat
