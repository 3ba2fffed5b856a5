// Text shaped for a language model: what a model reads back from a command decides whether it
// fixes its own bug or apologises to the user, so output is cleaned and clamped the same way
// everywhere (the tool layer, `moat mcp`, `moat demo`).
//
// Pure functions, no I/O, safe on any bytes (they are fuzzed).
#pragma once

#include <moat/exec.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moat {

// How much of one stream a model sees, in characters (Unicode code points).
struct shaping_limits {
    std::size_t head_chars = 2000;  // kept from the start when the text is cut
    std::size_t tail_chars = 3000;  // kept from the end when the text is cut
    std::size_t max_chars = 6000;   // a text of at most this many characters is kept whole
};

struct shaped_text {
    // Valid UTF-8 without escape sequences or control characters other than '\n' and '\t'; at
    // most max(max_chars, head_chars + tail_chars) characters plus the marker line.
    std::string text;
    // Characters replaced by the marker (0: nothing cut); bytes lost before shaping count as one
    // character each.
    std::uint64_t omitted_chars = 0;
    bool is_truncated() const noexcept { return omitted_chars != 0; }
};

// Cleans `raw` for a model, then clamps it:
// - escape sequences are removed: CSI (colours, cursor moves; also the 8-bit C1 form U+009B),
//   OSC (titles, hyperlinks; ended by BEL or ST, or, when malformed, by the next control
//   character such as '\n'), DCS/SOS/PM/APC strings, and two- and three-byte ESC sequences;
// - "\r\n" becomes "\n"; every other control character (C0, DEL, C1) except '\n' and '\t' is
//   removed, a lone '\r' included (so a progress bar's redraws run together rather than hide
//   text);
// - invalid UTF-8 (overlongs, surrogates, code points past U+10FFFF, stray continuation bytes, a
//   sequence cut by a capture limit) becomes U+FFFD, one per maximal ill-formed subpart (the
//   Unicode recommendation), so the result is always valid UTF-8 and never splits a sequence;
// - characters are Unicode code points; if more than limits.max_chars remain (and more than
//   head_chars + tail_chars), the first head_chars and the last tail_chars are kept, joined by
//   a marker on its own line that says how many characters were omitted and how to see the
//   middle: "[... 194,000 characters omitted; to see them, print a slice, filter the lines you
//   need, or print a summary such as len() or head() ...]".
//
// The two-part form is for a stream whose middle a byte-level capture already dropped:
// `uncaptured_bytes` bytes were lost between `raw_head` and `raw_tail`. When it is 0 the parts are
// joined and shaped as one text. Otherwise each part is cleaned on its own (a sequence cut at
// either capture boundary becomes a single U+FFFD), at most head_chars of the head's start and
// tail_chars of the tail's end are kept, and the marker always appears between them, counting
// the uncaptured bytes plus the characters cut from either part.
shaped_text shape_for_model(std::string_view raw, const shaping_limits& limits = {});
shaped_text shape_for_model(std::string_view raw_head, std::uint64_t uncaptured_bytes,
                            std::string_view raw_tail, const shaping_limits& limits = {});

// A captured stream (head, omitted bytes, tail) shaped as above.
shaped_text shape_for_model(const captured_output& output, const shaping_limits& limits = {});

// The exception type named by the last Python traceback in `stderr_text`: the "KeyError" of
// "KeyError: 'price'", the "json.decoder.JSONDecodeError" of a qualified name, "" when the text
// holds no traceback ("Traceback (most recent call last):" followed by the exception line) or no
// SyntaxError-style report ("  File ..., line N" ... "SyntaxError: ..." / "IndentationError" /
// "TabError"). Ignores ANSI escapes.
// The exception line is the first unindented line after the frames, "Name" or "Name: message"
// with Name a dotted identifier. Of chained exceptions ("During handling of the above
// exception..." / "The above exception was the direct cause..."), the last one's type is
// returned. An exception group's box ("  + Exception Group Traceback", "  | ...") names the group
// itself ("ExceptionGroup"), not the sub-exceptions nested inside it. Omission markers
// ("[... N characters omitted ...]", "[... N bytes omitted ...]") inside a traceback are skipped.
std::string python_error_type(std::string_view stderr_text);

// The last Python traceback in `stderr_text`, with the tracebacks chained into it, from the
// first one's "Traceback (most recent call last):" line (a SyntaxError report's "  File" line, an
// exception group's first line) to the end of the text (or "" when there is none), cleaned and
// shaped with a tighter budget (1,000 head + 2,000 tail characters, 3,000 max) so the exception
// line at the bottom is always kept.
std::string python_traceback(std::string_view stderr_text);

}  // namespace moat
