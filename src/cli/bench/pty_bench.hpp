// moat bench pty [--n N] [--json FILE]
//   What a keystroke costs on a terminal of a local sandbox (docs/terminals.md): a byte written
//   to the terminal through the library (terminal::async_write) until its echo is read back
//   (terminal::async_next), N times (default 2000) each, one byte at a time. The echo comes from
//   `cat` on the terminal in raw mode (as a shell's line editor echoes), so each round trip
//   crosses the sandbox's pty both ways and a process inside. The baseline, in the same run and
//   alternating halves: the same byte through a spawned `cat`'s stdin and stdout pipes
//   (process::async_write_stdin / async_next). Prints p50/p99 of both and their ratio; any
//   failed round trip exits non-zero. JSON keys: pty_echo, pipe_echo (summaries),
//   pty_minus_pipe_p50_ms, pty_ratio_p50.
#pragma once

namespace moat::cli {

int bench_pty(int argc, char** argv);

}  // namespace moat::cli
