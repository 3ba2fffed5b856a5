#include "support/redis_server.hpp"

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

namespace moat::test {
namespace {

using namespace std::chrono_literals;

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

}  // namespace

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

void stop_server_process(pid_t& pid) {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    const auto limit = std::chrono::steady_clock::now() + 5s;
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > limit) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            break;
        }
        std::this_thread::sleep_for(10ms);
    }
    pid = -1;
}

redis_server::redis_server(std::vector<std::string> extra) : extra_(std::move(extra)) {
    char pattern[] = "/tmp/moat-redis-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    dir = pattern;
    socket_path = dir + "/redis.sock";
    port = free_loopback_port();
    start();
}

redis_server::~redis_server() {
    stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
}

void redis_server::start() {
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

void redis_server::stop() {
    stop_server_process(pid_);
}

redis_config redis_server::unix_config() const {
    redis_config config;
    config.kind = redis_config::transport::unix_socket;
    config.socket_path = socket_path;
    return config;
}

redis_config redis_server::tcp_config() const {
    redis_config config;
    config.host = "127.0.0.1";
    config.port = port;
    return config;
}

}  // namespace moat::test
