// moat bench python [--n N] [--json FILE]
//   What a run_python round trip costs in the tool layer (docs/tools.md, "The Python
//   interpreter"), with the code "1+1" (its value is the result), after a first cell has started
//   the interpreter. Three series, in alternating halves of N calls each (default 200), in the
//   same run:
//   - private: a tool session whose sandbox is its own (what `moat mcp` gives each connection);
//   - shared: two workers (two local backends, runtimes and managers over one session store, as
//     two processes of an agent server would have) take turns on one conversation's sandbox and
//     its one interpreter;
//   - exec_true: the baseline, `true` run through the private session's sandbox handle (a command
//     round trip, no interpreter).
//   Prints p50/p99 of each, the shared minus private difference and each one's ratio to the
//   baseline. Any failed call counts as a failure and makes the exit code non-zero. JSON keys:
//   private, shared, exec_true (summaries), shared_minus_private_p50_ms,
//   shared_minus_private_p99_ms, private_ratio_p50, shared_ratio_p50.
#pragma once

namespace moat::cli {

int bench_python(int argc, char** argv);

}  // namespace moat::cli
