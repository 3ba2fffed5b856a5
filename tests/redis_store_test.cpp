// The Redis session store against a real redis-server that each test starts (on a unix socket and
// a free loopback port, in a temporary directory) and stops: URL parsing, the RESP reader's caps,
// the client's I/O (pipelining, reconnect, timeouts, AUTH, TLS), and the store's contract.
#include <doctest/doctest.h>

#include <moat/log.hpp>
#include <moat/redis_session_store.hpp>
#include <moat/session_store.hpp>

#include "http/tls.hpp"
#include "store/redis_client.hpp"
#include "store/redis_reply.hpp"
#include "support/async_test.hpp"
#include "support/build_paths.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"
#include "support/redis_server.hpp"
#include "support/session_worker_process.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

using moat::redis_config;
using moat::store::redis_client;
using moat::store::redis_command;
using moat::store::redis_reply;
using moat::test::field;
using moat::test::finish;
using moat::test::free_loopback_port;
using moat::test::read_line;
using moat::test::redis_server;
using moat::test::run_async;
using moat::test::running_with;
using moat::test::start_worker;
using namespace std::chrono_literals;

namespace {

const std::string source_dir = moat::test::source_dir();

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

// Every log record while it lives.
struct log_capture {
    std::mutex mutex;
    std::vector<std::string> lines;
    log_capture() {
        moat::set_log_sink([this](const moat::log_record& r) {
            std::lock_guard lock(mutex);
            lines.emplace_back(std::string(r.component) + ": " + std::string(r.message));
        });
    }
    ~log_capture() { moat::set_log_sink({}); }
    bool any_contains(const std::string& needle) {
        std::lock_guard lock(mutex);
        for (const auto& line : lines) {
            if (contains(line, needle)) return true;
        }
        return false;
    }
};

redis_command cmd(std::initializer_list<std::string> parts) {
    return redis_command(parts);
}

}  // namespace

TEST_CASE("a Redis URL parses into transport, host, port, database, credentials and prefix") {
    auto tcp = moat::parse_redis_url("redis://app:s%40cret@cache.internal:6380/3?prefix=app1:");
    REQUIRE(tcp);
    CHECK(tcp->kind == redis_config::transport::tcp);
    CHECK(tcp->host == "cache.internal");
    CHECK(tcp->port == 6380);
    CHECK(tcp->database == 3);
    CHECK(tcp->username == "app");
    CHECK(tcp->password == "s@cret");
    CHECK(tcp->key_prefix == "app1:");
    CHECK(tcp->to_string() == "redis://cache.internal:6380/3");

    auto defaults = moat::parse_redis_url("redis://localhost");
    REQUIRE(defaults);
    CHECK(defaults->port == 6379);
    CHECK(defaults->database == 0);
    CHECK(defaults->password.empty());
    CHECK(defaults->key_prefix == "moat:");

    auto lone = moat::parse_redis_url("redis://:pw@[::1]:7000");
    REQUIRE(lone);
    CHECK(lone->host == "::1");
    CHECK(lone->port == 7000);
    CHECK(lone->username.empty());
    CHECK(lone->password == "pw");
    CHECK(lone->to_string() == "redis://[::1]:7000");

    auto tls = moat::parse_redis_url("rediss://secret@redis.example.com:6390");
    REQUIRE(tls);
    CHECK(tls->kind == redis_config::transport::tls);
    CHECK(tls->password == "secret");
    CHECK(tls->to_string() == "rediss://redis.example.com:6390");

    auto unix_socket = moat::parse_redis_url("unix:///run/redis/redis.sock?db=2&prefix=x:");
    REQUIRE(unix_socket);
    CHECK(unix_socket->kind == redis_config::transport::unix_socket);
    CHECK(unix_socket->socket_path == "/run/redis/redis.sock");
    CHECK(unix_socket->database == 2);
    CHECK(unix_socket->key_prefix == "x:");
    CHECK(unix_socket->to_string() == "unix:///run/redis/redis.sock?db=2");
}

TEST_CASE("a malformed Redis URL is refused naming the part, never echoing the password") {
    const char* bad[] = {
        "http://u:hunter2@host",       "redis://u:hunter2@host:99999",
        "redis://u:hunter2@host:port", "redis://u:hunter2@host/db7",
        "redis://u:hunter2@",          "redis://u:hunter2@ho st",
        "redis://u:hunter2%zz@host",   "redis://u:hunter2@host?db=1&color=red",
        "unix://relative/redis.sock",  "redis://u:hunter2@[::1",
        "redis://u:hunter2@host:",     "redis://u:hunter2@host?prefix=a%20b",
        "redis://u:hunter2@host#frag",
    };
    for (const char* url : bad) {
        CAPTURE(url);
        auto parsed = moat::parse_redis_url(url);
        REQUIRE_FALSE(parsed);
        CHECK(parsed.error().code == moat::errc::invalid_argument);
        CHECK(contains(parsed.error().detail, "store URL: "));
        CHECK_FALSE(contains(parsed.error().detail, "hunter2"));
    }
}

