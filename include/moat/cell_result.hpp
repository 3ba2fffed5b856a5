// What one code cell produced, as a notebook shows it: the contract between moat's interpreter
// (the sandbox's resident Python, see docs/tools.md) and everything that presents a cell: the tool
// layer (run_python's result for a model), `moat mcp`, and an E2B Code Interpreter server.
//
// A cell yields an ordered stream of events:
//
// - stream_text: a chunk of what the cell wrote to stdout or stderr, as it arrived (the cell's own
//   bytes; not necessarily whole lines or whole UTF-8 characters).
// - display_result: a rich value, as a set of representations by media type. The value of the
//   cell's last expression is the main result (Jupyter's execute_result, E2B's is_main_result);
//   display() calls and figures are not. Each representation holds exact bytes: UTF-8 text for
//   the text types and JSON, the image's own bytes for image/png and image/jpeg (never base64:
//   a presenter that needs base64, as E2B's wire does, encodes them itself).
// - cell_error: the exception that ended the cell: its type's name, its value (str() of it) and
//   the traceback as text (Python's standard format, frames of the interpreter's machinery left
//   out, no colour codes).
//
// and, at its end, the interpreter's execution count.
//
// Bounds. The interpreter runs model-written code, so everything it reports is bounded by
// cell_limits, and what a bound removed is said, never silently lost: a representation over
// max_representation_bytes is dropped (listed in display_result::dropped with its size), except
// text/plain, which is cut to its head and flagged is_truncated; representations past
// max_result_bytes in one cell are dropped the same way; results past max_results are counted in
// cell_result::dropped_results; stream text past max_stream_bytes is counted in
// cell_result::omitted_stream_bytes (the event stream delivered it; the kept record does not
// repeat it); an error's fields are cut at max_error_bytes each.
#pragma once

#include <moat/exec.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace moat {

// The media types the interpreter produces by name (IPython's formatters); any other well-formed
// type a `_repr_mimebundle_` returns is carried as it is.
namespace media {
inline constexpr std::string_view text_plain = "text/plain";
inline constexpr std::string_view text_html = "text/html";
inline constexpr std::string_view text_markdown = "text/markdown";
inline constexpr std::string_view text_latex = "text/latex";
inline constexpr std::string_view image_png = "image/png";
inline constexpr std::string_view image_jpeg = "image/jpeg";
inline constexpr std::string_view image_svg = "image/svg+xml";
inline constexpr std::string_view application_json = "application/json";
}  // namespace media

struct cell_limits {
    std::size_t max_representation_bytes = 4 * 1024 * 1024;
    std::size_t max_result_bytes = 16 * 1024 * 1024;  // every representation of one cell
    std::size_t max_results = 64;                     // display results of one cell
    std::size_t max_stream_bytes = 1024 * 1024;       // stdout + stderr kept in cell_result
    std::size_t max_error_bytes = 64 * 1024;          // each of name, value, traceback
};

struct representation {
    std::string media_type;
    std::string data;           // exact bytes (see above)
    bool is_truncated = false;  // text/plain only: cut to its head at the representation cap
};

// A representation a bound removed, and how large it was.
struct dropped_representation {
    std::string media_type;
    std::uint64_t size = 0;
};

struct display_result {
    bool is_main_result = false;
    std::vector<representation> representations;  // in the order the interpreter gave them
    std::vector<dropped_representation> dropped;

    // The representation of `media_type`, or nullptr.
    const representation* find(std::string_view media_type) const noexcept;
    // Its text/plain ("" when it has none).
    std::string_view text() const noexcept;
};

struct cell_error {
    std::string name;       // "KeyError"
    std::string value;      // "'price'"
    std::string traceback;  // "Traceback (most recent call last):\n  File ..., line 2, in f\n..."
};

struct stream_text {
    output_channel channel = output_channel::out;
    std::string text;
};

using cell_event = std::variant<stream_text, display_result, cell_error>;

// The whole cell, once it ended: its events in order (stream text coalesced per channel run,
// bounded as above), the execution count, and what the bounds removed.
struct cell_result {
    std::vector<cell_event> events;
    // The interpreter's count of cells run, this one included (IPython's In[n]); 0 when the cell
    // never reached the interpreter's end of cell (it was killed, or the interpreter crashed).
    std::uint64_t execution_count = 0;
    std::uint64_t omitted_stream_bytes = 0;
    std::uint64_t dropped_results = 0;

    // The main result, or nullptr.
    const display_result* main_result() const noexcept;
    // The error that ended the cell, or nullptr.
    const cell_error* error() const noexcept;
    // Every display result, in order.
    std::vector<const display_result*> results() const;
};

}  // namespace moat
