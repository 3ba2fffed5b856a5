// moat bench serve [--n N] [--json FILE]
//   `moat serve` in this process (127.0.0.1, ports 0, a random API key, a temporary state
//   directory removed afterwards), driven by moat's own keep-alive HTTP client: per iteration
//   POST /sandboxes (201), a first command through envd's process.Process/Start (a Connect stream
//   of /bin/true, read to its end event and end-stream message) and DELETE /sandboxes/{id} (204),
//   each timed. Interleaved with them, in the same run and on the same backend, the same three
//   through the library (runtime::async_create, sandbox::async_exec of /bin/true,
//   sandbox::async_destroy). Prints n, ok, p50, p90, p99 per series and the serve / library
//   ratios; --json writes the numbers.
//
//   Every request has a deadline (30 s); a failed step is counted, never waited on forever. A
//   sandbox the API created is deleted even when its command failed, the server runs with
//   destroy_on_exit, and after it stopped the backend's list is checked for every id the API
//   returned ("left_behind" in the JSON; a non-zero count fails the bench).
#pragma once

namespace moat::cli {

int bench_serve(int argc, char** argv);

}  // namespace moat::cli
