// moat bench egress [--n N] [--mb M] [--json FILE]
//   What the egress proxy costs a sandbox's downloads (docs/network.md). A python3 http.server on
//   the host's 127.0.0.1 serves an M MiB file (default 100) and a 1 KiB one; curl fetches each N
//   times (default 10) from the host directly and from inside a local sandbox whose allow-list
//   names the server (--resolve bench.test=127.0.0.1 --allow-address 127.0.0.1/32, through the
//   proxy in HTTP_PROXY), in alternating halves, in the same run. Prints p50/p99 of each, the
//   throughput ratio (sandbox p50 over host p50, MB/s; target >= 0.8) and the connection setup
//   overhead (the 1 KiB fetch's p50 through the proxy minus direct). A fetch that fails or
//   returns the wrong size counts as a failure, and any failure exits non-zero. JSON keys:
//   host_download, sandbox_download, host_small, sandbox_small (summaries),
//   throughput_ratio_p50, setup_overhead_p50_ms.
#pragma once

namespace moat::cli {

int bench_egress(int argc, char** argv);

}  // namespace moat::cli
