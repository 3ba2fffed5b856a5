// moat bench http [--n N] [--concurrency C] [--stream-mib M] [--json FILE]
//   moat's HTTP server on 127.0.0.1 (its own thread), loaded by moat's client and, in the same
//   run, by Node's http client (a keep-alive agent) with the same requests: N GETs of a small JSON
//   body, C in flight, then one streamed body of M MiB (chunked, 64 KiB frames). curl fetches the
//   streamed body too. Prints requests per second, p50/p99 and MB/s per client and their ratios.
#pragma once

namespace moat::cli {

int bench_http(int argc, char** argv);

}  // namespace moat::cli
