// The Lua scripts of the Redis session store: each contract step that must check and set in one
// round trip. Every script works on two keys: KEYS[1] the entry (a hash: s sandbox id, g
// generation, n noticed generation, u last use in ms on Redis's clock, t the token that
// committed it), KEYS[2] the claim (a string holding the fencing token, expiring with the lease:
// SET PX). Times come from Redis's TIME, so every worker measures leases and idle time on one
// clock. A record is returned as {1, sandbox, generation, noticed, unused_ms, claimed} or {0}.
#pragma once

#include <string>
#include <string_view>

namespace moat::store {

struct redis_script {
    std::string source;
    std::string sha1;  // hex, for EVALSHA
};

const redis_script& get_script();
const redis_script& claim_script();
const redis_script& renew_script();
const redis_script& commit_script();
const redis_script& release_script();
const redis_script& touch_script();
const redis_script& erase_script();

}  // namespace moat::store
