#include "store/redis_scripts.hpp"

#include "core/ascii.hpp"

#include <openssl/sha.h>

namespace moat::store {
namespace {

constexpr std::string_view prelude = R"lua(
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function ms(n) return string.format('%.0f', n) end
local function record(now)
  local e = redis.call('HMGET', KEYS[1], 's', 'g', 'n', 'u', 'e')
  local claimed = redis.call('EXISTS', KEYS[2])
  local s = e[1] or ''
  local ended = 0
  if s == '' and e[5] == '1' then ended = 1 end
  if s == '' and claimed == 0 and ended == 0 then return {0} end
  local unused = 0
  if s ~= '' and e[4] then unused = now - tonumber(e[4]) end
  if unused < 0 then unused = 0 end
  return {1, s, e[2] or '0', e[3] or '0', unused, claimed, ended}
end
)lua";

redis_script make(std::string_view body) {
    redis_script script;
    script.source = std::string(prelude) + std::string(body);
    unsigned char digest[SHA_DIGEST_LENGTH];
    SHA1(reinterpret_cast<const unsigned char*>(script.source.data()), script.source.size(),
         digest);
    detail::append_hex(script.sha1, digest);
    return script;
}

}  // namespace

const redis_script& get_script() {
    static const auto script = make("return record(now_ms())\n");
    return script;
}

// ARGV: expected sandbox id, lease ms, token. {won, record}. A claim already held by this token
// (a retry after a lost reply) is won again.
const redis_script& claim_script() {
    static const auto script = make(R"lua(
local now = now_ms()
local holder = redis.call('GET', KEYS[2])
if holder == ARGV[3] then return {1, record(now)} end
local s = redis.call('HGET', KEYS[1], 's') or ''
if holder == false and s == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
  return {1, record(now)}
end
return {0, record(now)}
)lua");
    return script;
}

// ARGV: token, lease ms. 1 while the token holds the claim.
const redis_script& renew_script() {
    static const auto script = make(R"lua(
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
)lua");
    return script;
}

// ARGV: token, sandbox id, generation, ttl ms. 1: committed (also for a retry of a commit that
// went through: the entry names this token and sandbox), 0: the claim was lost.
const redis_script& commit_script() {
    static const auto script = make(R"lua(
local now = now_ms()
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  local e = redis.call('HMGET', KEYS[1], 't', 's')
  if e[1] == ARGV[1] and e[2] == ARGV[2] then return 1 end
  return 0
end
local e = redis.call('HMGET', KEYS[1], 's', 'e')
if (not e[1] or e[1] == '') and e[2] ~= '1' then redis.call('HSET', KEYS[1], 'n', '0') end
redis.call('HDEL', KEYS[1], 'e')
redis.call('HSET', KEYS[1], 's', ARGV[2], 'g', ARGV[3], 'u', ms(now), 't', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('DEL', KEYS[2])
return 1
)lua");
    return script;
}

// ARGV: token.
const redis_script& release_script() {
    static const auto script = make(R"lua(
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
)lua");
    return script;
}

// ARGV: sandbox id, ttl ms, take notice (1/0). {0} or {1, notice, record}.
const redis_script& touch_script() {
    static const auto script = make(R"lua(
local now = now_ms()
local e = redis.call('HMGET', KEYS[1], 's', 'g', 'n')
if not e[1] or e[1] ~= ARGV[1] then return {0} end
redis.call('HSET', KEYS[1], 'u', ms(now))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local notice = 0
if ARGV[3] == '1' and tonumber(e[2] or '0') > tonumber(e[3] or '0') then
  redis.call('HSET', KEYS[1], 'n', e[2])
  notice = 1
end
return {1, notice, record(now)}
)lua");
    return script;
}

// ARGV: sandbox id, unused at least ms (-1: any), remember for ms (-1: delete). 1: removed (or
// marked ended: the sandbox id cleared, 'e' set, generation and noticed kept, expiring then).
const redis_script& erase_script() {
    static const auto script = make(R"lua(
local now = now_ms()
local e = redis.call('HMGET', KEYS[1], 's', 'u')
if not e[1] or e[1] ~= ARGV[1] then return 0 end
local least = tonumber(ARGV[2])
if least >= 0 and now - tonumber(e[2] or '0') < least then return 0 end
local remember = tonumber(ARGV[3])
if remember >= 0 then
  redis.call('HSET', KEYS[1], 's', '', 'e', '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return 1
)lua");
    return script;
}

}  // namespace moat::store
