// Parsing a Redis store URL into a redis_config (pure: no I/O, no environment). Declared in
// <moat/redis_session_store.hpp> as moat::parse_redis_url; this file holds its helpers.
#pragma once

#include <moat/redis_session_store.hpp>

#include <string>
#include <string_view>

namespace moat::store {

// %XX decoding of a URL part; nullopt-like failure as an empty result with `ok` false.
bool percent_decode(std::string_view in, std::string& out);

}  // namespace moat::store