TEST_CASE("the store password comes from a file or MOAT_STORE_PASSWORD when the URL has none") {
    char pattern[] = "/tmp/moat-redis-pw-XXXXXX";
    const int fd = ::mkstemp(pattern);
    REQUIRE(fd >= 0);
    ::close(fd);
    {
        std::ofstream out(pattern);
        out << "from-file\n";
    }
    ::setenv("MOAT_STORE_PASSWORD", "from-env", 1);
    redis_config config;
    REQUIRE(moat::load_redis_password(config, pattern));
    CHECK(config.password == "from-file");
    redis_config from_env;
    REQUIRE(moat::load_redis_password(from_env));
    CHECK(from_env.password == "from-env");
    redis_config from_url;
    from_url.password = "from-url";
    REQUIRE(moat::load_redis_password(from_url, pattern));
    CHECK(from_url.password == "from-url");
    ::unsetenv("MOAT_STORE_PASSWORD");
    redis_config missing;
    auto unreadable = moat::load_redis_password(missing, std::string(pattern) + ".none");
    REQUIRE_FALSE(unreadable);
    CHECK(unreadable.error().code == moat::errc::invalid_argument);
    ::unlink(pattern);
}

TEST_CASE("the reply reader parses RESP fed one byte at a time") {
    moat::store::reply_reader reader(moat::store::reply_limits{});
    const std::string bytes =
        "+OK\r\n-ERR wrong\r\n:42\r\n$5\r\nhello\r\n$-1\r\n*3\r\n:1\r\n*1\r\n$0\r\n\r\n$-1\r\n";
    std::vector<redis_reply> replies;
    for (const char c : bytes) {
        REQUIRE(reader.feed(std::string_view(&c, 1)));
        for (;;) {
            auto next = reader.next();
            REQUIRE(next);
            if (!*next) break;
            replies.push_back(std::move(**next));
        }
    }
    REQUIRE(replies.size() == 6);
    CHECK(replies[0].type == redis_reply::kind::status);
    CHECK(replies[0].text == "OK");
    CHECK(replies[1].is_error());
    CHECK(replies[1].text == "ERR wrong");
    CHECK(replies[2].integer == 42);
    CHECK(replies[3].text == "hello");
    CHECK(replies[4].is_nil());
    REQUIRE(replies[5].elements.size() == 3);
    CHECK(replies[5].elements[0].integer == 1);
    REQUIRE(replies[5].elements[1].elements.size() == 1);
    CHECK(replies[5].elements[1].elements[0].text.empty());
    CHECK(replies[5].elements[2].is_nil());
}

TEST_CASE("the reply reader refuses a reply past its size, element or nesting cap") {
    moat::store::reply_limits limits;
    limits.max_bytes = 1024;
    limits.max_elements = 8;
    limits.max_depth = 2;
    {
        // A bulk string announced larger than the cap: refused as its bytes arrive, before
        // they are all buffered.
        moat::store::reply_reader reader(limits);
        REQUIRE(reader.feed("$100000\r\n"));
        CHECK_FALSE(reader.next().value().has_value());
        const std::string chunk(600, 'x');
        REQUIRE(reader.feed(chunk));
        auto over = reader.feed(chunk);
        REQUIRE_FALSE(over);
        CHECK(over.error().code == moat::errc::protocol_error);
        CHECK(contains(over.error().detail, "larger than 1024 bytes"));
    }
    {
        moat::store::reply_reader reader(limits);
        REQUIRE(reader.feed("*9\r\n"));
        auto wide = reader.next();
        REQUIRE_FALSE(wide);
        CHECK(wide.error().code == moat::errc::protocol_error);
        CHECK(contains(wide.error().detail, "more than 8 elements"));
        // Unusable from then on.
        CHECK_FALSE(reader.feed(":1\r\n"));
    }
    {
        moat::store::reply_reader reader(limits);
        REQUIRE(reader.feed("*1\r\n*1\r\n*1\r\n:1\r\n"));
        auto deep = reader.next();
        REQUIRE_FALSE(deep);
        CHECK(contains(deep.error().detail, "nested deeper than 2"));
    }
    {
        // Many small strings: the reply's total is capped, not only each string.
        moat::store::reply_reader reader(limits);
        std::string many = "*8\r\n";
        for (int i = 0; i < 8; ++i) many += "$100\r\n" + std::string(100, 'y') + "\r\n";
        REQUIRE(reader.feed(many));
        auto total = reader.next();
        REQUIRE_FALSE(total);
        CHECK(contains(total.error().detail, "larger than 1024 bytes"));
    }
    {
        moat::store::reply_reader reader(limits);
        REQUIRE(reader.feed("?what\r\n"));
        auto garbage = reader.next();
        REQUIRE_FALSE(garbage);
        CHECK(garbage.error().code == moat::errc::protocol_error);
    }
}

