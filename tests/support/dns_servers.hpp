// DNS servers of a test's own, on loopback: a real dnsmasq (Debian's dnsmasq-base, installed by
// scripts/install-deps) answering from the rules the test gives it, and a silent server that
// takes queries and never answers (the name server of a domain whose DNS hangs).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <sys/types.h>

namespace moat::test {

// A UDP socket bound to 127.0.0.1 that is never answered from. names() reads what arrived.
class silent_dns_server {
  public:
    silent_dns_server();
    ~silent_dns_server();
    silent_dns_server(const silent_dns_server&) = delete;
    silent_dns_server& operator=(const silent_dns_server&) = delete;

    std::uint16_t port() const { return port_; }
    // Every distinct name asked so far (the queries queued on the socket are read now).
    const std::set<std::string>& names();

  private:
    int fd_ = -1;
    std::uint16_t port_ = 0;
    std::set<std::string> names_;
};

// dnsmasq on 127.0.0.1:<a free port>, in the foreground, reading no configuration, hosts file or
// resolv.conf of the host's and writing no pid file: it answers only from `rules` (e.g.
// "--address=/victim.test/127.0.0.1", "--address=/gone.test/" for NXDOMAIN,
// "--server=/hang.test/127.0.0.1#5300" to forward a domain). Started by the constructor (which
// waits, at most 10 s, until it answers), stopped (SIGTERM, then SIGKILL) by the destructor; it
// also dies with the test process.
class dnsmasq_server {
  public:
    explicit dnsmasq_server(std::vector<std::string> rules);
    ~dnsmasq_server();
    dnsmasq_server(const dnsmasq_server&) = delete;
    dnsmasq_server& operator=(const dnsmasq_server&) = delete;

    std::uint16_t port() const { return port_; }
    // "127.0.0.1:<port>", for resolver_options::servers.
    std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  private:
    bool start(const std::vector<std::string>& rules);
    void stop();

    std::string dir_;
    std::uint16_t port_ = 0;
    pid_t pid_ = -1;
};

}  // namespace moat::test
