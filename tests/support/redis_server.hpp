// A redis-server of a test's own (Debian's, installed by scripts/install-deps): no persistence,
// a unix socket and a loopback port in a fresh temporary directory, stopped (SIGTERM, then
// SIGKILL) and removed when the object goes. start() and stop() restart it in place (same socket,
// same port), for the tests of what a store does while Redis is away.
#pragma once

#include <moat/redis_session_store.hpp>

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace moat::test {

// A loopback TCP port that was free a moment ago (bound to port 0, read back, closed).
std::uint16_t free_loopback_port();

// Stops a server the test started: SIGTERM, then SIGKILL after 5 s; reaps it and sets `pid` to
// -1. Nothing when `pid` is not positive.
void stop_server_process(pid_t& pid);

class redis_server {
  public:
    // `extra`: more redis-server arguments (e.g. {"--requirepass", "..."}).
    explicit redis_server(std::vector<std::string> extra = {});
    ~redis_server();
    redis_server(const redis_server&) = delete;
    redis_server& operator=(const redis_server&) = delete;

    // Starts it and waits (at most 10 s) until it answers PING on its socket.
    void start();
    // SIGTERM, then SIGKILL after 5 s.
    void stop();

    redis_config unix_config() const;
    redis_config tcp_config() const;
    // unix://<socket>, for the CLI and worker processes.
    std::string unix_url() const { return "unix://" + socket_path; }

    std::string dir;
    std::string socket_path;
    std::uint16_t port = 0;

  private:
    std::vector<std::string> extra_;
    pid_t pid_ = -1;
};

}  // namespace moat::test