TEST_CASE("the Redis client pipelines commands in order over a unix socket and over TCP") {
    redis_server server;
    for (const auto& config : {server.unix_config(), server.tcp_config()}) {
        CAPTURE(config.to_string());
        asio::io_context io;
        redis_client client(io.get_executor(), config, nullptr);
        run_async(io, [&]() -> asio::awaitable<void> {
            std::vector<redis_command> batch;
            batch.push_back(cmd({"DEL", "counter"}));
            for (int i = 0; i < 50; ++i) batch.push_back(cmd({"INCR", "counter"}));
            batch.push_back(cmd({"SET", "greeting", "hello\r\nworld"}));
            batch.push_back(cmd({"GET", "greeting"}));
            batch.push_back(cmd({"GET", "missing"}));
            batch.push_back(cmd({"NOSUCHCOMMAND"}));
            const auto limit = moat::deadline::after(5s);
            auto replies = co_await client.async_run(std::move(batch), limit);
            REQUIRE(replies);
            REQUIRE(replies->size() == 55);
            for (int i = 0; i < 50; ++i) CHECK((*replies)[1 + i].integer == i + 1);
            CHECK((*replies)[52].text == "hello\r\nworld");
            CHECK((*replies)[53].is_nil());
            CHECK((*replies)[54].is_error());
            // The connection is reused for the next exchange.
            auto command1 = cmd({"GET", "counter"});
            auto again = co_await client.async_command(std::move(command1), limit);
            REQUIRE(again);
            CHECK(again->text == "50");
            CHECK(client.connections_opened() == 1);
        }());
    }
}

TEST_CASE(
    "a reply past the cap from a real Redis is a protocol error, and the next command reconnects") {
    redis_server server;
    auto config = server.unix_config();
    config.max_reply_bytes = 4096;
    asio::io_context io;
    redis_client client(io.get_executor(), config, nullptr);
    run_async(io, [&]() -> asio::awaitable<void> {
        const auto limit = moat::deadline::after(5s);
        const std::string big(100000, 'z');
        auto command2 = cmd({"SET", "big", big});
        auto set = co_await client.async_command(std::move(command2), limit);
        REQUIRE(set);
        auto command3 = cmd({"GET", "big"});
        auto got = co_await client.async_command(std::move(command3), limit);
        REQUIRE_FALSE(got);
        CHECK(got.error().code == moat::errc::protocol_error);
        CHECK(contains(got.error().detail, "larger than 4096 bytes"));
        auto command4 = cmd({"PING"});
        auto ping = co_await client.async_command(std::move(command4), limit);
        REQUIRE(ping);
        CHECK(ping->text == "PONG");
        CHECK(client.connections_opened() == 2);
    }());
}

TEST_CASE("a wrong Redis password is refused, and neither the errors nor the log carry it") {
    redis_server server({"--requirepass", "right-password-31337"});
    log_capture log;
    asio::io_context io;
    const std::string wrong = "wrong-password-4242";
    run_async(io, [&]() -> asio::awaitable<void> {
        const auto limit = moat::deadline::after(5s);
        std::vector<std::string> details;
        {
            auto config = server.unix_config();
            config.password = wrong;
            redis_client client(io.get_executor(), config, nullptr);
            auto command5 = cmd({"PING"});
            auto refused = co_await client.async_command(std::move(command5), limit);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == moat::errc::unauthorized);
            CHECK(contains(refused.error().detail, "WRONGPASS"));
            details.push_back(refused.error().to_string());
        }
        {
            auto config = server.tcp_config();
            config.username = "default";
            config.password = wrong;
            redis_client client(io.get_executor(), config, nullptr);
            auto command6 = cmd({"PING"});
            auto refused = co_await client.async_command(std::move(command6), limit);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == moat::errc::unauthorized);
            details.push_back(refused.error().to_string());
        }
        {
            // No password at all: NOAUTH on the first command.
            redis_client client(io.get_executor(), server.unix_config(), nullptr);
            auto command7 = cmd({"PING"});
            auto refused = co_await client.async_command(std::move(command7), limit);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == moat::errc::unauthorized);
            CHECK(contains(refused.error().detail, "NOAUTH"));
        }
        {
            // Unreachable, with the password set: the errors name the endpoint only.
            auto config = server.tcp_config();
            config.port = free_loopback_port();
            config.password = wrong;
            config.reconnect_backoff_initial = 1ms;
            redis_client client(io.get_executor(), config, nullptr);
            auto command8 = cmd({"PING"});
            auto refused = co_await client.async_command(std::move(command8), limit);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == moat::store::unavailable_code);
            details.push_back(refused.error().to_string());
        }
        {
            auto config = server.unix_config();
            config.password = "right-password-31337";
            redis_client client(io.get_executor(), config, nullptr);
            auto command9 = cmd({"PING"});
            auto ok = co_await client.async_command(std::move(command9), limit);
            REQUIRE(ok);
            CHECK(ok->text == "PONG");
        }
        for (const auto& d : details) {
            CAPTURE(d);
            CHECK_FALSE(contains(d, wrong));
            CHECK_FALSE(contains(d, "right-password"));
        }
    }());
    CHECK(log.any_contains("next attempt"));  // the unreachable case logged its retries
    CHECK_FALSE(log.any_contains(wrong));
    CHECK_FALSE(log.any_contains("right-password"));
}

