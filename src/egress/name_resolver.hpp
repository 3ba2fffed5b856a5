// The egress proxy's DNS resolver: host names to addresses, many lookups at once, with limits
// per key (the proxy's key is the sandbox id) so that one sandbox's slow or hung lookups never
// delay another's.
//
// Asio's resolver runs getaddrinfo(3) one call at a time on a single private thread: twelve
// lookups of names whose DNS never answers held every other sandbox's lookups behind them for
// the whole of their timeouts. This one wraps one c-ares channel driven by the executor: its
// sockets are watched with the executor's reactor and its timeouts with one timer, so lookups
// run concurrently and nothing blocks. Names are looked up as given (the host's search domains
// are never appended: the name resolved is the name the allow-list checked), in the hosts file
// first and then in DNS, as getaddrinfo does; A and AAAA together.
//
// Limits, per key: at most max_in_flight_per_key lookups run at once; up to max_waiting_per_key
// more wait (in arrival order) for one of those slots, and a lookup past that fails at once with
// limit_exceeded. A slot stays taken until c-ares ends its query (answered, or out of tries:
// about timeout * (2^tries - 1) per server), even when the caller stopped waiting, so a key's hung
// lookups occupy only that key's slots. All keys together run at most max_in_flight lookups.
//
// Confined to its executor: construct it, call async_resolve() and destroy it there. Destroy it
// before its io_context. Destroying it with lookups pending is safe: they complete with
// shutting_down (waiting ones) or backend_failure (running ones) when their coroutines next run.
#pragma once

#include <moat/deadline.hpp>
#include <moat/result.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/address.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace moat::egress {

struct resolver_options {
    // DNS servers as "ADDRESS" or "ADDRESS:PORT" ("127.0.0.1:5353", "[::1]:53"), tried in order;
    // empty: the host's, from /etc/resolv.conf (read once, at construction: unlike glibc's
    // getaddrinfo, a later change to the file is not seen until the resolver is made again).
    std::vector<std::string> servers;
    // Each query's first attempt waits this long for an answer; c-ares doubles it after every
    // round of the servers, up to `tries` attempts per server.
    std::chrono::milliseconds attempt_timeout{std::chrono::seconds(2)};
    int tries = 2;
    std::size_t max_in_flight_per_key = 4;  // lookups one key may have running at once
    std::size_t max_waiting_per_key = 32;   // lookups one key may have waiting for a slot
    std::size_t max_in_flight = 256;        // lookups running at once, all keys together
};

// The longest host name DNS can carry (RFC 1035: 253 characters without the final dot).
inline constexpr std::size_t max_host_name_bytes = 253;

class name_resolver {
  public:
    // A resolver that could not start (a server that is not an address, no memory) fails every
    // lookup with backend_failure and says why in startup_error().
    name_resolver(asio::any_io_executor executor, resolver_options options = {});
    name_resolver(const name_resolver&) = delete;
    name_resolver& operator=(const name_resolver&) = delete;
    ~name_resolver();

    // Why the resolver could not start ("" when it did).
    const std::string& startup_error() const noexcept;

    // The addresses `host` resolves to, in the resolver's order (IPv6 and IPv4 as the host's
    // address selection rules sort them), each once. `key` is the caller's unit of fairness.
    //
    // Errors, each detail a line naming the host:
    //   deadline_exceeded  `limit` passed while waiting for a slot or for the answer
    //   limit_exceeded     the key already has max_waiting_per_key lookups waiting
    //   backend_failure    no such name, no addresses, the server failed or refused, no server
    //                      answered within its tries, or the resolver was destroyed mid-query
    //   invalid_argument   an empty host, or one longer than max_host_name_bytes
    //   shutting_down      the resolver was destroyed while the lookup waited for a slot
    //
    // Per-operation cancellation (terminal, partial): completes with errc::cancelled at once,
    // whether the lookup was waiting for a slot or for c-ares. The query itself cannot be
    // stopped (c-ares has no per-query cancel): it keeps its key's slot until c-ares ends it,
    // and its late answer is dropped.
    asio::awaitable<result<std::vector<asio::ip::address>>> async_resolve(std::string key,
                                                                          std::string host,
                                                                          deadline limit);

    // Lookups running in c-ares (slots taken) and waiting for a slot, for `key`.
    std::size_t running(const std::string& key) const;
    std::size_t waiting(const std::string& key) const;

    struct core;  // implementation detail

  private:
    std::shared_ptr<core> core_;
};

}  // namespace moat::egress
