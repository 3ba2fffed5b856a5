// A session store in Redis, shared by every worker (process or host) that points at the same
// Redis and key prefix: moat::make_redis_session_store. docs/redis.md has the key layout, the
// scripts and what happens when Redis or a worker dies.
//
// Connections: TCP (redis://), TLS (rediss://, the peer's certificate verified against the system
// CA store and/or tls_ca_file, and against the host name; there is no switch to turn that off),
// or a unix socket (unix://). moat does the I/O on its own Asio sockets (nothing blocks the
// executor) and uses hiredis only to parse replies, with caps on a reply's size, elements and
// nesting (a reply past them is protocol_error and the connection is dropped).
//
// Time: every operation runs within the caller's deadline; connecting is bounded by
// connect_timeout and each exchange by command_timeout, both cut to the deadline. A failed
// connect is retried (at most 3 times per operation) with exponential backoff shared by the
// store's callers (reconnect_backoff_initial doubling up to reconnect_backoff_max) while the
// deadline allows. As the contract says, every failure is errc::store_unavailable with a one-line
// detail naming the endpoint and the step: Redis unreachable, silent past a timeout or the
// deadline, credentials refused ("refused the credentials (WRONGPASS)"), a reply past the caps,
// an error reply. The caller's cancellation is errc::cancelled.
//
// Secrets: the password never appears in an error detail or a log line (to_string() and every
// detail name the endpoint without its user part). Take it from a file or MOAT_STORE_PASSWORD
// (load_redis_password) rather than a URL on a command line, where `ps` shows it.
#pragma once

#include <moat/result.hpp>
#include <moat/session_store.hpp>

#include <asio/any_io_executor.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace moat {

struct redis_config {
    enum class transport { tcp, tls, unix_socket };
    transport kind = transport::tcp;
    std::string host = "127.0.0.1";  // tcp, tls: a name or an IP literal (no brackets)
    std::uint16_t port = 6379;
    std::string socket_path;  // unix_socket
    int database = 0;         // SELECT after connecting, when not 0
    std::string username;     // AUTH user (Redis 6 ACL); "" for the default user
    std::string password;     // AUTH when not empty. Never logged.
    // Prepended to every key, so that applications sharing one Redis do not see each other's
    // sessions.
    std::string key_prefix = "moat:";
    // TLS: trust the system CA store, and/or the CAs in this PEM file.
    bool tls_use_system_store = true;
    std::string tls_ca_file;

    std::chrono::milliseconds connect_timeout{2000};
    std::chrono::milliseconds command_timeout{2000};
    std::chrono::milliseconds reconnect_backoff_initial{50};
    std::chrono::milliseconds reconnect_backoff_max{1000};
    // Open connections at most (each carries one exchange at a time, in order).
    std::size_t max_connections = 4;
    // Caps on one reply.
    std::size_t max_reply_bytes = 1 << 20;
    std::size_t max_reply_elements = 1024;
    std::size_t max_reply_depth = 4;

    // "redis://host:port/db", "rediss://...", "unix:///path?db=N": never the user or password.
    std::string to_string() const;
};

// Parses `redis://[user:password@]host[:port][/db]`, `rediss://...` (TLS) and
// `unix:///path/redis.sock[?db=N]`; every form also takes `?prefix=P` (the key prefix) and `db=N`
// as query parameters. A lone user part (`redis://secret@host`) is the password. Pure: reads no
// file or environment. invalid_argument naming the part that is wrong (never echoing the URL).
result<redis_config> parse_redis_url(std::string_view url);

// When the config has no password yet: the first line of `password_file` if one is given
// (invalid_argument when it cannot be read or is empty), else MOAT_STORE_PASSWORD if set.
result<void> load_redis_password(redis_config& config, const std::string& password_file = {});

// A session store in Redis. Nothing is connected until the first operation. Confined to
// `executor`; the store must be destroyed on it, after its operations have completed.
// invalid_argument for a config that cannot work (a TLS CA file that cannot be read, no host).
result<std::shared_ptr<session_store>> make_redis_session_store(asio::any_io_executor executor,
                                                                redis_config config);

}  // namespace moat