TEST_CASE(
    "Redis stopped makes the client fail within its deadline, and it works again after a restart" *
    moat::test::shares_host) {
    redis_server server;
    auto config = server.tcp_config();
    config.connect_timeout = 500ms;
    config.reconnect_backoff_initial = 20ms;
    config.reconnect_backoff_max = 100ms;
    asio::io_context io;
    redis_client client(io.get_executor(), config, nullptr);
    run_async(io, [&]() -> asio::awaitable<void> {
        auto command10 = cmd({"SET", "k", "v"});
        auto first = co_await client.async_command(std::move(command10), moat::deadline::after(5s));
        REQUIRE(first);
        server.stop();
        const auto limit = moat::deadline::after(2s);
        auto command11 = cmd({"GET", "k"});
        auto down = co_await client.async_command(std::move(command11), limit);
        REQUIRE_FALSE(down);
        CHECK(down.error().code == moat::store::unavailable_code);
        CHECK(contains(down.error().detail, "Redis at redis://127.0.0.1:"));
        CHECK(std::chrono::steady_clock::now() <= limit.when() + 100ms);
        server.start();
        // The backoff is bounded: a call within it waits (its deadline allows) and connects.
        auto command12 = cmd({"PING"});
        auto back = co_await client.async_command(std::move(command12), moat::deadline::after(5s));
        REQUIRE(back);
        CHECK(back->text == "PONG");
    }());
}

TEST_CASE("the Redis client speaks TLS with the peer verified, and refuses an unknown CA") {
    char pattern[] = "/tmp/moat-redis-ca-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    const std::string certificates = pattern;
    const auto command = source_dir + "/tests/http/make_test_ca.sh " + certificates;
    REQUIRE(std::system(command.c_str()) == 0);
    const auto tls_port = free_loopback_port();
    {
        redis_server server({"--tls-port", std::to_string(tls_port), "--tls-cert-file",
                             certificates + "/good.pem", "--tls-key-file",
                             certificates + "/good.key", "--tls-ca-cert-file",
                             certificates + "/ca.pem", "--tls-auth-clients", "no"});
        asio::io_context io;
        run_async(io, [&]() -> asio::awaitable<void> {
            const auto limit = moat::deadline::after(5s);
            auto parsed = moat::parse_redis_url("rediss://127.0.0.1:" + std::to_string(tls_port));
            REQUIRE(parsed);
            auto config = *parsed;
            config.tls_use_system_store = false;
            config.tls_ca_file = certificates + "/ca.pem";
            moat::http::tls_client_options options;
            options.use_system_store = false;
            options.ca_file = config.tls_ca_file;
            auto context = moat::http::make_client_context(options);
            REQUIRE(context);
            {
                redis_client client(io.get_executor(), config, *context);
                auto command13 = cmd({"PING"});
                auto ping = co_await client.async_command(std::move(command13), limit);
                REQUIRE(ping);
                CHECK(ping->text == "PONG");
            }
            {
                // The same server, a client that trusts only the system store: refused.
                moat::http::tls_client_options system_only;
                auto untrusting = moat::http::make_client_context(system_only);
                REQUIRE(untrusting);
                config.reconnect_backoff_initial = 1ms;
                redis_client client(io.get_executor(), config, *untrusting);
                auto command14 = cmd({"PING"});
                auto refused = co_await client.async_command(std::move(command14), limit);
                REQUIRE_FALSE(refused);
                CHECK(contains(refused.error().detail, "certificate verify failed: unknown CA"));
            }
            {
                // By name: SNI, and the certificate checked against "localhost".
                auto by_name = config;
                by_name.host = "localhost";
                redis_client client(io.get_executor(), by_name, *context);
                auto by_name_ping = cmd({"PING"});
                auto ping = co_await client.async_command(std::move(by_name_ping), limit);
                REQUIRE(ping);
                CHECK(ping->text == "PONG");
            }
        }());
    }
    std::error_code ignored;
    std::filesystem::remove_all(certificates, ignored);
}

// --- the store's contract --------------------------------------------------------------------

namespace {

std::shared_ptr<moat::session_store> make_store(asio::io_context& io, redis_config config) {
    auto made = moat::make_redis_session_store(io.get_executor(), std::move(config));
    REQUIRE(made);
    return std::move(*made);
}

// One claimer's outcome, for the concurrent case.
struct claim_outcome {
    std::optional<moat::result<moat::session_claim>> answer;
};

struct claim_done {
    claim_outcome* out;
    std::size_t* finished;
    void operator()(std::exception_ptr e, moat::result<moat::session_claim> r) const {
        if (!e) out->answer.emplace(std::move(r));
        ++*finished;
    }
};

asio::awaitable<moat::result<moat::session_claim>> claim_once(
    std::shared_ptr<moat::session_store> store, std::string key) {
    const auto limit = moat::deadline::after(5s);
    co_return co_await store->async_claim(std::move(key), "", 10s, limit);
}

}  // namespace

