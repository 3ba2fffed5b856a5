// The program that keeps one Python interpreter alive across a session's cells (run with
// `python3 -u -c <source> <cells so far> <cells directory>` inside the sandbox; no file of it
// exists there).
//
// Protocol. The host writes each cell to the interpreter's stdin as "<byte length>\n<UTF-8 code>",
// or as "x<byte length>\n<JSON {code, env}>": `env`'s variables are set in os.environ for that
// cell only, then removed or put back. The driver saves it as <cells directory>/NNN.py (numbered on
// from <cells so far>, so a restarted interpreter does not overwrite earlier cells) and runs it in
// one persistent namespace: through IPython's InteractiveShell when `import IPython` works (magics,
// `!` lines, display hooks and `_repr_*_` methods as in Jupyter; `!` lines run without a terminal,
// so their stdout and stderr stay apart), else with the plain interpreter (the last expression's
// value through the same `_repr_*_` methods and repr(), a `display()` function, and a magic or `!`
// line answered with a UsageError saying IPython is not in the sandbox; `%matplotlib inline` is
// accepted by both). The cell's own stdin is /dev/null; the command channel is a private
// descriptor. MOAT_PLAIN_PYTHON=1 in the interpreter's environment forces the plain interpreter.
//
// Results. Before any cell runs, the driver forks a forwarder, the only process holding the
// interpreter's real stdout (the results channel), and points its own descriptors 1 and 2 at
// pipes the forwarder reads. The forwarder frames what arrives as records "o<n>\n<n bytes>" and
// "e<n>\n<n bytes>", and the driver's structured items (display results, the error, the
// execution count; their grammar is in cell_events.hpp) from a third pipe as "d<n>\n<n bytes>",
// draining stdout and stderr first so each item follows what was printed before it. After a cell
// (and flushing), the driver sends its end line on a fourth pipe, and the forwarder drains the
// others, then writes "r<n>\n<NNN> <ok|error> <exception type or ->\n". Nothing is secret: a
// cell's bytes only ever travel inside data records, so no text a cell (or any process it starts)
// prints can end the cell or hide output, and the forwarder outlives a crashing interpreter long
// enough to forward what it printed. The interpreter's stderr channel carries only what is
// written before the driver redirects (start-up errors).
//
// Rich results. The last expression's value is the main result; display() calls and matplotlib's
// open figures (MPLBACKEND=Agg; rendered as PNG at the end of every cell and on plt.show(), then
// closed) are not. A representation over 4 MiB is dropped (text/plain is cut), the host's bounds
// (moat/cell_result.hpp) apply again. The error is the exception that ended the cell, formatted
// as Python does, without the driver's or IPython's own frames.
//
// Interrupts. SIGINT to the driver raises KeyboardInterrupt in a running cell (ending it with that
// error, the namespace kept) and is ignored between cells.
#pragma once

#include <string_view>

namespace moat {

std::string_view python_driver_source();

// The interpreter as a resident of the sandbox, shared by every worker that attaches to it.
//
// The supervisor (`python3 -I -c <resident source> <driver source>`, started with
// exec_request::resident by whichever worker first finds none) takes the lock
// <workdir>/.cells/.kernel/lock (a POSIX record lock: one supervisor per sandbox, released when it
// dies), listens on the unix socket .cells/.kernel/sock (mode 0600 in a 0700 directory: the
// sandbox user's; nothing of the host is reachable through it), prints "ready" (or "running" when
// another holds the lock) and points its stdio at /dev/null. It starts the driver above as its
// child (its own session), serves one connection at a time, and keeps the cell numbering and a
// generation count (one per interpreter started) in .cells/.kernel/state, so a restarted
// interpreter, whoever restarts it, numbers on.
//
// A cell, from any worker, goes over a link (tools/kernel_link.hpp) that carries the framed cell
// ("x" frames also name the cell's context, "" the default one) to the supervisor and everything
// it sends back:
// - direct (a backend with sandbox::async_connect_unix: local): the sandbox's agent connects to
//   the socket and hands the connection out; no process starts. The connection waits in the
//   supervisor's queue (its listen backlog, 256) for its turn; past its turn wait the worker sends
//   "w" (or goes away) and the supervisor, which reads what followed a frame before serving it,
//   answers "busy" and runs nothing. A "w" that crosses the cell's "go" is ignored.
// - a relay (`python3 -I -c <relay source> <turn wait ms>`, spawned by the worker, on a backend
//   without that: e2b): it reads the frame from its stdin, takes the turn lock
//   (.cells/.kernel/turn; waiting up to the turn wait, else it prints "busy" and exits),
//   connects, forwards the frame and copies everything the supervisor sends to its stdout. It
//   prints "none" and exits when there is no supervisor.
// The supervisor answers "go <generation> <1 if this cell starts an interpreter, else 0> <the
// cell's number NNN>\n", then the driver's results channel unchanged up to and including the
// cell's end record (later bytes wait for the next cell), and closes the connection; a cell for
// an unknown context is answered "unknown\n" instead. What the worker sends during the cell: "i"
// (the cell is past its time limit) has the supervisor send SIGINT to the interpreter, which goes
// on. The supervisor writes the end record itself when the interpreter died during the cell ("NNN
// crashed <exit code> <signal>") or when the worker stopped it: any other byte, or the link's end
// (the connection closed, the relay killed), kills the interpreter's process group, confirmed,
// and the end record is "NNN killed". A broken framing also kills the interpreter. The frame
// "p\n" is a ping: the supervisor answers "pong" once it is done with every earlier connection, so
// a worker that stopped a cell knows the interpreter's kill is complete.
//
// Contexts. The supervisor keeps a table of contexts, each an interpreter of its own (own
// namespace, own working directory): "" is the default one (the tool layer's; only its
// interpreters count as generations). The frame "c<byte length>\n<JSON {op, ...}>" manages the
// others and is answered with one line, "ok <...>" or "error <reason>": create {language, cwd}
// ("<id> <language>"; the interpreter starts with the context's first cell, in cwd; bash and
// javascript contexts run the same driver, which hosts a persistent bash or node process and
// gives their cells the same records), restart {id} (its
// interpreter killed), remove {id}, list (a JSON array of {id, language, cwd}). At most 32.
std::string_view python_resident_source();
std::string_view python_relay_source();

}  // namespace moat
