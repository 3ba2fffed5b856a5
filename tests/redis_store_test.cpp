// The Redis session store against a real redis-server that each test starts (on a unix socket and
// a free loopback port, in a temporary directory) and stops: URL parsing, the RESP reader's caps,
// the client's I/O (pipelining, reconnect, timeouts, AUTH, TLS), and the store's contract.
#include <doctest/doctest.h>

#include <moat/log.hpp>
#include <moat/redis_session_store.hpp>

#include "http/tls.hpp"
#include "store/redis_client.hpp"
#include "store/redis_reply.hpp"
#include "support/async_test.hpp"

#include <asio/io_context.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using moat::redis_config;
using moat::store::redis_client;
using moat::store::redis_command;
using moat::store::redis_reply;
using moat::test::run_async;
using namespace std::chrono_literals;

namespace {

const std::string source_dir = MOAT_SOURCE_DIR;

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

std::uint16_t free_loopback_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    ::close(fd);
    return ntohs(address.sin_port);
}

// Sends PING over the unix socket with a blocking socket (the test thread, not an executor):
// whether the server is up.
bool answers_ping(const std::string& socket_path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    socket_path.copy(address.sun_path, sizeof address.sun_path - 1);
    timeval timeout{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    bool ok = false;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
        const std::string ping = "*1\r\n$4\r\nPING\r\n";
        char reply[64] = {};
        if (::write(fd, ping.data(), ping.size()) == static_cast<ssize_t>(ping.size())) {
            const auto n = ::read(fd, reply, sizeof reply - 1);
            // +PONG, or -NOAUTH when a password is required: either way it is serving.
            ok = n > 0 && (reply[0] == '+' || reply[0] == '-');
        }
    }
    ::close(fd);
    return ok;
}

// A redis-server of the test's own: no persistence, a unix socket and a loopback port in a
// temporary directory. Stopped (SIGTERM, then SIGKILL) and removed when the object goes.
class redis_server {
  public:
    explicit redis_server(std::vector<std::string> extra = {}) : extra_(std::move(extra)) {
        char pattern[] = "/tmp/moat-redis-XXXXXX";
        REQUIRE(::mkdtemp(pattern) != nullptr);
        dir = pattern;
        socket_path = dir + "/redis.sock";
        port = free_loopback_port();
        start();
    }
    ~redis_server() {
        stop();
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
    }
    redis_server(const redis_server&) = delete;
    redis_server& operator=(const redis_server&) = delete;

    void start() {
        REQUIRE(pid_ <= 0);
        std::vector<std::string> args{"redis-server",
                                      "--port",
                                      std::to_string(port),
                                      "--bind",
                                      "127.0.0.1",
                                      "--unixsocket",
                                      socket_path,
                                      "--unixsocketperm",
                                      "700",
                                      "--dir",
                                      dir,
                                      "--save",
                                      "",
                                      "--appendonly",
                                      "no",
                                      "--daemonize",
                                      "no",
                                      "--logfile",
                                      dir + "/redis.log"};
        args.insert(args.end(), extra_.begin(), extra_.end());
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        pid_ = ::fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            ::execvp("redis-server", argv.data());
            ::_exit(127);
        }
        const auto limit = std::chrono::steady_clock::now() + 10s;
        while (!answers_ping(socket_path)) {
            int status = 0;
            REQUIRE_MESSAGE(::waitpid(pid_, &status, WNOHANG) == 0,
                            "redis-server exited at start: see " << dir << "/redis.log");
            REQUIRE_MESSAGE(std::chrono::steady_clock::now() < limit,
                            "redis-server did not answer within 10 s");
            std::this_thread::sleep_for(20ms);
        }
    }

    void stop() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGTERM);
        const auto limit = std::chrono::steady_clock::now() + 5s;
        int status = 0;
        while (::waitpid(pid_, &status, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() > limit) {
                ::kill(pid_, SIGKILL);
                ::waitpid(pid_, &status, 0);
                break;
            }
            std::this_thread::sleep_for(10ms);
        }
        pid_ = -1;
    }

    redis_config unix_config() const {
        redis_config config;
        config.kind = redis_config::transport::unix_socket;
        config.socket_path = socket_path;
        return config;
    }
    redis_config tcp_config() const {
        redis_config config;
        config.host = "127.0.0.1";
        config.port = port;
        return config;
    }

    std::string dir;
    std::string socket_path;
    std::uint16_t port = 0;

  private:
    std::vector<std::string> extra_;
    pid_t pid_ = -1;
};

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
    "Redis stopped makes the client fail within its deadline, and it works again after a restart") {
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
