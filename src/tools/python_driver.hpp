// The program that keeps one Python interpreter alive across a session's cells (run with
// `python3 -u -c <source> <nonce> <cells so far>` inside the sandbox; no file of it exists there).
//
// Protocol. The host writes each cell to the interpreter's stdin as "<byte length>\n<UTF-8 code>".
// The driver saves it as /workspace/.cells/NNN.py (numbered on from <cells so far>, so a
// restarted interpreter does not overwrite earlier cells), runs it in one persistent namespace (the
// value of a final expression is printed, as in a REPL), prints any exception's traceback (without
// the driver's own frames) to stderr, then writes the end marker
//   "\x1e" "moat-cell-<nonce> <NNN> <ok|error> <exception type or ->" "\n"
// to both stdout and stderr, after flushing them: a channel's cell output is everything before its
// marker. The cell's own stdin is /dev/null; the command channel is a private descriptor.
#pragma once

#include <string>
#include <string_view>

namespace moat {

std::string_view python_driver_source();

// The end-marker prefix for `nonce` ("\x1emoat-cell-<nonce> ").
std::string python_cell_marker(std::string_view nonce);

}  // namespace moat