TEST_CASE(
    "the Redis store claims, renews, commits, touches with the notice once and erases if idle") {
    redis_server server;
    asio::io_context io;
    auto store = make_store(io, server.unix_config());
    run_async(io, [&]() -> asio::awaitable<void> {
        const auto limit = moat::deadline::after(10s);
        auto none = co_await store->async_get("conversation-1", limit);
        REQUIRE(none);
        CHECK_FALSE(none->has_value());

        auto won = co_await store->async_claim("conversation-1", "", 10s, limit);
        REQUIRE(won);
        REQUIRE(won->token);
        REQUIRE(won->current);
        CHECK(won->current->claimed);
        CHECK(won->current->sandbox_id.empty());
        auto lost = co_await store->async_claim("conversation-1", "", 10s, limit);
        REQUIRE(lost);
        CHECK_FALSE(lost->token);
        REQUIRE(lost->current);
        CHECK(lost->current->claimed);

        auto renewed = co_await store->async_renew("conversation-1", *won->token, 10s, limit);
        REQUIRE(renewed);
        CHECK(*renewed);
        auto foreign = co_await store->async_renew("conversation-1", "r-not-a-token", 10s, limit);
        REQUIRE(foreign);
        CHECK_FALSE(*foreign);

        auto committed =
            co_await store->async_commit("conversation-1", *won->token, "box-a", 0, 60s, limit);
        REQUIRE(committed);
        CHECK(*committed);
        // A repeat of the same commit (a retry after a lost reply) is still a success; a commit
        // with a token that never held the claim is not.
        auto again =
            co_await store->async_commit("conversation-1", *won->token, "box-a", 0, 60s, limit);
        REQUIRE(again);
        CHECK(*again);
        auto forged =
            co_await store->async_commit("conversation-1", "r-forged", "box-evil", 0, 60s, limit);
        REQUIRE(forged);
        CHECK_FALSE(*forged);

        auto record = co_await store->async_get("conversation-1", limit);
        REQUIRE(record);
        REQUIRE(record->has_value());
        CHECK((*record)->sandbox_id == "box-a");
        CHECK((*record)->generation == 0);
        CHECK_FALSE((*record)->claimed);

        // The entry expires with the sandbox's TTL, on Redis's clock.
        redis_client raw(io.get_executor(), server.unix_config(), nullptr);
        auto pttl_command = cmd({"PTTL", "moat:s:conversation-1"});
        auto pttl = co_await raw.async_command(std::move(pttl_command), limit);
        REQUIRE(pttl);
        CHECK(pttl->integer > 0);
        CHECK(pttl->integer <= 60000);

        // The rebuild: both workers saw box-a gone; one claim wins (compare-and-set on box-a).
        auto rebuild = co_await store->async_claim("conversation-1", "box-a", 10s, limit);
        REQUIRE(rebuild);
        REQUIRE(rebuild->token);
        auto second = co_await store->async_claim("conversation-1", "box-a", 10s, limit);
        REQUIRE(second);
        CHECK_FALSE(second->token);
        auto rebuilt =
            co_await store->async_commit("conversation-1", *rebuild->token, "box-b", 1, 60s, limit);
        REQUIRE(rebuilt);
        CHECK(*rebuilt);
        // The late one finds the new entry, not box-a: its claim fails.
        auto late = co_await store->async_claim("conversation-1", "box-a", 10s, limit);
        REQUIRE(late);
        CHECK_FALSE(late->token);
        REQUIRE(late->current);
        CHECK(late->current->sandbox_id == "box-b");
        CHECK(late->current->generation == 1);
        CHECK(late->current->noticed == 0);

        // The notice of generation 1 is taken exactly once.
        auto first_touch = co_await store->async_touch("conversation-1", "box-b", 60s, true, limit);
        REQUIRE(first_touch);
        REQUIRE(first_touch->has_value());
        CHECK((*first_touch)->notice);
        CHECK((*first_touch)->current.noticed == 1);
        auto second_touch =
            co_await store->async_touch("conversation-1", "box-b", 60s, true, limit);
        REQUIRE(second_touch);
        REQUIRE(second_touch->has_value());
        CHECK_FALSE((*second_touch)->notice);
        auto stale_touch = co_await store->async_touch("conversation-1", "box-a", 60s, true, limit);
        REQUIRE(stale_touch);
        CHECK_FALSE(stale_touch->has_value());

        // Erase if idle: just used, so an idle erase keeps it; an erase naming another sandbox
        // keeps it; a plain erase removes it.
        const std::optional<std::chrono::milliseconds> idle = 60s;
        const std::optional<std::chrono::milliseconds> any;
        auto kept = co_await store->async_erase("conversation-1", "box-b", idle, any, limit);
        REQUIRE(kept);
        CHECK_FALSE(*kept);
        auto wrong = co_await store->async_erase("conversation-1", "box-a", any, any, limit);
        REQUIRE(wrong);
        CHECK_FALSE(*wrong);

        // Ended for idleness: a marker keeps the generation and notice mark for its time; a
        // claim expecting "" takes it; the next generation's commit is announced once.
        const std::optional<std::chrono::milliseconds> remember = 60s;
        auto marked = co_await store->async_erase("conversation-1", "box-b", any, remember, limit);
        REQUIRE(marked);
        CHECK(*marked);
        auto marker = co_await store->async_get("conversation-1", limit);
        REQUIRE(marker);
        REQUIRE(marker->has_value());
        CHECK((*marker)->ended);
        CHECK((*marker)->sandbox_id.empty());
        CHECK((*marker)->generation == 1);
        CHECK((*marker)->noticed == 1);
        auto marker_ttl_command = cmd({"PTTL", "moat:s:conversation-1"});
        auto marker_ttl = co_await raw.async_command(std::move(marker_ttl_command), limit);
        REQUIRE(marker_ttl);
        CHECK(marker_ttl->integer > 0);
        CHECK(marker_ttl->integer <= 60000);
        auto on_marker = co_await store->async_touch("conversation-1", "box-b", 60s, true, limit);
        REQUIRE(on_marker);
        CHECK_FALSE(on_marker->has_value());
        auto reclaim = co_await store->async_claim("conversation-1", "", 10s, limit);
        REQUIRE(reclaim);
        REQUIRE(reclaim->token);
        auto back =
            co_await store->async_commit("conversation-1", *reclaim->token, "box-c", 2, 60s, limit);
        REQUIRE(back);
        CHECK(*back);
        auto told = co_await store->async_touch("conversation-1", "box-c", 60s, true, limit);
        REQUIRE(told);
        REQUIRE(told->has_value());
        CHECK((*told)->notice);
        CHECK_FALSE((*told)->current.ended);
        auto once = co_await store->async_touch("conversation-1", "box-c", 60s, true, limit);
        REQUIRE(once);
        REQUIRE(once->has_value());
        CHECK_FALSE((*once)->notice);

        auto erased = co_await store->async_erase("conversation-1", "box-c", any, any, limit);
        REQUIRE(erased);
        CHECK(*erased);
        auto gone = co_await store->async_get("conversation-1", limit);
        REQUIRE(gone);
        CHECK_FALSE(gone->has_value());

        // A claim given up: the next claimer wins at once.
        auto given = co_await store->async_claim("conversation-2", "", 10s, limit);
        REQUIRE(given);
        REQUIRE(given->token);
        auto released = co_await store->async_release("conversation-2", *given->token, limit);
        REQUIRE(released);
        auto next = co_await store->async_claim("conversation-2", "", 10s, limit);
        REQUIRE(next);
        CHECK(next->token);
        CHECK(*next->token != *given->token);
    }());
}

