// Raw loopback peers for tests that must misbehave as a client (stall, flood, never read), where
// moat's own HTTP client would behave: blocking POSIX sockets, every wait bounded.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

namespace moat::test {

// A blocking TCP connection to 127.0.0.1:`port`, its receives bounded by `bound`, with a receive
// buffer of `receive_window` bytes when non-zero (a peer that writes fills it quickly). Fails the
// test if it cannot connect. The caller closes it.
int connect_loopback(unsigned short port, std::chrono::seconds bound = std::chrono::seconds(5),
                     int receive_window = 0);

// Opens `count` keep-alive connections to 127.0.0.1:`port` that each ask GET /health once and
// then sit idle, never authenticating (the red team's flood); a connection the server refuses is
// kept too. Returns their descriptors; the caller closes them.
std::vector<int> open_idle_health_clients(unsigned short port, int count);

// Raises this process's soft RLIMIT_NOFILE to at least `descriptors`, within its hard limit (a
// test that opens thousands of sockets).
void raise_open_files(std::size_t descriptors);

}  // namespace moat::test
