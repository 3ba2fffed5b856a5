#include "support/dns_servers.hpp"

#include "support/redis_server.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <thread>

namespace moat::test {
namespace {

using namespace std::chrono_literals;

sockaddr_in loopback(std::uint16_t port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    return address;
}

// The question's name of a DNS query ("a.hang.test"), or "" if it is not one.
std::string question_name(const unsigned char* data, std::size_t size) {
    std::string name;
    std::size_t at = 12;  // past the header
    while (at < size && data[at] != 0) {
        const std::size_t length = data[at];
        if (length > 63 || at + 1 + length > size) return {};
        if (!name.empty()) name += '.';
        for (std::size_t i = 0; i < length; ++i) {
            name += static_cast<char>(std::tolower(data[at + 1 + i]));
        }
        at += 1 + length;
    }
    return name;
}

// Whether a DNS server answers on 127.0.0.1:`port` (any reply, within 200 ms).
bool answers(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    timeval timeout{0, 200 * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    // id 0x4d54, recursion desired, one question: "ready.check" A IN.
    const std::array<unsigned char, 29> query{0x4d, 0x54, 0x01, 0x00, 0,   1,   0,   0,   0, 0,
                                              0,    0,    5,    'r',  'e', 'a', 'd', 'y', 5, 'c',
                                              'h',  'e',  'c',  'k',  0,   0,   1,   0,   1};
    const auto address = loopback(port);
    bool ok = false;
    if (::sendto(fd, query.data(), query.size(), 0, reinterpret_cast<const sockaddr*>(&address),
                 sizeof address) == static_cast<ssize_t>(query.size())) {
        std::array<unsigned char, 512> reply{};
        ok = ::recv(fd, reply.data(), reply.size(), 0) >= 12 && reply[0] == 0x4d;
    }
    ::close(fd);
    return ok;
}

}  // namespace

silent_dns_server::silent_dns_server() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    REQUIRE(fd_ >= 0);
    auto address = loopback(0);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port_ = ntohs(address.sin_port);
}

silent_dns_server::~silent_dns_server() {
    ::close(fd_);
}

const std::set<std::string>& silent_dns_server::names() {
    std::array<unsigned char, 1500> datagram{};
    while (true) {
        const auto n = ::recv(fd_, datagram.data(), datagram.size(), MSG_DONTWAIT);
        if (n < 0) break;
        auto name = question_name(datagram.data(), static_cast<std::size_t>(n));
        if (!name.empty()) names_.insert(std::move(name));
    }
    return names_;
}

dnsmasq_server::dnsmasq_server(std::vector<std::string> rules) {
    char pattern[] = "/tmp/moat-dnsmasq-XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    dir_ = pattern;
    // A port free a moment ago may be taken by the time dnsmasq binds it: try a few.
    bool started = false;
    for (int attempt = 0; attempt < 3 && !started; ++attempt) started = start(rules);
    REQUIRE_MESSAGE(started, "dnsmasq did not start: see " << dir_
                                                           << "/dnsmasq.log (is "
                                                              "dnsmasq-base installed? run "
                                                              "scripts/install-deps)");
}

dnsmasq_server::~dnsmasq_server() {
    stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
}

bool dnsmasq_server::start(const std::vector<std::string>& rules) {
    port_ = free_loopback_port();
    std::vector<std::string> args{"dnsmasq",
                                  "--no-daemon",
                                  "--conf-file=/dev/null",
                                  "--pid-file=",
                                  "--no-resolv",
                                  "--no-poll",
                                  "--no-hosts",
                                  "--cache-size=0",
                                  "--bind-interfaces",
                                  "--listen-address=127.0.0.1",
                                  "--port=" + std::to_string(port_)};
    // As root it would switch to the user nobody; staying root touches nothing more (no pid
    // file, no lease file, no configuration).
    if (::geteuid() == 0) args.emplace_back("--user=root");
    args.insert(args.end(), rules.begin(), rules.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = dir_ + "/dnsmasq.log";
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (out >= 0) {
            ::dup2(out, STDOUT_FILENO);
            ::dup2(out, STDERR_FILENO);
        }
        ::execv("/usr/sbin/dnsmasq", argv.data());
        ::execvp("dnsmasq", argv.data());
        ::_exit(127);
    }
    const auto limit = std::chrono::steady_clock::now() + 10s;
    while (!answers(port_)) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) != 0) {  // exited: the port was taken, or worse
            pid_ = -1;
            return false;
        }
        if (std::chrono::steady_clock::now() > limit) {
            stop();
            return false;
        }
        std::this_thread::sleep_for(20ms);
    }
    return true;
}

void dnsmasq_server::stop() {
    stop_server_process(pid_);
}

}  // namespace moat::test