TEST_CASE(
    "8 concurrent claimers of one key through the Redis store, each on its own connection, give "
    "one winner") {
    redis_server server;
    asio::io_context io;
    std::vector<std::shared_ptr<moat::session_store>> stores;
    for (int i = 0; i < 8; ++i) stores.push_back(make_store(io, server.tcp_config()));
    std::vector<claim_outcome> outcomes(8);
    std::size_t finished = 0;
    for (std::size_t i = 0; i < 8; ++i) {
        asio::co_spawn(io, claim_once(stores[i], "shared-key"),
                       claim_done{&outcomes[i], &finished});
    }
    run_async(io, [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(io);
        while (finished < 8) {
            timer.expires_after(5ms);
            co_await timer.async_wait(asio::use_awaitable);
        }
    }());
    std::size_t winners = 0;
    for (const auto& o : outcomes) {
        REQUIRE(o.answer);
        REQUIRE(*o.answer);
        if ((*o.answer)->token) ++winners;
        REQUIRE((*o.answer)->current);
        CHECK((*o.answer)->current->claimed);
    }
    CHECK(winners == 1);
}

TEST_CASE("a Redis claim whose lease ran out is fenced: its holder can neither renew nor commit") {
    redis_server server;
    asio::io_context io;
    auto first_worker = make_store(io, server.unix_config());
    auto second_worker = make_store(io, server.unix_config());
    run_async(io, [&]() -> asio::awaitable<void> {
        const auto limit = moat::deadline::after(10s);
        auto first = co_await first_worker->async_claim("k", "", 100ms, limit);
        REQUIRE(first);
        REQUIRE(first->token);
        auto blocked = co_await second_worker->async_claim("k", "", 10s, limit);
        REQUIRE(blocked);
        CHECK_FALSE(blocked->token);
        // Past the lease (Redis expires the claim key by itself).
        asio::steady_timer timer(io, 300ms);
        co_await timer.async_wait(asio::use_awaitable);
        auto expired = co_await second_worker->async_get("k", limit);
        REQUIRE(expired);
        CHECK_FALSE(expired->has_value());
        auto second = co_await second_worker->async_claim("k", "", 10s, limit);
        REQUIRE(second);
        REQUIRE(second->token);
        auto renewed = co_await first_worker->async_renew("k", *first->token, 10s, limit);
        REQUIRE(renewed);
        CHECK_FALSE(*renewed);
        auto stale =
            co_await first_worker->async_commit("k", *first->token, "box-old", 0, 60s, limit);
        REQUIRE(stale);
        CHECK_FALSE(*stale);
        auto fresh =
            co_await second_worker->async_commit("k", *second->token, "box-new", 0, 60s, limit);
        REQUIRE(fresh);
        CHECK(*fresh);
        // The stale holder's release does not touch its successor's entry.
        auto released = co_await first_worker->async_release("k", *first->token, limit);
        REQUIRE(released);
        auto record = co_await first_worker->async_get("k", limit);
        REQUIRE(record);
        REQUIRE(record->has_value());
        CHECK((*record)->sandbox_id == "box-new");
    }());
}

