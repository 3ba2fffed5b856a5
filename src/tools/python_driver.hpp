// The program that keeps one Python interpreter alive across a session's cells (run with
// `python3 -u -c <source> <cells so far>` inside the sandbox; no file of it exists there).
//
// Protocol. The host writes each cell to the interpreter's stdin as "<byte length>\n<UTF-8 code>".
// The driver saves it as <working directory>/.cells/NNN.py (numbered on from <cells so far>, so a
// restarted interpreter does not overwrite earlier cells), runs it in one persistent namespace (the
// value of a final expression is printed, as in a REPL) and prints any exception's traceback
// (without the driver's own frames) to stderr. The cell's own stdin is /dev/null; the command
// channel is a private descriptor.
//
// Results. Before any cell runs, the driver forks a forwarder, the only process holding the
// interpreter's real stdout (the results channel), and points its own descriptors 1 and 2 at
// pipes the forwarder reads. The forwarder frames what arrives as records "o<n>\n<n bytes>" and
// "e<n>\n<n bytes>"; after a cell (and flushing), the driver sends its end line on a third pipe,
// and the forwarder drains the output pipes, then writes "r<n>\n<NNN> <ok|error> <exception type
// or ->\n". Nothing is secret: a cell's bytes only ever travel inside data records, so no text a
// cell (or any process it starts) prints can end the cell or hide output, and the forwarder
// outlives a crashing interpreter long enough to forward what it printed. The interpreter's
// stderr channel carries only what is written before the driver redirects (start-up errors).
#pragma once

#include <string_view>

namespace moat {

std::string_view python_driver_source();

}  // namespace moat
