// moat bench ports [--n N] [--mb M] [--setup-n S] [--json FILE]
//   What a forwarded port costs (docs/network.md, "Ports"). The same program, python3's
//   http.server, serves an M MiB file (default 100) and a 1 KiB one twice: on the host's
//   127.0.0.1 (the baseline), and inside a local sandbox on its own loopback, reached through the
//   handle's loopback forward (sandbox::async_port_host: a port_forwarder whose every connection
//   is one async_connect_port, what `moat port-forward` runs). curl on the host fetches the big
//   file N times (default 10) and the small one S times (default 200) from each, in alternating
//   halves, in the same run. Prints p50/p99 of each; the throughput ratio (forwarded p50 over
//   host p50, MB/s) and connection setup (curl's time_starttransfer of the small fetch: connect,
//   request and first byte) p50/p99 with its ratios. A fetch that fails or returns the wrong size
//   counts as a failure, and any failure exits non-zero. JSON keys: host_download,
//   forward_download, host_setup, forward_setup (summaries), throughput_ratio_p50,
//   setup_ratio_p50, setup_ratio_p99, setup_overhead_p50_ms.
#pragma once

namespace moat::cli {

int bench_ports(int argc, char** argv);

}  // namespace moat::cli
