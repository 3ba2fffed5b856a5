// One key's entry and the contract's steps on it (session_store.hpp), shared by the memory store
// and the host store so both decide claims, fencing, TTLs and idle time the same way. Times are
// steady_clock (CLOCK_MONOTONIC), which every process on one host shares.
#pragma once

#include <moat/session_store.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace moat::store_detail {

using clock = std::chrono::steady_clock;
using time_point = clock::time_point;

struct entry {
    std::string sandbox_id;  // "" while nothing is committed
    std::uint64_t generation = 0;
    std::uint64_t noticed = 0;
    time_point last_used{};
    time_point expires{};  // with the sandbox's TTL while sandbox_id is set; the marker's if ended
    bool ended = false;    // ended for idleness, kept as a marker (session_record::ended)
    std::string token;     // the claim's ("" while none is held)
    time_point lease_until{};
    std::string committed_by;  // the token of the commit that set sandbox_id (a retry's check)
};

// Drops what has run out: the claim after its lease, the committed part after its TTL.
inline void expire(entry& e, time_point now) {
    if (!e.token.empty() && now >= e.lease_until) e.token.clear();
    if ((!e.sandbox_id.empty() || e.ended) && now >= e.expires) {
        e.sandbox_id.clear();
        e.committed_by.clear();
        e.ended = false;
        e.generation = 0;
        e.noticed = 0;
    }
}

inline bool is_empty(const entry& e) {
    return e.sandbox_id.empty() && e.token.empty() && !e.ended;
}

inline std::optional<session_record> view(const entry* e, time_point now) {
    if (e == nullptr || is_empty(*e)) return std::nullopt;
    session_record r;
    r.sandbox_id = e->sandbox_id;
    r.generation = e->generation;
    r.noticed = e->noticed;
    if (!e->sandbox_id.empty()) {
        r.unused_for = std::chrono::duration_cast<std::chrono::milliseconds>(now - e->last_used);
    }
    r.claimed = !e->token.empty();
    r.ended = e->ended;
    return r;
}

inline session_claim claim(entry& e, const std::string& expected, std::chrono::milliseconds lease,
                           time_point now, std::string token) {
    expire(e, now);
    session_claim answer;
    if (e.token.empty() && e.sandbox_id == expected) {
        e.token = std::move(token);
        e.lease_until = now + lease;
        answer.token = e.token;
    }
    answer.current = view(&e, now);
    return answer;
}

inline bool holds(const entry& e, const std::string& token, time_point now) {
    return !token.empty() && e.token == token && now < e.lease_until;
}

inline bool renew(entry& e, const std::string& token, std::chrono::milliseconds lease,
                  time_point now) {
    if (!holds(e, token, now)) return false;
    e.lease_until = now + lease;
    return true;
}

// Idempotent for its token: a repeat of a commit that happened (a retry after a lost answer)
// answers true and changes nothing.
inline bool commit(entry& e, const std::string& token, std::string sandbox_id,
                   std::uint64_t generation, std::chrono::milliseconds ttl, time_point now) {
    if (!holds(e, token, now)) {
        return !token.empty() && e.committed_by == token && e.sandbox_id == sandbox_id;
    }
    e.committed_by = token;
    if (e.sandbox_id.empty() && !e.ended) e.noticed = 0;
    e.ended = false;
    e.sandbox_id = std::move(sandbox_id);
    e.generation = generation;
    e.last_used = now;
    e.expires = now + ttl;
    e.token.clear();
    return true;
}

inline void release(entry& e, const std::string& token) {
    if (!token.empty() && e.token == token) e.token.clear();
}

inline std::optional<session_touch> touch(entry& e, const std::string& sandbox_id,
                                          std::chrono::milliseconds ttl, bool take_notice,
                                          time_point now) {
    expire(e, now);
    if (e.sandbox_id.empty() || e.sandbox_id != sandbox_id) return std::nullopt;
    e.last_used = now;
    e.expires = now + ttl;
    session_touch answer;
    if (take_notice && e.generation > e.noticed) {
        e.noticed = e.generation;
        answer.notice = true;
    }
    answer.current = *view(&e, now);
    return answer;
}

inline bool erase(entry& e, const std::string& sandbox_id,
                  std::optional<std::chrono::milliseconds> unused_at_least,
                  std::optional<std::chrono::milliseconds> remember_for, time_point now) {
    expire(e, now);
    if (e.sandbox_id.empty() || e.sandbox_id != sandbox_id) return false;
    if (unused_at_least && now - e.last_used < *unused_at_least) return false;
    e.sandbox_id.clear();
    e.committed_by.clear();
    if (remember_for) {
        e.ended = true;
        e.expires = now + *remember_for;
        return true;
    }
    e.generation = 0;
    e.noticed = 0;
    return true;
}

}  // namespace moat::store_detail