TEST_CASE(
    "Redis stopped mid-run fails store operations with store_unavailable within the deadline, then "
    "they succeed after the restart without a duplicate" *
    moat::test::shares_host) {
    // Persistence on, as a production Redis has it: the entry survives the restart.
    redis_server server({"--appendonly", "yes", "--appendfsync", "always"});
    asio::io_context io;
    auto config = server.tcp_config();
    config.reconnect_backoff_initial = 20ms;
    config.reconnect_backoff_max = 200ms;
    auto store = make_store(io, config);
    run_async(io, [&]() -> asio::awaitable<void> {
        const auto limit = moat::deadline::after(10s);
        auto claimed = co_await store->async_claim("k", "", 10s, limit);
        REQUIRE(claimed);
        REQUIRE(claimed->token);
        auto committed =
            co_await store->async_commit("k", *claimed->token, "box-1", 0, 600s, limit);
        REQUIRE(committed);
        REQUIRE(*committed);

        server.stop();
        for (int i = 0; i < 3; ++i) {
            const auto short_limit = moat::deadline::after(1s);
            auto down = co_await store->async_claim("k", "", 10s, short_limit);
            REQUIRE_FALSE(down);
            CHECK(down.error().code == moat::errc::store_unavailable);
            CHECK(down.error().code == moat::condition::unavailable);
            CHECK(contains(down.error().detail, "Redis at redis://127.0.0.1:"));
            // Within the caller's deadline (a bound, not a speed measurement).
            CHECK(std::chrono::steady_clock::now() <= short_limit.when() + 250ms);
        }

        server.start();
        // After the restart: the same entry, so a worker attaches rather than creating again.
        auto back = co_await store->async_get("k", limit);
        REQUIRE(back);
        REQUIRE(back->has_value());
        CHECK((*back)->sandbox_id == "box-1");
        auto duplicate = co_await store->async_claim("k", "", 10s, limit);
        REQUIRE(duplicate);
        CHECK_FALSE(duplicate->token);
        // Redis forgot its script cache: EVALSHA got NOSCRIPT and the store fell back to EVAL.
        auto touched = co_await store->async_touch("k", "box-1", 600s, false, limit);
        REQUIRE(touched);
        CHECK(touched->has_value());
    }());
}

TEST_CASE(
    "the Redis store with a wrong password fails with store_unavailable, and no error or log line "
    "carries the password") {
    redis_server server({"--requirepass", "the-right-one-77"});
    log_capture log;
    asio::io_context io;
    auto config = server.tcp_config();
    config.password = "the-wrong-one-88";
    auto store = make_store(io, config);
    auto unreachable_config = server.tcp_config();
    unreachable_config.port = free_loopback_port();
    unreachable_config.password = "the-wrong-one-88";
    unreachable_config.reconnect_backoff_initial = 1ms;
    auto unreachable = make_store(io, unreachable_config);
    std::vector<std::string> details;
    run_async(io, [&]() -> asio::awaitable<void> {
        const auto limit = moat::deadline::after(5s);
        auto claimed = co_await store->async_claim("k", "", 10s, limit);
        REQUIRE_FALSE(claimed);
        CHECK(claimed.error().code == moat::errc::store_unavailable);
        CHECK(contains(claimed.error().detail, "refused the credentials (WRONGPASS)"));
        details.push_back(claimed.error().to_string());
        auto got = co_await store->async_get("k", limit);
        REQUIRE_FALSE(got);
        details.push_back(got.error().to_string());
        auto down = co_await unreachable->async_get("k", limit);
        REQUIRE_FALSE(down);
        CHECK(down.error().code == moat::errc::store_unavailable);
        details.push_back(down.error().to_string());
    }());
    for (const auto& d : details) {
        CAPTURE(d);
        CHECK_FALSE(contains(d, "the-wrong-one"));
        CHECK_FALSE(contains(d, "the-right-one"));
    }
    CHECK_FALSE(log.any_contains("the-wrong-one"));
    CHECK_FALSE(log.any_contains("the-right-one"));
}

TEST_CASE("a key prefix isolates two applications sharing one Redis") {
    redis_server server;
    asio::io_context io;
    auto app1_config = server.unix_config();
    app1_config.key_prefix = "app1:";
    auto app2_config = server.unix_config();
    app2_config.key_prefix = "app2:";
    auto app1 = make_store(io, app1_config);
    auto app2 = make_store(io, app2_config);
    run_async(io, [&]() -> asio::awaitable<void> {
        const auto limit = moat::deadline::after(5s);
        auto claimed = co_await app1->async_claim("thread-7", "", 10s, limit);
        REQUIRE(claimed);
        REQUIRE(claimed->token);
        auto committed =
            co_await app1->async_commit("thread-7", *claimed->token, "box-app1", 0, 60s, limit);
        REQUIRE(committed);
        REQUIRE(*committed);
        auto other = co_await app2->async_get("thread-7", limit);
        REQUIRE(other);
        CHECK_FALSE(other->has_value());
        auto own = co_await app2->async_claim("thread-7", "", 10s, limit);
        REQUIRE(own);
        CHECK(own->token);
        auto touched = co_await app2->async_touch("thread-7", "box-app1", 60s, false, limit);
        REQUIRE(touched);
        CHECK_FALSE(touched->has_value());
        auto still = co_await app1->async_get("thread-7", limit);
        REQUIRE(still);
        REQUIRE(still->has_value());
        CHECK((*still)->sandbox_id == "box-app1");
    }());
}

