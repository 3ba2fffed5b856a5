// moat bench pause [--n N] [--json FILE]
//   What a pause and a resume cost (sandbox::async_pause / async_resume, docs/lifecycle.md): one
//   local sandbox with a Python process holding 64 MiB and a busy loop running, paused and
//   resumed N times (default 200), each call timed from the library until it returns (the
//   commands' cgroup frozen or thawed, pid 1 told, the record written). After the last resume the
//   Python process must still answer. Prints p50/p99 of both; any failure exits non-zero. JSON
//   keys: pause, resume (summaries).
#pragma once

namespace moat::cli {

int bench_pause(int argc, char** argv);

}  // namespace moat::cli
