// moat bench e2b [--n N] [--concurrency C] [--lifecycle-n M] [--command CMD] [--json FILE]
//                [--sdk-dir DIR] [--sdk-script FILE] [--node PATH]
//   One `moat serve` (this binary, a child process: 127.0.0.1, ports 0, a random API key, a
//   temporary state directory, --destroy-on-exit), and against it, in the same run:
//
//   (a) the C++ e2b backend (make_e2b_backend, through the runtime) and the official e2b JS SDK
//       (node src/cli/bench/e2b_bench.mjs, the SDK from DIR/node_modules, default tests/e2b)
//       each create one sandbox, run 5 warm-up commands, then the same N commands (default 200,
//       `echo hello`) C at a time (default 4). Reported per side: client CPU time per command
//       (getrusage RUSAGE_SELF of this process for C++, which runs no server: serve is a child;
//       process.cpuUsage() of the node process for the SDK; user + system), throughput
//       (commands/s of wall time) and per-command latency p50/p99; the ratio SDK CPU / C++ CPU
//       (target: >= 3x).
//   (b) M (default 20) create + first exec (/bin/true) + destroy through the e2b backend and the
//       same through the local backend, interleaved: p50/p99 and the e2b / local ratio of create
//       and of create + first exec (the HTTP path's overhead).
//
//   Every step is bounded: a request by the backend's own timeouts, the node process by 300 s,
//   serve's start by 30 s and its stop by 60 s. A failed command is counted, never waited on.
//   --json writes the numbers. Exit 0 when every command and iteration succeeded, 1 otherwise.
#pragma once

namespace moat::cli {

int bench_e2b(int argc, char** argv);

}  // namespace moat::cli