// --- the shared-session cases with worker processes, over Redis --------------------------------

namespace {

std::string worker_url(const redis_server& server) {
    return "unix://" + server.socket_path + "?prefix=mw:";
}

}  // namespace

TEST_CASE(
    "a Redis entry pointing at another session's sandbox is refused, and the session gets its "
    "own") {
    MOAT_REQUIRE_NAMESPACES();
    moat::test::local_fixture f;
    redis_server server;
    const auto store = worker_url(server);
    auto tenant_a = start_worker({store, "tenant-a", "acquire", "--label", "test=redis-poison"});
    const std::string a_id = field(read_line(tenant_a, "id="), "id");
    CHECK(finish(tenant_a) == 0);
    REQUIRE_FALSE(a_id.empty());
    // A poisoned (or stale) entry: tenant-b's key names tenant-a's sandbox.
    {
        asio::io_context io;
        redis_client raw(io.get_executor(), server.unix_config(), nullptr);
        run_async(io, [&]() -> asio::awaitable<void> {
            auto poison = cmd({"HSET", "mw:s:tenant-b", "s", a_id, "g", "0", "n", "0", "u", "0"});
            auto written = co_await raw.async_command(std::move(poison), moat::deadline::after(5s));
            REQUIRE(written);
            CHECK_FALSE(written->is_error());
        }());
    }
    auto tenant_b = start_worker({store, "tenant-b", "acquire", "--label", "test=redis-poison"});
    const auto line = read_line(tenant_b, "id=");
    CAPTURE(line);
    CHECK(finish(tenant_b) == 0);
    const std::string b_id = field(line, "id");
    REQUIRE_FALSE(b_id.empty());
    CHECK(b_id != a_id);
    CHECK(running_with(f, {{"test", "redis-poison"}}) == 2);
    for (const char* key : {"tenant-a", "tenant-b"}) {
        auto ender = start_worker({store, key, "end"});
        CHECK(read_line(ender, "ended") == "ended");
        CHECK(finish(ender) == 0);
    }
    CHECK(running_with(f, {{"test", "redis-poison"}}) == 0);
}

// --- the pool's wait list (http::connection_pool, which the Redis client uses) ---

namespace {

struct outcome_flag {
    bool* done;
    void operator()(std::exception_ptr, moat::result<moat::store::redis_reply>) const {
        *done = true;
    }
};

asio::awaitable<moat::result<moat::store::redis_reply>> run_command(
    std::shared_ptr<moat::store::redis_client> client, moat::store::redis_command command) {
    auto limit = moat::deadline::after(30s);
    co_return co_await client->async_command(std::move(command), limit);
}

}  // namespace

TEST_CASE(
    "a Redis waiter whose coroutine frame is destroyed leaves the wait list, and the next "
    "release wakes a live waiter") {
    moat::test::redis_server redis;
    asio::io_context io;
    auto config = redis.unix_config();
    config.max_connections = 1;
    config.command_timeout = 10s;
    auto client = std::make_shared<moat::store::redis_client>(io.get_executor(), config, nullptr);

    // The only connection is busy for about a second.
    bool busy_done = false;
    asio::co_spawn(io, run_command(client, {"BLPOP", "moat-pool-test-nothing", "1"}),
                   outcome_flag{&busy_done});
    io.run_for(200ms);
    REQUIRE_FALSE(busy_done);

    // A waiter on its own io_context: destroying that context destroys the waiter's frame while
    // it is in the wait list.
    {
        asio::io_context other;
        bool abandoned_done = false;
        asio::co_spawn(other, run_command(client, {"PING"}), outcome_flag{&abandoned_done});
        other.run_for(200ms);
        REQUIRE_FALSE(abandoned_done);
    }

    // A live waiter, then the busy command ends: its release must wake the live one (the
    // destroyed waiter is no longer listed, and nothing touches its freed timer).
    bool waiter_done = false;
    std::optional<moat::result<moat::store::redis_reply>> waited;
    struct keep {
        std::optional<moat::result<moat::store::redis_reply>>* into;
        bool* done;
        void operator()(std::exception_ptr e, moat::result<moat::store::redis_reply> r) const {
            if (!e) into->emplace(std::move(r));
            *done = true;
        }
    };
    asio::co_spawn(io, run_command(client, {"PING"}), keep{&waited, &waiter_done});
    const auto limit = moat::deadline::after(20s);
    while ((!busy_done || !waiter_done) && !limit.has_expired()) io.run_one_for(100ms);
    CHECK(busy_done);
    REQUIRE(waiter_done);
    REQUIRE(waited);
    REQUIRE_MESSAGE(*waited, waited->error().to_string());
    CHECK((*waited)->text == "PONG");
    CHECK(client->connections_opened() == 1);
}
