// moat bench store [--store URL] [--password-file F] [--n N] [--claims N] [--json FILE]
//   The session store's share of an acquire, through the memory store and the Redis store in
//   the same run: for an existing session, the store steps an acquire takes (get the entry, then
//   touch it and take a pending rebuild notice), N times each, interleaved, as p50/p99; and
//   first-use claims per second (claim a new key and commit its sandbox id) with 8 workers, each
//   with its own store (its own Redis connection, as 8 worker processes would have).
//   Without --store (or MOAT_STORE) it starts its own redis-server on a unix socket in a
//   temporary directory if one is on PATH, and says so if none is. The password comes from the
//   URL, --password-file or MOAT_STORE_PASSWORD. JSON keys: memory and redis (each with p50_ms,
//   p99_ms and the rest of the summary), redis_added_p50_ms, claims_per_s {memory, redis}.
#pragma once

namespace moat::cli {

int bench_store(int argc, char** argv);

}  // namespace moat::cli
