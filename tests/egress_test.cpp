// The egress proxy's host side (src/egress): the policy, address classification and request
// parsing as pure functions, then the proxy itself over real loopback sockets.
#include "egress/address_policy.hpp"
#include "egress/byte_meter.hpp"
#include "egress/egress_proxy.hpp"
#include "egress/name_resolver.hpp"
#include "egress/network_bounds.hpp"
#include "egress/network_policy.hpp"
#include "egress/proxy_request.hpp"

#include "support/async_test.hpp"
#include "support/dns_servers.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"

#include <moat/task_group.hpp>

#include <doctest/doctest.h>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

using namespace moat::egress;

namespace {

asio::ip::address addr(const char* text) {
    return asio::ip::make_address(text);
}

moat::result<network_policy> policy_of(network_mode mode, std::vector<std::string> hosts,
                                       std::vector<std::string> resolve = {},
                                       std::vector<std::string> ranges = {}) {
    network_request request;
    request.mode = mode;
    request.allow_hosts = std::move(hosts);
    request.resolve = std::move(resolve);
    request.allow_addresses = std::move(ranges);
    return make_network_policy(request);
}

std::string policy_error(network_mode mode, std::vector<std::string> hosts,
                         std::vector<std::string> resolve = {},
                         std::vector<std::string> ranges = {}) {
    auto policy = policy_of(mode, std::move(hosts), std::move(resolve), std::move(ranges));
    REQUIRE_FALSE(policy);
    CHECK(policy.error().code == moat::errc::invalid_argument);
    return policy.error().detail;
}

}  // namespace

TEST_CASE("host patterns match exact names and subdomains, on 80 and 443 unless a port is given") {
    auto policy =
        policy_of(network_mode::allow_list, {"pypi.org", "*.pythonhosted.org", "Mirror.Test:8080"});
    REQUIRE(policy);
    CHECK(policy->allows_host("pypi.org", 443));
    CHECK(policy->allows_host("pypi.org", 80));
    CHECK_FALSE(policy->allows_host("pypi.org", 8443));
    CHECK_FALSE(policy->allows_host("www.pypi.org", 443));
    CHECK(policy->allows_host("files.pythonhosted.org", 443));
    CHECK(policy->allows_host("a.b.pythonhosted.org", 443));
    CHECK_FALSE(policy->allows_host("pythonhosted.org", 443));
    CHECK_FALSE(policy->allows_host("evilpythonhosted.org", 443));
    CHECK(policy->allows_host("mirror.test", 8080));
    CHECK_FALSE(policy->allows_host("mirror.test", 80));
    CHECK_FALSE(policy->allows_host("example.com", 443));
    CHECK(policy->summary() == "pypi.org, *.pythonhosted.org, Mirror.Test:8080");
}

TEST_CASE("the modes none and all allow nothing and everything, and all takes no list") {
    auto none = policy_of(network_mode::none, {});
    REQUIRE(none);
    CHECK_FALSE(none->allows_host("pypi.org", 443));
    CHECK(none->summary() == "off");
    auto all = policy_of(network_mode::all, {});
    REQUIRE(all);
    CHECK(all->allows_host("anything.example", 8443));
    CHECK(policy_error(network_mode::all, {"pypi.org"}).find("network all") != std::string::npos);
    CHECK(policy_error(network_mode::none, {"pypi.org"}).find("network none") != std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {}).find("--allow-host") != std::string::npos);
}

TEST_CASE("a bad host pattern is invalid_argument naming the pattern and what is wrong") {
    CHECK(policy_error(network_mode::allow_list, {"pypi..org"}) ==
          "--allow-host pattern \"pypi..org\" has an empty label");
    CHECK(policy_error(network_mode::allow_list, {"py*pi.org"}) ==
          "--allow-host pattern \"py*pi.org\" has a bad character '*'");
    CHECK(policy_error(network_mode::allow_list, {"*.*.org"}).find("'*'") != std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"pypi.org:0"}).find("port") != std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"pypi.org:65536"}).find("port") !=
          std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"pypi.org:"}).find("port") != std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"-pypi.org"}).find("'-'") != std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {""}).find("is empty") != std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"*."}).find("is empty") != std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {std::string(64, 'a') + ".org"}).find("63") !=
          std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"pypi_org.test"}).find("'_'") !=
          std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"pypi.org", "bad name"}).find("\"bad name\"") !=
          std::string::npos);
}

TEST_CASE("an IP literal is not a host pattern: the address is named with --resolve") {
    for (const char* literal :
         {"10.0.0.1", "127.1", "0x7f.1", "2130706433", "[::1]", "[::1]:443", "10.0.0.1:8080"}) {
        CAPTURE(std::string(literal));
        CHECK(policy_error(network_mode::allow_list, {literal}).find("IP literal") !=
              std::string::npos);
    }
}

TEST_CASE("--resolve entries pin names to addresses and bad ones are refused") {
    auto policy = policy_of(network_mode::allow_list, {"pypi.test"},
                            {"pypi.test=127.0.0.1", "PyPI.test=::1", "other.test=10.1.2.3"});
    REQUIRE(policy);
    const auto* pinned = policy->pinned("pypi.test");
    REQUIRE(pinned != nullptr);
    REQUIRE(pinned->size() == 2);
    CHECK((*pinned)[0] == addr("127.0.0.1"));
    CHECK((*pinned)[1] == addr("::1"));
    CHECK(policy->pinned("nothere.test") == nullptr);
    CHECK(policy_error(network_mode::allow_list, {"a.test"}, {"a.test"}).find("NAME=ADDR") !=
          std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"a.test"}, {"a.test=0x7f.1"}).find("address") !=
          std::string::npos);
    CHECK(
        policy_error(network_mode::allow_list, {"a.test"}, {"a.test=localhost"}).find("address") !=
        std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"a.test"}, {"=127.0.0.1"}).find("name") !=
          std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"a.test"}, {"10.0.0.1=127.0.0.1"})
              .find("IP literal") != std::string::npos);
}

TEST_CASE(
    "--allow-address ranges parse, and host bits, bad prefixes and bad addresses are refused") {
    auto policy = policy_of(network_mode::allow_list, {"a.test"}, {},
                            {"127.0.0.0/8", "10.1.0.0/16", "fd12::/16", "192.168.1.7"});
    REQUIRE(policy);
    REQUIRE(policy->allowed_ranges().size() == 4);
    CHECK(policy->allowed_ranges()[0].contains(addr("127.200.0.1")));
    CHECK(policy->allowed_ranges()[0].contains(addr("::ffff:127.0.0.1")));
    CHECK_FALSE(policy->allowed_ranges()[1].contains(addr("10.2.0.1")));
    CHECK(policy->allowed_ranges()[2].contains(addr("fd12:3::1")));
    CHECK(policy->allowed_ranges()[3].contains(addr("192.168.1.7")));
    CHECK_FALSE(policy->allowed_ranges()[3].contains(addr("192.168.1.8")));
    CHECK(policy_error(network_mode::allow_list, {"a.test"}, {}, {"10.1.2.3/8"})
              .find("bits set beyond its /8") != std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"a.test"}, {}, {"10.0.0.0/33"}).find("past 32") !=
          std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"a.test"}, {}, {"10.0.0.0/"}).find("prefix") !=
          std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"a.test"}, {}, {"10.1/16"})
              .find("not an IP address") != std::string::npos);
    CHECK(policy_error(network_mode::allow_list, {"a.test"}, {}, {"fe80::1%eth0"})
              .find("not an IP address") != std::string::npos);
}

TEST_CASE("addresses outside public unicast are classified and refused") {
    const std::vector<address_range> none;
    struct expectation {
        const char* address;
        address_class expected;
    };
    const expectation cases[] = {
        {"93.184.216.34", address_class::public_unicast},
        {"2606:4700::1111", address_class::public_unicast},
        {"127.0.0.1", address_class::loopback},
        {"127.255.255.254", address_class::loopback},
        {"::1", address_class::loopback},
        {"10.0.0.1", address_class::private_use},
        {"172.16.0.1", address_class::private_use},
        {"172.31.255.255", address_class::private_use},
        {"192.168.0.1", address_class::private_use},
        {"fc00::1", address_class::private_use},
        {"fd12:3456::1", address_class::private_use},
        {"169.254.1.1", address_class::link_local},
        {"fe80::1", address_class::link_local},
        {"100.64.0.1", address_class::cgnat},
        {"100.127.255.255", address_class::cgnat},
        {"0.0.0.0", address_class::unspecified},
        {"0.1.2.3", address_class::unspecified},
        {"::", address_class::unspecified},
        {"224.0.0.1", address_class::multicast},
        {"ff02::1", address_class::multicast},
        {"255.255.255.255", address_class::broadcast},
        {"240.0.0.1", address_class::reserved},
        {"2001:db8::1", address_class::reserved},
        {"169.254.169.254", address_class::metadata},
        {"fd00:ec2::254", address_class::metadata},
        {"100.100.100.200", address_class::metadata},
        {"169.254.0.23", address_class::metadata},
        {"192.0.0.192", address_class::metadata},
        {"168.63.129.16", address_class::cloud_host},
        {"169.254.170.2", address_class::cloud_host},
        {"169.254.170.23", address_class::cloud_host},
        {"169.254.169.253", address_class::cloud_host},
        {"169.254.169.123", address_class::cloud_host},
        {"fd00:ec2::23", address_class::cloud_host},
        {"fd00:ec2::253", address_class::cloud_host},
        {"fd00:ec2::123", address_class::cloud_host},
        {"fd00:ec2::1", address_class::private_use},
        {"168.63.129.17", address_class::public_unicast},
        // IPv6 forms that carry an IPv4 address are judged by it.
        {"::ffff:127.0.0.1", address_class::loopback},
        {"::ffff:10.0.0.1", address_class::private_use},
        {"::ffff:169.254.169.254", address_class::metadata},
        {"::127.0.0.1", address_class::loopback},
        {"64:ff9b::7f00:1", address_class::loopback},
        {"64:ff9b::a9fe:a9fe", address_class::metadata},
        {"2002:7f00:1::", address_class::loopback},
        {"::ffff:93.184.216.34", address_class::public_unicast},
        {"::ffff:168.63.129.16", address_class::cloud_host},
    };
    for (const auto& c : cases) {
        CAPTURE(std::string(c.address));
        CHECK(classify_address(addr(c.address)) == c.expected);
        const bool should_refuse = c.expected != address_class::public_unicast;
        CHECK(refusal_for(addr(c.address), none).has_value() == should_refuse);
    }
    CHECK(std::string(describe(address_class::loopback)) == "a loopback address");
}

TEST_CASE("--allow-address unlocks a refused range but never the metadata addresses") {
    std::string why;
    const std::vector<address_range> ranges = {
        *parse_address_range("127.0.0.0/8", why), *parse_address_range("169.254.0.0/16", why),
        *parse_address_range("fd00::/8", why), *parse_address_range("0.0.0.0/0", why)};
    CHECK_FALSE(refusal_for(addr("127.0.0.1"), ranges));
    CHECK_FALSE(refusal_for(addr("::ffff:127.0.0.1"), ranges));
    CHECK_FALSE(refusal_for(addr("169.254.1.1"), ranges));
    CHECK_FALSE(refusal_for(addr("fd00:1::1"), ranges));
    CHECK(refusal_for(addr("169.254.169.254"), ranges) == address_class::metadata);
    CHECK(refusal_for(addr("::ffff:169.254.169.254"), ranges) == address_class::metadata);
    CHECK(refusal_for(addr("fd00:ec2::254"), ranges) == address_class::metadata);
    CHECK(refusal_for(addr("::1"), ranges) == address_class::loopback);
}

TEST_CASE(
    "a cloud host endpoint is refused under a wider --allow-address and allowed only when "
    "named exactly") {
    std::string why;
    const std::vector<address_range> wide = {*parse_address_range("169.254.0.0/16", why),
                                             *parse_address_range("168.63.0.0/16", why),
                                             *parse_address_range("fd00::/8", why)};
    // Under `network all` (no range) Azure's WireServer, a public address, is refused.
    CHECK(refusal_for(addr("168.63.129.16"), {}) == address_class::cloud_host);
    CHECK(refusal_for(addr("168.63.129.16"), wide) == address_class::cloud_host);
    CHECK(refusal_for(addr("169.254.170.2"), wide) == address_class::cloud_host);
    CHECK(refusal_for(addr("::ffff:169.254.170.2"), wide) == address_class::cloud_host);
    CHECK(refusal_for(addr("fd00:ec2::23"), wide) == address_class::cloud_host);
    CHECK_FALSE(refusal_for(addr("169.254.170.3"), wide));  // the range still unlocks its others
    const std::vector<address_range> exact = {*parse_address_range("169.254.170.2", why),
                                              *parse_address_range("168.63.129.16/32", why),
                                              *parse_address_range("fd00:ec2::23/128", why)};
    CHECK_FALSE(refusal_for(addr("169.254.170.2"), exact));
    CHECK_FALSE(refusal_for(addr("::ffff:169.254.170.2"), exact));
    CHECK_FALSE(refusal_for(addr("168.63.129.16"), exact));
    CHECK_FALSE(refusal_for(addr("fd00:ec2::23"), exact));
    CHECK(refusal_for(addr("169.254.170.23"), exact) == address_class::cloud_host);
    // Naming the metadata address exactly still does not unlock it.
    const std::vector<address_range> metadata = {*parse_address_range("169.254.169.254", why)};
    CHECK(refusal_for(addr("169.254.169.254"), metadata) == address_class::metadata);
    CHECK(std::string(describe(address_class::cloud_host)) == "a cloud host endpoint");
}

TEST_CASE(
    "numeric hosts are read the way inet_aton reads them, so they are checked, not resolved") {
    struct expectation {
        const char* host;
        const char* address;
    };
    const expectation cases[] = {
        {"127.0.0.1", "127.0.0.1"},
        {"127.1", "127.0.0.1"},
        {"0x7f.1", "127.0.0.1"},
        {"2130706433", "127.0.0.1"},
        {"017700000001", "127.0.0.1"},
        {"0x7f000001", "127.0.0.1"},
        {"0177.0.0.01", "127.0.0.1"},
        {"127.0.1", "127.0.0.1"},
        {"0XA9.0xFE.43518", "169.254.169.254"},
        {"0", "0.0.0.0"},
        {"10.0.0.1.", "10.0.0.1"},
        {"4294967295", "255.255.255.255"},
        {"0x", "0.0.0.0"},
    };
    for (const auto& c : cases) {
        CAPTURE(std::string(c.host));
        CHECK(looks_numeric(c.host));
        auto parsed = parse_numeric_ipv4(c.host);
        REQUIRE(parsed);
        CHECK(parsed->to_string() == c.address);
    }
    for (const char* bad : {"4294967296", "1.2.3.4.5", "256.1.1.1", "1.2.3.256", "1.2.65536",
                            "08.1.1.1", "0x1g.1", "1..1", ".1"}) {
        CAPTURE(std::string(bad));
        CHECK_FALSE(parse_numeric_ipv4(bad));
    }
    // A name whose last label is not a number is a name (resolved, and checked after).
    for (const char* name : {"pypi.org", "1.2.3.example", "0x7f.example", "example.0xg"}) {
        CAPTURE(std::string(name));
        CHECK_FALSE(looks_numeric(name));
    }
    // A name ending in a number is an address attempt (and fails as one), as in the URL standard.
    CHECK(looks_numeric("example.123"));
    CHECK(looks_numeric("example.0x"));
    CHECK_FALSE(parse_numeric_ipv4("example.123"));
    // One trailing dot is a fully qualified name's: 1.2.3. is 1.2.0.3, never a name to resolve.
    CHECK(parse_numeric_ipv4("1.2.3.")->to_string() == "1.2.0.3");
}

namespace {

parse_outcome parse(std::string_view text, const request_caps& caps = {}) {
    return parse_proxy_request(text, caps);
}

void check_refused(std::string_view text, int status, std::string_view reason_part,
                   const request_caps& caps = {}) {
    auto out = parse(text, caps);
    CAPTURE(std::string(text.substr(0, 80)));
    REQUIRE(out.state == parse_outcome::state::refused);
    CHECK(out.status == status);
    CHECK(out.reason.find(reason_part) != std::string::npos);
    CHECK(out.reason.find('\n') == std::string::npos);
}

}  // namespace

TEST_CASE("the request parser reads CONNECT host:port and says where the tunnel's bytes start") {
    const std::string text = "CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\nTLS...";
    auto out = parse(text);
    REQUIRE(out.state == parse_outcome::state::complete);
    CHECK(out.request.is_connect);
    CHECK(out.request.host == "pypi.org");
    CHECK(out.request.port == 443);
    CHECK(out.request.upstream_head.empty());
    CHECK(text.substr(out.request.head_bytes) == "TLS...");

    auto v6 = parse("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n");
    REQUIRE(v6.state == parse_outcome::state::complete);
    CHECK(v6.request.host_is_ipv6_literal);
    CHECK(v6.request.host == "2001:db8::1");
    CHECK(v6.request.port == 8443);
}

TEST_CASE("the request parser rewrites an absolute-form request to origin form for the upstream") {
    auto out = parse(
        "GET http://PyPI.test/simple/pkg/?q=1#frag HTTP/1.1\r\nHost: wrong.example\r\n"
        "User-Agent: pip\r\nProxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive\r\n"
        "Proxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n");
    REQUIRE(out.state == parse_outcome::state::complete);
    CHECK_FALSE(out.request.is_connect);
    CHECK(out.request.host == "PyPI.test");
    CHECK(out.request.port == 80);
    CHECK(out.request.upstream_head ==
          "GET /simple/pkg/?q=1 HTTP/1.1\r\nHost: PyPI.test\r\nUser-Agent: pip\r\n"
          "Accept: */*\r\nConnection: close\r\n\r\n");

    auto with_port =
        parse("POST http://mirror.test:8080?x HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi");
    REQUIRE(with_port.state == parse_outcome::state::complete);
    CHECK(with_port.request.port == 8080);
    CHECK(with_port.request.upstream_head ==
          "POST /?x HTTP/1.0\r\nHost: mirror.test:8080\r\nContent-Length: 2\r\n"
          "Connection: close\r\n\r\n");
}

TEST_CASE("the request parser waits for more bytes until the head is complete") {
    CHECK(parse("").state == parse_outcome::state::incomplete);
    CHECK(parse("CONNECT pypi.org:443 HTTP/1.1").state == parse_outcome::state::incomplete);
    CHECK(parse("CONNECT pypi.org:443 HTTP/1.1\r\nHost: x\r\n").state ==
          parse_outcome::state::incomplete);
}

TEST_CASE("malformed proxy requests are refused with a 400 and a one-line reason") {
    check_refused("GET /simple/ HTTP/1.1\r\n\r\n", 400, "absolute URL");
    check_refused("GET https://pypi.org/ HTTP/1.1\r\n\r\n", 400, "CONNECT");
    check_refused("GET ftp://pypi.org/ HTTP/1.1\r\n\r\n", 400, "not http://");
    check_refused("GET http://user:pw@pypi.org/ HTTP/1.1\r\n\r\n", 400, "credentials");
    check_refused("CONNECT pypi.org HTTP/1.1\r\n\r\n", 400, "host:port");
    check_refused("CONNECT pypi.org:0 HTTP/1.1\r\n\r\n", 400, "port");
    check_refused("CONNECT pypi.org:99999 HTTP/1.1\r\n\r\n", 400, "port");
    check_refused("CONNECT :443 HTTP/1.1\r\n\r\n", 400, "no host");
    check_refused("CONNECT [::1:443 HTTP/1.1\r\n\r\n", 400, "']'");
    check_refused("CONNECT pypi.org:443 HTTP/2\r\n\r\n", 400, "HTTP/1.0 or HTTP/1.1");
    check_refused("CONNECT  pypi.org:443 HTTP/1.1\r\n\r\n", 400, "METHOD TARGET");
    check_refused("CONNECT pypi.org:443\r\n\r\n", 400, "METHOD TARGET");
    check_refused("GE(T http://a.test/ HTTP/1.1\r\n\r\n", 400, "method");
    check_refused("CONNECT pypi.org:443 HTTP/1.1\nHost: x\n\n", 400, "CRLF");
    check_refused("CONNECT pypi.org:443 HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400, "folded");
    check_refused("CONNECT pypi.org:443 HTTP/1.1\r\nNo colon\r\n\r\n", 400, "without a name");
    check_refused("CONNECT pypi.org:443 HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, "name");
    check_refused("CONNECT pypi.org:443 HTTP/1.1\r\nX: a\rb\r\n\r\n", 400, "control byte");
    check_refused("GET http://a.test/\x01 HTTP/1.1\r\n\r\n", 400, "bad character");
    check_refused("CONNECT " + std::string(300, 'a') + ":443 HTTP/1.1\r\n\r\n", 400,
                  "CONNECT target");
}

TEST_CASE("oversized request lines and heads are refused as soon as they pass a cap") {
    request_caps caps;
    caps.max_request_line_bytes = 64;
    caps.max_head_bytes = 256;
    caps.max_headers = 4;
    // Without the end of the line yet: refused, not waited for.
    check_refused("GET http://a.test/" + std::string(100, 'x'), 414, "request line", caps);
    check_refused("GET http://a.test/" + std::string(100, 'x') + " HTTP/1.1\r\n\r\n", 414,
                  "request line", caps);
    std::string many = "CONNECT a.test:443 HTTP/1.1\r\n";
    for (int i = 0; i < 5; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
    check_refused(many, 431, "more than 4 headers", caps);  // before the blank line
    check_refused(many + "\r\n", 431, "more than 4 headers", caps);
    check_refused("CONNECT a.test:443 HTTP/1.1\r\nX: " + std::string(300, 'v'), 431, "head", caps);
    check_refused("CONNECT a.test:443 HTTP/1.1\r\nX: " + std::string(300, 'v') + "\r\n\r\n", 431,
                  "head", caps);
}

// ---- The proxy over real loopback sockets ------------------------------------------------------

namespace {

using asio::ip::tcp;
constexpr auto tuple = asio::experimental::as_tuple(asio::use_awaitable);

// Echoes every byte back until the peer stops sending.
asio::awaitable<void> echo_session(tcp::socket socket) {
    std::vector<char> buffer(64 * 1024);
    while (true) {
        auto read_buffer = asio::buffer(buffer);
        auto [ec, n] = co_await socket.async_read_some(read_buffer, tuple);
        if (n > 0) {
            auto write_buffer = asio::buffer(buffer.data(), n);
            auto [write_error, written] = co_await asio::async_write(socket, write_buffer, tuple);
            (void)written;
            if (write_error) co_return;
        }
        if (ec) break;
    }
    std::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_send, ignored);
}

// Writes `bytes` zero bytes, then closes: a download.
asio::awaitable<void> source_session(tcp::socket socket, std::size_t bytes) {
    std::vector<char> buffer(256 * 1024);
    while (bytes > 0) {
        const std::size_t n = std::min(bytes, buffer.size());
        auto write_buffer = asio::buffer(buffer.data(), n);
        auto [ec, written] = co_await asio::async_write(socket, write_buffer, tuple);
        if (ec) co_return;
        bytes -= written;
    }
    std::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_send, ignored);
}

// Reads a request head, records it, answers "hello" and closes.
asio::awaitable<void> http_session(tcp::socket socket, std::shared_ptr<std::string> seen) {
    std::string head;
    std::array<char, 4096> chunk{};
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 65536) {
        auto read_buffer = asio::buffer(chunk);
        auto [ec, n] = co_await socket.async_read_some(read_buffer, tuple);
        head.append(chunk.data(), n);
        if (ec) break;
    }
    *seen = head;
    const std::string reply =
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    auto write_buffer = asio::buffer(reply);
    auto [ec, n] = co_await asio::async_write(socket, write_buffer, tuple);
    (void)ec;
    (void)n;
    std::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_send, ignored);
}

enum class server_kind { echo, http, source };

struct upstream_server {
    tcp::acceptor acceptor;
    server_kind kind;
    std::shared_ptr<std::string> seen = std::make_shared<std::string>();
    std::size_t source_bytes = 0;
    std::uint16_t port() const { return acceptor.local_endpoint().port(); }
};

asio::awaitable<void> upstream_loop(upstream_server* server, moat::task_group* tasks) {
    while (true) {
        auto [ec, socket] = co_await server->acceptor.async_accept(tuple);
        if (ec) co_return;
        if (server->kind == server_kind::echo) {
            tasks->spawn(echo_session(std::move(socket)));
        } else if (server->kind == server_kind::http) {
            tasks->spawn(http_session(std::move(socket), server->seen));
        } else {
            tasks->spawn(source_session(std::move(socket), server->source_bytes));
        }
    }
}

struct front_door {
    tcp::acceptor acceptor;
    std::string sandbox_id;
    std::uint16_t port() const { return acceptor.local_endpoint().port(); }
};

// Hands every accepted connection to the proxy as a generic stream socket (as the bridge will).
asio::awaitable<void> front_loop(front_door* door, egress_proxy* proxy) {
    while (true) {
        auto [ec, socket] = co_await door->acceptor.async_accept(tuple);
        if (ec) co_return;
        asio::generic::stream_protocol::socket generic(std::move(socket));
        proxy->serve(door->sandbox_id, std::move(generic));
    }
}

struct proxy_fixture {
    proxy_fixture() = default;
    explicit proxy_fixture(resolver_options resolver)
        : proxy(
              io.get_executor(), [this](const egress_event& e) { events.push_back(e); },
              std::move(resolver)) {}

    asio::io_context io;
    std::vector<egress_event> events;
    egress_proxy proxy{io.get_executor(), [this](const egress_event& e) { events.push_back(e); }};
    moat::task_group tasks{io.get_executor(), "egress test"};
    std::list<upstream_server> upstreams;
    std::list<front_door> doors;

    upstream_server& start_upstream(server_kind kind, std::size_t source_bytes = 0) {
        tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
        auto& server = upstreams.emplace_back(upstream_server{std::move(acceptor), kind});
        server.source_bytes = source_bytes;
        tasks.spawn(upstream_loop(&server, &tasks));
        return server;
    }

    // Registers `id` with the proxy and returns the loopback port its connections arrive on.
    std::uint16_t add_sandbox(const std::string& id, network_request request,
                              egress_limits limits = {},
                              std::shared_ptr<byte_meter> meter = nullptr) {
        auto policy = make_network_policy(request);
        REQUIRE(policy);
        REQUIRE(proxy.add_sandbox(id, std::move(*policy), limits, std::move(meter)));
        tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
        auto& door = doors.emplace_back(front_door{std::move(acceptor), id});
        tasks.spawn(front_loop(&door, &proxy));
        return door.port();
    }

    asio::awaitable<void> async_stop() {
        for (auto& server : upstreams) server.acceptor.close();
        for (auto& door : doors) door.acceptor.close();
        co_await proxy.async_shutdown();
        tasks.cancel_all();
        co_await tasks.async_wait_all();
    }

    std::size_t count(egress_outcome outcome) const {
        std::size_t n = 0;
        for (const auto& e : events) n += e.outcome == outcome ? 1 : 0;
        return n;
    }
};

network_request allow(std::vector<std::string> hosts, std::vector<std::string> resolve = {},
                      std::vector<std::string> ranges = {}) {
    network_request request;
    request.mode = network_mode::allow_list;
    request.allow_hosts = std::move(hosts);
    request.resolve = std::move(resolve);
    request.allow_addresses = std::move(ranges);
    return request;
}

asio::awaitable<tcp::socket> connect_to(std::uint16_t port) {
    auto executor = co_await asio::this_coro::executor;
    tcp::socket socket(executor);
    const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), port);
    co_await socket.async_connect(endpoint, asio::use_awaitable);
    co_return socket;
}

// Reads until the end of an HTTP head (the reply to CONNECT) and returns it.
asio::awaitable<std::string> read_head(tcp::socket& socket) {
    std::string head;
    char byte = 0;
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 65536) {
        auto buffer = asio::buffer(&byte, 1);
        auto [ec, n] = co_await socket.async_read_some(buffer, tuple);
        if (ec) break;
        head.append(&byte, n);
    }
    co_return head;
}

// Reads until the peer closes (at most `cap` bytes).
asio::awaitable<std::string> read_all(tcp::socket& socket, std::size_t cap = 1 << 20) {
    std::string all;
    std::array<char, 4096> chunk{};
    while (all.size() < cap) {
        auto buffer = asio::buffer(chunk);
        auto [ec, n] = co_await socket.async_read_some(buffer, tuple);
        all.append(chunk.data(), n);
        if (ec) break;
    }
    co_return all;
}

// Sends one request and returns everything the proxy answered before closing.
asio::awaitable<std::string> exchange(std::uint16_t port, std::string request) {
    auto socket = co_await connect_to(port);
    auto buffer = asio::buffer(request);
    co_await asio::async_write(socket, buffer, asio::use_awaitable);
    co_return co_await read_all(socket);
}

// Opens a CONNECT tunnel and returns the socket after the proxy's 200.
asio::awaitable<tcp::socket> open_tunnel(std::uint16_t port, std::string target) {
    auto socket = co_await connect_to(port);
    const std::string request = "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n";
    auto buffer = asio::buffer(request);
    co_await asio::async_write(socket, buffer, asio::use_awaitable);
    const auto head = co_await read_head(socket);
    CHECK(head == "HTTP/1.1 200 Connection established\r\n\r\n");
    co_return socket;
}

// Writes `payload` through an echo tunnel and reads it back.
asio::awaitable<std::string> echo_through(tcp::socket& socket, std::string payload) {
    auto out = asio::buffer(payload);
    co_await asio::async_write(socket, out, asio::use_awaitable);
    std::string back(payload.size(), '\0');
    auto in = asio::buffer(back);
    co_await asio::async_read(socket, in, asio::use_awaitable);
    co_return back;
}

std::string body_of(const std::string& reply) {
    const auto end = reply.find("\r\n\r\n");
    return end == std::string::npos ? std::string{} : reply.substr(end + 4);
}

asio::awaitable<void> connect_tunnel_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "echo.test:" + std::to_string(echo.port());
    const auto port = f->add_sandbox("sb-1", allow({"ECHO.test:" + std::to_string(echo.port())},
                                                   {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}));
    auto tunnel = co_await open_tunnel(port, target);
    CHECK(co_await echo_through(tunnel, "ping") == "ping");
    std::string large(300 * 1024, 'x');
    for (std::size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>('a' + i % 26);
    CHECK(co_await echo_through(tunnel, large) == large);
    // Half close: the client stops sending, the echo server finishes, the tunnel ends.
    tunnel.shutdown(tcp::socket::shutdown_send);
    CHECK((co_await read_all(tunnel)).empty());
    co_await f->async_stop();
}

}  // namespace

namespace {

// A proxy of the test's own beside the fixture's, destroyed while its tunnel relays.
struct doomed_proxy {
    std::vector<egress_event> events;
    std::unique_ptr<egress_proxy> proxy;
    std::optional<front_door> door;
};

asio::awaitable<void> destroyed_mid_tunnel_case(proxy_fixture* f, doomed_proxy* d) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "echo.test:" + std::to_string(echo.port());
    auto policy = make_network_policy(allow({target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}));
    REQUIRE(policy);
    REQUIRE(d->proxy->add_sandbox("sb-9", std::move(*policy), {}));
    tcp::acceptor acceptor(f->io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    d->door.emplace(front_door{std::move(acceptor), "sb-9"});
    f->tasks.spawn(front_loop(&*d->door, d->proxy.get()));
    auto tunnel = co_await open_tunnel(d->door->port(), target);
    CHECK(co_await echo_through(tunnel, "ping") == "ping");
    d->door->acceptor.close();  // its loop ends without touching the proxy again
    d->proxy.reset();           // closes the tunnel; its task ends later, on the executor
    CHECK((co_await read_all(tunnel)).empty());
    asio::steady_timer settle(f->io, std::chrono::milliseconds(200));
    co_await settle.async_wait(asio::use_awaitable);  // the tunnel's task runs to its end
    co_await f->async_stop();
}

}  // namespace

TEST_CASE(
    "a proxy destroyed while a tunnel relays drops the tunnel's last event, and frees "
    "nothing its task still uses") {
    proxy_fixture f;
    doomed_proxy d;
    d.proxy = std::make_unique<egress_proxy>(
        f.io.get_executor(), [&d](const egress_event& e) { d.events.push_back(e); });
    moat::test::run_async(f.io, destroyed_mid_tunnel_case(&f, &d));
    // The allowed event came while the proxy lived; the closed one, after it was destroyed, is
    // dropped (it went through freed memory under ASan before).
    REQUIRE(d.events.size() == 1);
    CHECK(d.events[0].outcome == egress_outcome::allowed);
}

TEST_CASE("a CONNECT to an allowed name pinned by --resolve relays bytes both ways") {
    proxy_fixture f;
    moat::test::run_async(f.io, connect_tunnel_case(&f));
    REQUIRE(f.events.size() == 2);
    CHECK(f.events[0].outcome == egress_outcome::allowed);
    CHECK(f.events[0].sandbox_id == "sb-1");
    CHECK(f.events[0].host == "echo.test");
    CHECK(f.events[1].outcome == egress_outcome::closed);
    CHECK(f.events[1].reason == "done");
    CHECK(f.events[1].bytes_out == 4 + 300 * 1024);
    CHECK(f.events[1].bytes_in == 4 + 300 * 1024);
}

namespace {

asio::awaitable<void> plain_http_case(proxy_fixture* f) {
    auto& web = f->start_upstream(server_kind::http);
    const auto authority = "web.test:" + std::to_string(web.port());
    const auto port =
        f->add_sandbox("sb-1", allow({authority}, {"web.test=127.0.0.1"}, {"127.0.0.0/8"}));
    const auto reply = co_await exchange(
        port, "GET http://" + authority +
                  "/simple/pkg/ HTTP/1.1\r\nHost: web.test\r\nProxy-Connection: keep-alive\r\n"
                  "Accept: */*\r\n\r\n");
    CHECK(reply.starts_with("HTTP/1.1 200 OK\r\n"));
    CHECK(body_of(reply) == "hello");
    CHECK(*web.seen == "GET /simple/pkg/ HTTP/1.1\r\nHost: " + authority +
                           "\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("a plain-HTTP request to an allowed name is forwarded in origin form and answered") {
    proxy_fixture f;
    moat::test::run_async(f.io, plain_http_case(&f));
    CHECK(f.count(egress_outcome::allowed) == 1);
    CHECK(f.count(egress_outcome::closed) == 1);
}

namespace {

// The 403 line the proxy answers `request` with.
asio::awaitable<std::string> refusal_line(std::uint16_t port, std::string request) {
    const auto reply = co_await exchange(port, std::move(request));
    CHECK(reply.starts_with("HTTP/1.1 403 Forbidden\r\n"));
    auto body = body_of(reply);
    if (!body.empty() && body.back() == '\n') body.pop_back();
    co_return body;
}

asio::awaitable<void> refusals_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto p = std::to_string(echo.port());
    const auto plain = f->add_sandbox(
        "sb-plain",
        allow({"pypi.test:" + p, "loop.test:" + p, "private.test:" + p, "mixed.test:" + p},
              {"pypi.test=127.0.0.1", "loop.test=127.0.0.1", "private.test=10.0.0.1",
               "mixed.test=93.184.216.34", "mixed.test=127.0.0.1"}));
    const auto opened = f->add_sandbox(
        "sb-opened",
        allow({"echo.test:" + p, "meta.test:" + p, "meta6.test:" + p},
              {"echo.test=127.0.0.1", "meta.test=169.254.169.254", "meta6.test=fd00:ec2::254"},
              {"127.0.0.0/8", "169.254.0.0/16", "fd00::/8"}));

    CHECK(co_await refusal_line(plain, "CONNECT example.com:443 HTTP/1.1\r\n\r\n") ==
          "host example.com is not on this sandbox's allow-list");
    CHECK(co_await refusal_line(plain, "GET http://example.com/ HTTP/1.1\r\n\r\n") ==
          "host example.com is not on this sandbox's allow-list");
    CHECK(co_await refusal_line(plain, "CONNECT pypi.test:8443 HTTP/1.1\r\n\r\n") ==
          "host pypi.test:8443 is not on this sandbox's allow-list");
    // Allowed patterns whose names resolve to addresses refused by default.
    CHECK(co_await refusal_line(plain, "CONNECT loop.test:" + p + " HTTP/1.1\r\n\r\n") ==
          "loop.test resolves to 127.0.0.1, a loopback address");
    CHECK(co_await refusal_line(plain, "CONNECT private.test:" + p + " HTTP/1.1\r\n\r\n") ==
          "private.test resolves to 10.0.0.1, a private address");
    // Every address is checked, not just the first.
    CHECK(co_await refusal_line(plain, "CONNECT mixed.test:" + p + " HTTP/1.1\r\n\r\n") ==
          "mixed.test resolves to 127.0.0.1, a loopback address");
    // The metadata addresses even under a covering --allow-address.
    CHECK(co_await refusal_line(opened, "CONNECT meta.test:" + p + " HTTP/1.1\r\n\r\n") ==
          "meta.test resolves to 169.254.169.254, a cloud metadata address");
    CHECK(co_await refusal_line(opened, "GET http://meta6.test:" + p + "/ HTTP/1.1\r\n\r\n") ==
          "meta6.test resolves to fd00:ec2::254, a cloud metadata address");
    // Numeric hosts in odd notations are addresses: checked, never resolved, never names.
    for (const char* host : {"0x7f.1", "2130706433", "017700000001", "127.1", "0177.0.0.1"}) {
        CAPTURE(std::string(host));
        CHECK(co_await refusal_line(
                  plain, "CONNECT " + std::string(host) + ":" + p + " HTTP/1.1\r\n\r\n") ==
              "host " + std::string(host) + " is 127.0.0.1, a loopback address");
        // With 127.0.0.0/8 allowed, still no: the allow-list names hosts, not addresses.
        CHECK(co_await refusal_line(
                  opened, "CONNECT " + std::string(host) + ":" + p + " HTTP/1.1\r\n\r\n") ==
              "host 127.0.0.1 is an IP address; this sandbox's allow-list names hosts");
    }
    CHECK(co_await refusal_line(plain, "CONNECT [::ffff:127.0.0.1]:" + p + " HTTP/1.1\r\n\r\n") ==
          "host ::ffff:127.0.0.1 is a loopback address");
    CHECK(co_await refusal_line(plain, "GET http://0xA9.0xFE.43518/latest HTTP/1.1\r\n\r\n") ==
          "host 0xA9.0xFE.43518 is 169.254.169.254, a cloud metadata address");
    CHECK(co_await refusal_line(opened, "GET http://[fd00:ec2::254]/ HTTP/1.1\r\n\r\n") ==
          "host fd00:ec2::254 is a cloud metadata address");
    // And the allowed name on the same sandbox works.
    auto tunnel = co_await open_tunnel(opened, "echo.test:" + p);
    CHECK(co_await echo_through(tunnel, "still here") == "still here");
    tunnel.close();
    co_await f->async_stop();
}

}  // namespace

TEST_CASE(
    "names off the list, names resolving to refused addresses and numeric hosts get 403 and a "
    "reason") {
    proxy_fixture f;
    moat::test::run_async(f.io, refusals_case(&f));
    CHECK(f.count(egress_outcome::allowed) == 1);
    for (const auto& e : f.events) {
        if (e.outcome == egress_outcome::refused) CHECK(e.status == 403);
    }
}

namespace {

asio::awaitable<void> malformed_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto p = std::to_string(echo.port());
    egress_limits limits;
    limits.caps.max_request_line_bytes = 512;
    limits.caps.max_head_bytes = 1024;
    limits.caps.max_headers = 8;
    const auto port = f->add_sandbox(
        "sb-1", allow({"echo.test:" + p}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}), limits);
    const auto other =
        f->add_sandbox("sb-2", allow({"echo.test:" + p}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}));
    struct bad_request {
        std::string text;
        const char* status_line;
    };
    std::string many_headers = "CONNECT echo.test:" + p + " HTTP/1.1\r\n";
    for (int i = 0; i < 20; ++i) many_headers += "X-" + std::to_string(i) + ": v\r\n";
    const bad_request cases[] = {
        {"GET /simple/ HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request\r\n"},
        {"CONNECT echo.test HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request\r\n"},
        {std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 15),
         "HTTP/1.1 400 Bad Request\r\n"},
        {"GET http://echo.test/" + std::string(600, 'a') + " HTTP/1.1\r\n\r\n",
         "HTTP/1.1 414 URI Too Long\r\n"},
        {"GET http://echo.test/" + std::string(4000, 'a'), "HTTP/1.1 414 URI Too Long\r\n"},
        {many_headers, "HTTP/1.1 431 Request Header Fields Too Large\r\n"},
        {"CONNECT echo.test:" + p + " HTTP/1.1\r\nX: " + std::string(2000, 'v') + "\r\n\r\n",
         "HTTP/1.1 431 Request Header Fields Too Large\r\n"},
        {"CONNECT " + std::string(300, 'a') + ":443 HTTP/1.1\r\n\r\n",
         "HTTP/1.1 400 Bad Request\r\n"},
        {"CONNECT bad_host!.test:443 HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request\r\n"},
        {"CONNECT 1.2.3.4.5:443 HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request\r\n"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.text.substr(0, 60));
        const auto reply = co_await exchange(port, c.text);
        CHECK(reply.starts_with(c.status_line));
        const auto body = body_of(reply);
        CHECK(!body.empty());
        CHECK(body.find('\n') == body.size() - 1);  // one line
        // A second client of the same sandbox, and another sandbox, are still served.
        auto tunnel = co_await open_tunnel(port, "echo.test:" + p);
        CHECK(co_await echo_through(tunnel, "next") == "next");
        tunnel.close();
    }
    auto tunnel = co_await open_tunnel(other, "echo.test:" + p);
    CHECK(co_await echo_through(tunnel, "other sandbox") == "other sandbox");
    tunnel.close();
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("malformed and oversized requests get a 4xx and the proxy keeps serving other clients") {
    proxy_fixture f;
    moat::test::run_async(f.io, malformed_case(&f));
}

namespace {

// True once the peer has closed (reads until EOF or an error, discarding what arrives).
asio::awaitable<bool> closed_by_peer(tcp::socket& socket) {
    std::array<char, 4096> chunk{};
    while (true) {
        auto buffer = asio::buffer(chunk);
        auto [ec, n] = co_await socket.async_read_some(buffer, tuple);
        (void)n;
        if (ec) co_return true;
    }
}

asio::awaitable<void> connection_limit_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "echo.test:" + std::to_string(echo.port());
    egress_limits limits;
    limits.max_connections = 2;
    const auto port =
        f->add_sandbox("sb-1", allow({target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}), limits);
    auto first = co_await open_tunnel(port, target);
    auto second = co_await open_tunnel(port, target);
    CHECK(f->proxy.stats("sb-1")->active_connections == 2);
    const auto reply = co_await exchange(port, "CONNECT " + target + " HTTP/1.1\r\n\r\n");
    CHECK(reply.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
    CHECK(body_of(reply) == "this sandbox has 2 proxied connections open, its limit\n");
    // Both tunnels still work; once one ends, a new one is admitted.
    CHECK(co_await echo_through(first, "a") == "a");
    first.shutdown(tcp::socket::shutdown_send);
    CHECK(co_await closed_by_peer(first));
    auto third = co_await open_tunnel(port, target);
    CHECK(co_await echo_through(third, "c") == "c");
    CHECK(co_await echo_through(second, "b") == "b");
    co_await f->async_stop();
}

}  // namespace

TEST_CASE(
    "a sandbox past its concurrent connection limit gets 429 until one of its connections ends") {
    proxy_fixture f;
    moat::test::run_async(f.io, connection_limit_case(&f));
}

namespace {

using moat::test::open_descriptors;

asio::awaitable<void> refusal_flood_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "echo.test:" + std::to_string(echo.port());
    egress_limits limits;
    limits.max_connections = 2;
    limits.max_refusing = 4;
    const auto port =
        f->add_sandbox("sb-1", allow({target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}), limits);
    auto first = co_await open_tunnel(port, target);
    auto second = co_await open_tunnel(port, target);
    const std::size_t before = open_descriptors();
    // 200 more connections that never send a byte (a sandbox flooding its proxy).
    constexpr std::size_t flood = 200;
    std::vector<tcp::socket> clients;
    for (std::size_t i = 0; i < flood; ++i) clients.push_back(co_await connect_to(port));
    // Every one of them has reached the proxy once each has its refused event.
    const auto refused = [f] { return f->count(egress_outcome::refused); };
    for (int i = 0; i < 2000 && refused() < flood; ++i) {
        asio::steady_timer tick(f->io, std::chrono::milliseconds(5));
        co_await tick.async_wait(asio::use_awaitable);
    }
    REQUIRE(refused() == flood);
    // The test holds its 200 client sockets; the proxy holds at most max_refusing of theirs.
    const std::size_t held_by_proxy = open_descriptors() - before - flood;
    MESSAGE("descriptors the proxy holds for 200 refused connections: " << held_by_proxy);
    CHECK(held_by_proxy <= limits.max_refusing);
    CHECK(f->proxy.stats("sb-1")->refusing_connections <= limits.max_refusing);
    CHECK(f->proxy.stats("sb-1")->active_connections == 2);
    // The answered ones got their 429; the tunnels still relay.
    std::size_t answered = 0;
    for (const auto& e : f->events) answered += e.status == 429 ? 1 : 0;
    CHECK(answered >= 1);
    CHECK(answered <= flood);
    CHECK(co_await echo_through(first, "still here") == "still here");
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("connections past the limit hold at most max_refusing of the host's descriptors") {
    proxy_fixture f;
    moat::test::run_async(f.io, refusal_flood_case(&f));
}

namespace {

asio::awaitable<void> byte_budget_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "echo.test:" + std::to_string(echo.port());
    egress_limits limits;
    limits.max_bytes = 10000;
    const auto port =
        f->add_sandbox("sb-1", allow({target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}), limits);
    auto tunnel = co_await open_tunnel(port, target);
    CHECK(co_await echo_through(tunnel, std::string(4000, 'x')) == std::string(4000, 'x'));
    // 8000 bytes used (4000 each way); the next 4000 pass the budget and the tunnel is closed.
    const std::string more(4000, 'y');
    auto buffer = asio::buffer(more);
    co_await asio::async_write(tunnel, buffer, asio::use_awaitable);
    const auto rest = co_await read_all(tunnel);
    CHECK(rest.size() < more.size());
    CHECK(f->proxy.stats("sb-1")->bytes_used == 10000);
    const auto reply = co_await exchange(port, "CONNECT " + target + " HTTP/1.1\r\n\r\n");
    CHECK(reply.starts_with("HTTP/1.1 403 Forbidden\r\n"));
    CHECK(body_of(reply) == "this sandbox's egress byte budget (10000 bytes) is used up\n");
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("a sandbox past its byte budget has its tunnel closed and later requests refused") {
    proxy_fixture f;
    moat::test::run_async(f.io, byte_budget_case(&f));
    bool closed_for_budget = false;
    for (const auto& e : f.events) closed_for_budget |= e.reason == "byte budget";
    CHECK(closed_for_budget);
}

namespace {

asio::awaitable<void> idle_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "echo.test:" + std::to_string(echo.port());
    egress_limits limits;
    limits.idle_timeout = std::chrono::milliseconds(200);
    limits.head_timeout = std::chrono::milliseconds(200);
    const auto port =
        f->add_sandbox("sb-1", allow({target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}), limits);
    // An idle tunnel is closed by the proxy (the watchdog bounds the wait, nothing times it).
    auto tunnel = co_await open_tunnel(port, target);
    CHECK(co_await echo_through(tunnel, "once") == "once");
    CHECK(co_await closed_by_peer(tunnel));
    // So is a client that never finishes its request head.
    auto silent = co_await connect_to(port);
    const std::string partial = "CONNECT echo.test";
    auto buffer = asio::buffer(partial);
    co_await asio::async_write(silent, buffer, asio::use_awaitable);
    CHECK((co_await read_all(silent)).empty());
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("an idle tunnel and a client that never finishes its request are closed by the proxy") {
    proxy_fixture f;
    moat::test::run_async(f.io, idle_case(&f));
    bool closed_idle = false;
    for (const auto& e : f.events)
        closed_idle |= e.outcome == egress_outcome::closed && e.reason == "idle";
    CHECK(closed_idle);
}

namespace {

// Waits (bounded by the test's watchdog) until the proxy holds `n` connections of `id`.
asio::awaitable<void> until_active(proxy_fixture* f, std::string id, std::size_t n) {
    auto executor = co_await asio::this_coro::executor;
    asio::steady_timer timer(executor);
    while (f->proxy.stats(id)->active_connections != n) {
        timer.expires_after(std::chrono::milliseconds(1));
        co_await timer.async_wait(asio::use_awaitable);
    }
}

asio::awaitable<void> close_sandbox_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "echo.test:" + std::to_string(echo.port());
    const auto request = allow({target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"});
    const auto port_a = f->add_sandbox("sb-a", request);
    const auto port_b = f->add_sandbox("sb-b", request);
    auto a1 = co_await open_tunnel(port_a, target);
    auto a2 = co_await open_tunnel(port_a, target);
    auto pending = co_await connect_to(port_a);  // connected, request not sent yet
    auto b1 = co_await open_tunnel(port_b, target);
    CHECK(co_await echo_through(a1, "a1") == "a1");
    co_await until_active(f, "sb-a", 3);
    CHECK(f->proxy.close_sandbox("sb-a") == 3);
    CHECK(co_await closed_by_peer(a1));
    CHECK(co_await closed_by_peer(a2));
    CHECK(co_await closed_by_peer(pending));
    CHECK_FALSE(f->proxy.stats("sb-a"));
    CHECK(co_await echo_through(b1, "b1 lives") == "b1 lives");
    // A connection arriving for the closed sandbox is closed unanswered.
    auto late = co_await connect_to(port_a);
    CHECK((co_await read_all(late)).empty());
    co_await f->async_stop();
}

}  // namespace

TEST_CASE(
    "closing a sandbox closes all of its proxied connections at once and no other sandbox's") {
    proxy_fixture f;
    moat::test::run_async(f.io, close_sandbox_case(&f));
    std::size_t closed_with_sandbox = 0;
    for (const auto& e : f.events) {
        closed_with_sandbox += e.sandbox_id == "sb-a" && e.reason == "sandbox closed" ? 1 : 0;
    }
    CHECK(closed_with_sandbox == 2);  // the two tunnels; the pending one had no host yet
}

namespace {

asio::awaitable<double> download_seconds(tcp::socket& socket, std::size_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<char> buffer(256 * 1024);
    std::size_t total = 0;
    while (true) {
        auto read_buffer = asio::buffer(buffer);
        auto [ec, n] = co_await socket.async_read_some(read_buffer, tuple);
        total += n;
        if (ec) break;
    }
    CHECK(total == bytes);
    co_return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

asio::awaitable<void> throughput_case(proxy_fixture* f) {
    constexpr std::size_t bytes = 100u << 20;
    auto& source = f->start_upstream(server_kind::source, bytes);
    const auto target = "download.test:" + std::to_string(source.port());
    const auto port =
        f->add_sandbox("sb-1", allow({target}, {"download.test=127.0.0.1"}, {"127.0.0.0/8"}));
    auto direct = co_await connect_to(source.port());
    const double direct_s = co_await download_seconds(direct, bytes);
    auto tunnel = co_await open_tunnel(port, target);
    const double proxied_s = co_await download_seconds(tunnel, bytes);
    std::printf(
        "egress relay, 100 MB on loopback: direct %.0f MB/s, through the proxy %.0f MB/s, "
        "ratio %.2f\n",
        100 / direct_s, 100 / proxied_s, direct_s / proxied_s);

    // Connection setup: a direct connect plus a first echo round trip, against a CONNECT tunnel's
    // setup (connect, request, 200) plus the same round trip; p50 of 200 each.
    auto& echo = f->start_upstream(server_kind::echo);
    const auto echo_target = "echo.test:" + std::to_string(echo.port());
    const auto echo_door =
        f->add_sandbox("sb-2", allow({echo_target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}));
    std::vector<double> direct_us;
    std::vector<double> proxied_us;
    for (int i = 0; i < 200; ++i) {
        auto start = std::chrono::steady_clock::now();
        auto plain = co_await connect_to(echo.port());
        CHECK(co_await echo_through(plain, "x") == "x");
        direct_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count());
        start = std::chrono::steady_clock::now();
        auto small = co_await open_tunnel(echo_door, echo_target);
        CHECK(co_await echo_through(small, "x") == "x");
        proxied_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                .count());
    }
    std::sort(direct_us.begin(), direct_us.end());
    std::sort(proxied_us.begin(), proxied_us.end());
    std::printf(
        "egress connection setup + first round trip, p50 of 200: direct %.0f us, through "
        "the proxy %.0f us (overhead %.0f us)\n",
        direct_us[100], proxied_us[100], proxied_us[100] - direct_us[100]);
    co_await f->async_stop();
}

}  // namespace

TEST_CASE(
    "a 100 MB download and 200 connection setups through the proxy, against direct, are printed" *
    moat::test::shares_host) {
    proxy_fixture f;
    moat::test::run_async(f.io, throughput_case(&f));
}

namespace {

// A name that is not pinned goes through asio's resolver (localhost: /etc/hosts, no traffic
// leaves the machine), and every address it returns is checked.
asio::awaitable<void> resolver_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "localhost:" + std::to_string(echo.port());
    const auto closed = f->add_sandbox("sb-closed", allow({target}));
    const auto line = co_await refusal_line(closed, "CONNECT " + target + " HTTP/1.1\r\n\r\n");
    CHECK(line.starts_with("localhost resolves to "));
    CHECK(line.ends_with(", a loopback address"));
    // With loopback allowed, the proxy connects to one of the checked addresses (the echo server
    // listens on 127.0.0.1 only; an ::1 tried first is refused and the next address is used).
    const auto opened = f->add_sandbox("sb-opened", allow({target}, {}, {"127.0.0.0/8", "::1"}));
    auto tunnel = co_await open_tunnel(opened, target);
    CHECK(co_await echo_through(tunnel, "resolved") == "resolved");
    tunnel.close();
    co_await f->async_stop();
}

}  // namespace

TEST_CASE(
    "a name that is not pinned is resolved by the proxy and every address it returns is checked") {
    proxy_fixture f;
    moat::test::run_async(f.io, resolver_case(&f));
}

namespace {

// A listener whose accept queue is full drops new SYNs, so a connect to it neither succeeds nor
// fails: the proxy's connect deadline is what ends it.
asio::awaitable<void> connect_timeout_case(proxy_fixture* f) {
    auto executor = co_await asio::this_coro::executor;
    tcp::acceptor full(executor);
    full.open(tcp::v4());
    full.bind(tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    full.listen(0);  // room for one connection, never accepted
    const auto port = full.local_endpoint().port();
    auto filler = co_await connect_to(port);
    egress_limits limits;
    limits.connect_timeout = std::chrono::milliseconds(300);
    const auto target = "stuck.test:" + std::to_string(port);
    const auto door =
        f->add_sandbox("sb-1", allow({target}, {"stuck.test=127.0.0.1"}, {"127.0.0.0/8"}), limits);
    const auto reply = co_await exchange(door, "CONNECT " + target + " HTTP/1.1\r\n\r\n");
    CHECK(reply.starts_with("HTTP/1.1 504 Gateway Timeout\r\n"));
    CHECK(body_of(reply) == "connecting to " + target + " took longer than 300 ms\n");
    filler.close();
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("a connect that never completes ends at the connect deadline with a 504 and its reason") {
    proxy_fixture f;
    moat::test::run_async(f.io, connect_timeout_case(&f), std::chrono::seconds(30));
}

namespace {

// A client may send its first bytes (a TLS ClientHello, a request body) right behind the head,
// before the proxy has answered: they reach the upstream, after the rewritten head for HTTP.
asio::awaitable<void> pipelined_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "echo.test:" + std::to_string(echo.port());
    const auto port =
        f->add_sandbox("sb-1", allow({target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}));
    auto socket = co_await connect_to(port);
    const std::string request = "CONNECT " + target + " HTTP/1.1\r\n\r\nearly bytes";
    auto buffer = asio::buffer(request);
    co_await asio::async_write(socket, buffer, asio::use_awaitable);
    CHECK(co_await read_head(socket) == "HTTP/1.1 200 Connection established\r\n\r\n");
    std::string back(11, '\0');
    auto in = asio::buffer(back);
    co_await asio::async_read(socket, in, asio::use_awaitable);
    CHECK(back == "early bytes");
    socket.close();

    auto& web = f->start_upstream(server_kind::http);
    const auto authority = "web.test:" + std::to_string(web.port());
    const auto web_door =
        f->add_sandbox("sb-2", allow({authority}, {"web.test=127.0.0.1"}, {"127.0.0.0/8"}));
    const auto reply = co_await exchange(
        web_door, "POST http://" + authority + "/upload HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody");
    CHECK(body_of(reply) == "hello");
    CHECK(web.seen->starts_with("POST /upload HTTP/1.1\r\nHost: " + authority + "\r\n"));
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("bytes a client sends right behind its request head reach the upstream in order") {
    proxy_fixture f;
    moat::test::run_async(f.io, pipelined_case(&f));
}

// ---- Name resolution: c-ares against real DNS servers on loopback ------------------------------

namespace {

using namespace std::chrono_literals;
using moat::test::dnsmasq_server;
using moat::test::silent_dns_server;
using lookup_result = moat::result<std::vector<asio::ip::address>>;

std::int64_t ms_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 start)
        .count();
}

// Polls `condition` every 10 ms; false if it is still not true after `limit`.
asio::awaitable<bool> eventually(std::function<bool()> condition, std::chrono::milliseconds limit) {
    auto executor = co_await asio::this_coro::executor;
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!condition()) {
        if (std::chrono::steady_clock::now() > until) co_return false;
        asio::steady_timer pause(executor, 10ms);
        co_await pause.async_wait(asio::use_awaitable);
    }
    co_return true;
}

// A lookup started with co_spawn, cancellable through `cancel`; `outcome` once it completed.
struct lookup_probe {
    std::optional<lookup_result> outcome;
    asio::cancellation_signal cancel;
    std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
    std::int64_t took_ms = -1;
};

struct store_lookup {
    lookup_probe* probe;
    void operator()(std::exception_ptr failure, lookup_result answer) const {
        if (failure) std::rethrow_exception(failure);
        probe->took_ms = ms_since(probe->started);
        probe->outcome.emplace(std::move(answer));
    }
};

void start_lookup(asio::io_context& io, name_resolver& resolver, const std::string& key,
                  const std::string& host, moat::deadline limit, lookup_probe* probe) {
    auto lookup = resolver.async_resolve(key, host, limit);
    asio::co_spawn(io, std::move(lookup),
                   asio::bind_cancellation_slot(probe->cancel.slot(), store_lookup{probe}));
}

// Starts a lookup of `host` and waits until its query reached the silent server.
asio::awaitable<void> start_asked(asio::io_context* io, name_resolver* resolver, std::string key,
                                  std::string host, lookup_probe* probe,
                                  silent_dns_server* silent) {
    start_lookup(*io, *resolver, key, host, moat::deadline::after(std::chrono::seconds(30)), probe);
    std::function<bool()> asked = [silent, host] { return silent->names().contains(host); };
    REQUIRE(co_await eventually(asked, std::chrono::seconds(5)));
}

// A resolver asking only the silent server.
resolver_options asking(silent_dns_server& silent) {
    resolver_options options;
    options.servers = {"127.0.0.1:" + std::to_string(silent.port())};
    return options;
}

std::string detail_of(const lookup_probe& probe) {
    if (!probe.outcome || *probe.outcome) return "";
    return probe.outcome->error().detail;
}

asio::awaitable<void> resolver_answers_case(name_resolver* resolver, name_resolver* broken) {
    lookup_result found = co_await resolver->async_resolve(
        "sb-1", "victim.test", moat::deadline::after(std::chrono::seconds(5)));
    REQUIRE(found);
    CHECK(*found == std::vector<asio::ip::address>{addr("127.0.0.1")});
    lookup_result gone = co_await resolver->async_resolve(
        "sb-1", "www.gone.test", moat::deadline::after(std::chrono::seconds(5)));
    REQUIRE_FALSE(gone);
    CHECK(gone.error().code == moat::errc::backend_failure);
    CHECK(gone.error().detail == "could not resolve www.gone.test (name not found)");
    lookup_result too_long = co_await resolver->async_resolve(
        "sb-1", std::string(254, 'a'), moat::deadline::after(std::chrono::seconds(5)));
    REQUIRE_FALSE(too_long);
    CHECK(too_long.error().code == moat::errc::invalid_argument);
    CHECK(too_long.error().detail ==
          "could not resolve a host name of 254 bytes (a name has 1 to 253)");
    lookup_result not_started = co_await broken->async_resolve(
        "sb-1", "victim.test", moat::deadline::after(std::chrono::seconds(5)));
    REQUIRE_FALSE(not_started);
    CHECK(not_started.error().code == moat::errc::backend_failure);
    CHECK(not_started.error().detail.starts_with("could not resolve victim.test (the DNS servers"));
}

}  // namespace

TEST_CASE("the resolver answers from DNS and says in one line why a name does not resolve") {
    dnsmasq_server dns({"--address=/victim.test/127.0.0.1", "--address=/gone.test/"});
    asio::io_context io;
    resolver_options options;
    options.servers = {dns.address()};
    name_resolver resolver(io.get_executor(), options);
    CHECK(resolver.startup_error().empty());
    resolver_options bad;
    bad.servers = {"not an address"};
    name_resolver broken(io.get_executor(), bad);
    CHECK(broken.startup_error().find("not an address") != std::string::npos);
    moat::test::run_async(io, resolver_answers_case(&resolver, &broken), std::chrono::seconds(30));
}

namespace {

// One key: a lookup runs, one waits, the next is refused at once; another key is not held up; a
// deadline ends a wait, a cancellation ends a running lookup at once while its slot stays taken.
asio::awaitable<void> resolver_limits_case(asio::io_context* io, name_resolver* resolver,
                                           silent_dns_server* silent) {
    lookup_probe running;
    lookup_probe waiting;
    lookup_probe refused;
    lookup_probe other_key;
    co_await start_asked(io, resolver, "sb-a", "one.hang.test", &running, silent);
    start_lookup(*io, *resolver, "sb-a", "two.hang.test", moat::deadline::after(400ms), &waiting);
    start_lookup(*io, *resolver, "sb-a", "three.hang.test", moat::deadline::after(30s), &refused);
    start_lookup(*io, *resolver, "sb-b", "other.hang.test", moat::deadline::after(300ms),
                 &other_key);
    std::function<bool()> refused_now = [&refused] { return refused.outcome.has_value(); };
    REQUIRE(co_await eventually(refused_now, 2s));
    CHECK(refused.outcome->error().code == moat::errc::limit_exceeded);
    CHECK(detail_of(refused) ==
          "resolving three.hang.test: key sb-a has 1 lookups running and 1 waiting, its limit");
    CHECK(resolver->running("sb-a") == 1);
    CHECK(resolver->waiting("sb-a") == 1);
    CHECK(resolver->running("sb-b") == 1);  // its own slot, at once

    std::function<bool()> timed_out = [&] { return waiting.outcome && other_key.outcome; };
    REQUIRE(co_await eventually(timed_out, 5s));
    CHECK(waiting.outcome->error().code == moat::errc::deadline_exceeded);
    // The time the lookup was given, from its start to the deadline (the test's clock started
    // a moment earlier, so not exactly 400 ms).
    CHECK(detail_of(waiting).starts_with("resolving two.hang.test took longer than "));
    CHECK(other_key.outcome->error().code == moat::errc::deadline_exceeded);
    CHECK(detail_of(other_key).starts_with("resolving other.hang.test took longer than "));
    CHECK(silent->names() == std::set<std::string>{"one.hang.test", "other.hang.test"});
    CHECK(resolver->waiting("sb-a") == 0);

    const auto cancelled_at = std::chrono::steady_clock::now();
    running.cancel.emit(asio::cancellation_type::terminal);
    std::function<bool()> cancelled = [&running] { return running.outcome.has_value(); };
    REQUIRE(co_await eventually(cancelled, 2s));
    const auto cancel_took = ms_since(cancelled_at);
    CHECK(running.outcome->error().code == moat::errc::cancelled);
    CHECK(detail_of(running) == "resolving one.hang.test was cancelled");
    // c-ares still waits for that query (it cannot be stopped): the key's slot stays taken.
    CHECK(resolver->running("sb-a") == 1);
    MESSAGE("a waiting lookup ended at its 400 ms deadline after "
            << waiting.took_ms << " ms; a running one " << cancel_took << " ms after its cancel");
}

}  // namespace

TEST_CASE(
    "a key's lookups past its limits wait or fail at once, and a deadline or a cancellation ends "
    "a lookup whose DNS never answers") {
    silent_dns_server silent;
    asio::io_context io;
    auto options = asking(silent);
    options.attempt_timeout = std::chrono::seconds(10);
    options.max_in_flight_per_key = 1;
    options.max_waiting_per_key = 1;
    name_resolver resolver(io.get_executor(), options);
    moat::test::run_async(io, resolver_limits_case(&io, &resolver, &silent),
                          std::chrono::seconds(30));
}

namespace {

asio::awaitable<void> resolver_destroyed_case(asio::io_context* io,
                                              std::unique_ptr<name_resolver>* resolver,
                                              silent_dns_server* silent) {
    lookup_probe running;
    lookup_probe waiting;
    lookup_probe abandoned;
    co_await start_asked(io, resolver->get(), "sb-a", "one.hang.test", &running, silent);
    co_await start_asked(io, resolver->get(), "sb-b", "gone.hang.test", &abandoned, silent);
    start_lookup(*io, **resolver, "sb-a", "two.hang.test", moat::deadline::after(30s), &waiting);
    abandoned.cancel.emit(asio::cancellation_type::terminal);  // its query lives on in c-ares
    std::function<bool()> gave_up = [&abandoned] { return abandoned.outcome.has_value(); };
    REQUIRE(co_await eventually(gave_up, 2s));
    CHECK((*resolver)->waiting("sb-a") == 1);
    resolver->reset();  // c-ares ends every query now; the late answers land in shared state
    std::function<bool()> ended = [&] { return running.outcome && waiting.outcome; };
    REQUIRE(co_await eventually(ended, 2s));
    CHECK(running.outcome->error().code == moat::errc::backend_failure);
    CHECK(detail_of(running) == "could not resolve one.hang.test (the resolver was shut down)");
    CHECK(waiting.outcome->error().code == moat::errc::shutting_down);
    CHECK(detail_of(waiting) == "could not resolve two.hang.test (the resolver was shut down)");
    CHECK(abandoned.outcome->error().code == moat::errc::cancelled);
}

}  // namespace

TEST_CASE(
    "a resolver destroyed with lookups running, waiting and abandoned ends them all, and its late "
    "answers touch nothing freed") {
    silent_dns_server silent;
    asio::io_context io;
    auto options = asking(silent);
    options.max_in_flight_per_key = 1;
    auto resolver = std::make_unique<name_resolver>(io.get_executor(), options);
    moat::test::run_async(io, resolver_destroyed_case(&io, &resolver, &silent),
                          std::chrono::seconds(30));
}

namespace {

struct timed_reply {
    std::string host;
    std::string reply;
    std::int64_t took_ms = -1;
    bool is_done = false;
};

asio::awaitable<void> timed_exchange(std::uint16_t port, std::string request, timed_reply* out) {
    const auto started = std::chrono::steady_clock::now();
    out->reply = co_await exchange(port, std::move(request));
    out->took_ms = ms_since(started);
    out->is_done = true;
}

std::size_t done_count(const std::vector<timed_reply>& replies) {
    return static_cast<std::size_t>(
        std::count_if(replies.begin(), replies.end(), [](const auto& r) { return r.is_done; }));
}

// The red team's case: sandbox A opens 12 CONNECTs to names whose DNS never answers; sandbox B's
// request, made while A's lookups hang, goes through.
asio::awaitable<void> hung_lookups_case(proxy_fixture* f, silent_dns_server* silent) {
    auto& web = f->start_upstream(server_kind::http);
    const auto authority = "victim.test:" + std::to_string(web.port());
    egress_limits hung_limits;
    hung_limits.connect_timeout = 2000ms;
    const auto hung_door = f->add_sandbox("sb-a", allow({"*.hang.test"}), hung_limits);
    const auto victim_door = f->add_sandbox("sb-b", allow({authority}, {}, {"127.0.0.1/32"}));
    std::vector<timed_reply> hung(12);
    for (std::size_t i = 0; i < hung.size(); ++i) {
        hung[i].host = "name-" + std::to_string(i) + ".hang.test";
        std::string request = "CONNECT " + hung[i].host + ":443 HTTP/1.1\r\n\r\n";
        f->tasks.spawn(timed_exchange(hung_door, std::move(request), &hung[i]));
    }
    // Four lookups run (their names reach the silent server), four wait for a slot, and the
    // last four are refused at once.
    std::function<bool()> settled = [&] {
        return silent->names().size() == 4 && done_count(hung) == 4;
    };
    REQUIRE(co_await eventually(settled, 5s));

    const auto started = std::chrono::steady_clock::now();
    const auto reply = co_await exchange(
        victim_door, "GET http://" + authority + "/ HTTP/1.1\r\nHost: " + authority + "\r\n\r\n");
    const auto took = ms_since(started);
    CHECK(reply.starts_with("HTTP/1.1 200 OK\r\n"));
    CHECK(body_of(reply) == "hello");
    CHECK(done_count(hung) == 4);  // A's other eight lookups are still pending
    MESSAGE("sandbox B's request while sandbox A has 8 hung lookups: " << took << " ms");

    std::function<bool()> all_done = [&hung] { return done_count(hung) == hung.size(); };
    REQUIRE(co_await eventually(all_done, 10s));
    std::size_t limited = 0;
    std::size_t timed_out = 0;
    for (const auto& r : hung) {
        CAPTURE(r.host);
        CAPTURE(r.reply);
        if (r.reply.starts_with("HTTP/1.1 429 ")) {
            ++limited;
            CHECK(body_of(r.reply) == "resolving " + r.host +
                                          ": this sandbox has 4 lookups waiting for one of its 4 "
                                          "running ones, its limit\n");
            CHECK(r.took_ms < 1500);
        } else {
            ++timed_out;
            CHECK(r.reply.starts_with("HTTP/1.1 504 Gateway Timeout\r\n"));
            CHECK(body_of(r.reply) == "resolving " + r.host + " took longer than 2000 ms\n");
            CHECK(r.took_ms < 3500);  // the connection's deadline, not c-ares' 6 s
        }
    }
    CHECK(limited == 4);
    CHECK(timed_out == 8);
    CHECK(silent->names().size() == 4);  // the waiting ones never reached DNS
    co_await f->async_stop();
}

resolver_options via(const std::string& server) {
    resolver_options options;
    options.servers = {server};
    options.max_waiting_per_key = 4;
    return options;
}

}  // namespace

TEST_CASE("one sandbox's lookups that never answer do not hold up another sandbox's request") {
    silent_dns_server silent;
    dnsmasq_server dns({"--address=/victim.test/127.0.0.1",
                        "--server=/hang.test/127.0.0.1#" + std::to_string(silent.port())});
    proxy_fixture f(via(dns.address()));
    moat::test::run_async(f.io, hung_lookups_case(&f, &silent), std::chrono::seconds(60));
}

namespace {

asio::awaitable<void> lookup_refusals_case(proxy_fixture* f, silent_dns_server* silent) {
    const auto gone_door = f->add_sandbox("sb-gone", allow({"*.gone.test"}));
    const auto gone = co_await exchange(gone_door, "CONNECT www.gone.test:443 HTTP/1.1\r\n\r\n");
    CHECK(gone.starts_with("HTTP/1.1 502 Bad Gateway\r\n"));
    CHECK(body_of(gone) == "could not resolve www.gone.test (name not found)\n");

    // The connection's deadline ends a lookup c-ares is still waiting for.
    egress_limits quick;
    quick.connect_timeout = 300ms;
    const auto quick_door = f->add_sandbox("sb-quick", allow({"*.hang.test"}), quick);
    const auto started = std::chrono::steady_clock::now();
    const auto late = co_await exchange(quick_door, "CONNECT slow.hang.test:443 HTTP/1.1\r\n\r\n");
    const auto took = ms_since(started);
    CHECK(late.starts_with("HTTP/1.1 504 Gateway Timeout\r\n"));
    CHECK(body_of(late) == "resolving slow.hang.test took longer than 300 ms\n");
    CHECK(took < 1500);  // c-ares' first attempt alone lasts 2 s

    // Closing the sandbox ends its pending lookup's connection at once.
    const auto closing_door = f->add_sandbox("sb-closing", allow({"*.hang.test"}));
    auto socket = co_await connect_to(closing_door);
    const std::string request = "CONNECT stuck.hang.test:443 HTTP/1.1\r\n\r\n";
    auto buffer = asio::buffer(request);
    co_await asio::async_write(socket, buffer, asio::use_awaitable);
    std::function<bool()> asked = [silent] { return silent->names().contains("stuck.hang.test"); };
    REQUIRE(co_await eventually(asked, 5s));
    const auto closed_at = std::chrono::steady_clock::now();
    CHECK(f->proxy.close_sandbox("sb-closing") == 1);
    CHECK((co_await read_all(socket)).empty());
    CHECK(ms_since(closed_at) < 1000);
    co_await f->async_stop();
}

}  // namespace

TEST_CASE(
    "a name DNS does not know gets a 502, and a deadline or a closed sandbox ends a lookup that "
    "never answers") {
    silent_dns_server silent;
    dnsmasq_server dns({"--address=/gone.test/",
                        "--server=/hang.test/127.0.0.1#" + std::to_string(silent.port())});
    proxy_fixture f(via(dns.address()));
    moat::test::run_async(f.io, lookup_refusals_case(&f, &silent), std::chrono::seconds(60));
    for (const auto& e : f.events) {
        if (e.host == "slow.hang.test") CHECK(e.status == 504);
    }
}

namespace {

// All keys together run at most max_in_flight lookups: another key waits for a slot, and gets it
// when c-ares gives up on a query (here after one 300 ms attempt), not when its caller stopped
// waiting.
asio::awaitable<void> resolver_total_case(asio::io_context* io, name_resolver* resolver,
                                          silent_dns_server* silent) {
    lookup_probe first;
    lookup_probe second;
    co_await start_asked(io, resolver, "sb-a", "first.hang.test", &first, silent);
    start_lookup(*io, *resolver, "sb-b", "second.hang.test", moat::deadline::after(10s), &second);
    std::function<bool()> queued = [resolver] { return resolver->waiting("sb-b") == 1; };
    REQUIRE(co_await eventually(queued, 2s));
    std::function<bool()> first_done = [&first] { return first.outcome.has_value(); };
    REQUIRE(co_await eventually(first_done, 5s));
    CHECK(first.outcome->error().code == moat::errc::backend_failure);
    CHECK(detail_of(first) == "could not resolve first.hang.test (no DNS server answered)");
    std::function<bool()> second_done = [&second] { return second.outcome.has_value(); };
    REQUIRE(co_await eventually(second_done, 5s));
    CHECK(detail_of(second) == "could not resolve second.hang.test (no DNS server answered)");
    CHECK(silent->names().contains("second.hang.test"));
    CHECK(resolver->running("sb-a") == 0);
    CHECK(resolver->running("sb-b") == 0);
}

}  // namespace

TEST_CASE(
    "the resolver runs at most max_in_flight lookups over all keys, and c-ares' timeout frees a "
    "slot") {
    silent_dns_server silent;
    asio::io_context io;
    auto options = asking(silent);
    options.attempt_timeout = 300ms;
    options.tries = 1;
    options.max_in_flight = 1;
    name_resolver resolver(io.get_executor(), options);
    moat::test::run_async(io, resolver_total_case(&io, &resolver, &silent),
                          std::chrono::seconds(30));
}

// ---- Host memory, the byte budget across processes, the host's own addresses (issue 30) ------

namespace {

// Waits until the sandbox's buffered bytes stop growing (two equal readings 100 ms apart), and
// returns them. Bounded: at most 5 s.
asio::awaitable<std::uint64_t> settled_buffers(proxy_fixture* f, std::string id) {
    asio::steady_timer tick(f->io);
    std::uint64_t last = 0;
    for (int i = 0; i < 50; ++i) {
        tick.expires_after(std::chrono::milliseconds(100));
        co_await tick.async_wait(asio::use_awaitable);
        const std::uint64_t now = f->proxy.stats(id)->buffered_bytes;
        if (now == last && now > 0) break;
        last = now;
    }
    co_return f->proxy.stats(id)->buffered_bytes;
}

// Sends a CONNECT and returns the reply's head (and, for a refusal, its body after the head).
asio::awaitable<std::pair<std::string, tcp::socket>> try_tunnel(std::uint16_t port,
                                                                std::string target) {
    auto socket = co_await connect_to(port);
    const std::string connect = "CONNECT " + target + " HTTP/1.1\r\n\r\n";
    auto buffer = asio::buffer(connect);
    co_await asio::async_write(socket, buffer, asio::use_awaitable);
    auto head = co_await read_head(socket);
    if (!head.starts_with("HTTP/1.1 200")) head += co_await read_all(socket);
    co_return std::pair{std::move(head), std::move(socket)};
}

asio::awaitable<void> stalled_tunnels_case(proxy_fixture* f) {
    auto& source = f->start_upstream(server_kind::source, std::size_t{256} << 20);
    const auto target = "download.test:" + std::to_string(source.port());
    const auto request = allow({target}, {"download.test=127.0.0.1"}, {"127.0.0.0/8"});
    const egress_limits defaults;
    const auto port = f->add_sandbox("sb-1", request, defaults);
    // 32 downloads whose reader never reads, one after another (a sandbox that stalls its
    // tunnels): each takes its share of the cap, and once their queues hold it the next is refused.
    std::vector<tcp::socket> stalled;
    std::string refusal;
    std::size_t refused = 0;
    for (int i = 0; i < 32; ++i) {
        auto [head, socket] = co_await try_tunnel(port, target);
        if (head.starts_with("HTTP/1.1 429")) {
            ++refused;
            refusal = body_of(head);
            continue;
        }
        CHECK(head == "HTTP/1.1 200 Connection established\r\n\r\n");
        stalled.push_back(std::move(socket));
        (void)co_await settled_buffers(f, "sb-1");
    }
    const std::uint64_t held = co_await settled_buffers(f, "sb-1");
    MESSAGE("32 stalled downloads: " << stalled.size() << " admitted, " << refused
                                     << " refused; the proxy holds " << held / 1024
                                     << " KiB of host memory for them (cap "
                                     << defaults.max_buffered_bytes / 1024 << " KiB)");
    CHECK(held > 0);
    CHECK(held <= defaults.max_buffered_bytes);
    CHECK(refused > 0);
    CHECK(refusal.starts_with("this sandbox's "));
    CHECK(refusal.find(" proxied connections hold ") != std::string::npos);
    CHECK(
        refusal.ends_with(" bytes of host buffers its programs have not read; another would "
                          "pass its limit of 16777216\n"));

    // Connections whose reader keeps up are all admitted: 32 echo tunnels of another sandbox.
    auto& echo = f->start_upstream(server_kind::echo);
    const auto echo_target = "echo.test:" + std::to_string(echo.port());
    const auto echo_port =
        f->add_sandbox("sb-2", allow({echo_target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}));
    std::vector<tcp::socket> reading;
    for (int i = 0; i < 32; ++i) reading.push_back(co_await open_tunnel(echo_port, echo_target));
    for (auto& tunnel : reading)
        CHECK(co_await echo_through(tunnel, "still moving") == "still moving");
    co_await f->async_stop();
}

}  // namespace

TEST_CASE(
    "32 stalled downloads hold a bounded, counted amount of host memory, and past a sandbox's "
    "cap its next connection gets 429") {
    proxy_fixture f;
    moat::test::run_async(f.io, stalled_tunnels_case(&f));
}

namespace {

// A temporary directory for meter files, removed at the end.
struct meter_directory {
    std::filesystem::path path;
    meter_directory() {
        char pattern[] = "/tmp/moat-meter-XXXXXX";
        REQUIRE(::mkdtemp(pattern) != nullptr);
        path = pattern;
    }
    ~meter_directory() {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
    }
};

// Two proxies (as two processes attached to one sandbox would have) charging one meter file.
asio::awaitable<void> shared_budget_case(proxy_fixture* f, doomed_proxy* other,
                                         std::string meter_path) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto target = "echo.test:" + std::to_string(echo.port());
    const auto request = allow({target}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"});
    egress_limits limits;
    limits.max_bytes = 10000;
    auto first_meter = byte_meter::open_file(meter_path);
    REQUIRE(first_meter);
    const auto port = f->add_sandbox("sb-1", request, limits, *first_meter);
    auto tunnel = co_await open_tunnel(port, target);
    CHECK(co_await echo_through(tunnel, std::string(4000, 'x')) == std::string(4000, 'x'));
    tunnel.shutdown(tcp::socket::shutdown_send);
    CHECK(co_await closed_by_peer(tunnel));

    // The second process: its own proxy, the same sandbox, the same meter.
    auto second_meter = byte_meter::open_file(meter_path);
    REQUIRE(second_meter);
    CHECK((*second_meter)->used() == 8000);
    auto policy = make_network_policy(request);
    REQUIRE(policy);
    REQUIRE(other->proxy->add_sandbox("sb-1", std::move(*policy), limits, *second_meter));
    tcp::acceptor acceptor(f->io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    other->door.emplace(front_door{std::move(acceptor), "sb-1"});
    f->tasks.spawn(front_loop(&*other->door, other->proxy.get()));
    auto second = co_await open_tunnel(other->door->port(), target);
    const std::string more(4000, 'y');
    auto buffer = asio::buffer(more);
    co_await asio::async_write(second, buffer, asio::use_awaitable);
    const auto rest = co_await read_all(second);
    CHECK(rest.size() < more.size());  // closed at the sandbox's budget, not a fresh one
    CHECK(other->proxy->stats("sb-1")->bytes_used == 10000);
    CHECK(f->proxy.stats("sb-1")->bytes_used == 10000);
    const auto reading = read_meter_file(meter_path);
    REQUIRE(reading);
    CHECK(reading->bytes_used == 10000);
    const auto reply = co_await exchange(port, "CONNECT " + target + " HTTP/1.1\r\n\r\n");
    CHECK(body_of(reply) == "this sandbox's egress byte budget (10000 bytes) is used up\n");
    other->door->acceptor.close();
    co_await other->proxy->async_shutdown();
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("two proxies serving one sandbox charge one byte budget kept in its meter file") {
    meter_directory dir;
    proxy_fixture f;
    doomed_proxy other;
    other.proxy = std::make_unique<egress_proxy>(f.io.get_executor(), nullptr);
    moat::test::run_async(f.io,
                          shared_budget_case(&f, &other, (dir.path / "sb-1.egress").string()));
}

TEST_CASE("a byte meter file of another size is refused, and a missing one reads as absent") {
    meter_directory dir;
    const auto path = (dir.path / "bad.egress").string();
    CHECK_FALSE(read_meter_file(path));
    {
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        REQUIRE(fd >= 0);
        CHECK(::write(fd, "abc", 3) == 3);
        ::close(fd);
    }
    const auto opened = byte_meter::open_file(path);
    REQUIRE_FALSE(opened);
    CHECK(opened.error().detail == "egress byte meter " + path + " is 3 bytes, not 16");
    CHECK_FALSE(read_meter_file(path));
    // A fresh one starts at zero, charges up to its limit and no further.
    auto fresh = byte_meter::open_file((dir.path / "good.egress").string());
    REQUIRE(fresh);
    CHECK((*fresh)->try_charge(60, 100));
    CHECK_FALSE((*fresh)->try_charge(50, 100));
    CHECK((*fresh)->used() == 100);
    (*fresh)->add_buffered(700);
    (*fresh)->add_buffered(-1000);
    CHECK((*fresh)->buffered() == 0);
}

namespace {

// The test's own network namespace for this thread (network namespaces are per thread), left on
// destruction; nothing else of the host's network changes.
class own_network_namespace {
  public:
    own_network_namespace() {
        original_ = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
        REQUIRE(original_ >= 0);
        REQUIRE(::unshare(CLONE_NEWNET) == 0);
    }
    ~own_network_namespace() {
        CHECK(::setns(original_, CLONE_NEWNET) == 0);
        ::close(original_);
    }
    own_network_namespace(const own_network_namespace&) = delete;
    own_network_namespace& operator=(const own_network_namespace&) = delete;

    // Runs `ip ARGS` in this namespace (a child forked from this thread starts in it).
    static void ip(const std::string& args) {
        const std::string command = "ip " + args + " >/dev/null 2>&1";
        REQUIRE_MESSAGE(std::system(command.c_str()) == 0, command);
    }

  private:
    int original_ = -1;
};

asio::awaitable<std::string> refusal_body(std::uint16_t door, std::string target) {
    const auto reply = co_await exchange(door, "CONNECT " + target + " HTTP/1.1\r\n\r\n");
    co_return reply.starts_with("HTTP/1.1 200") ? std::string("(connected)") : body_of(reply);
}

asio::awaitable<void> host_address_case(proxy_fixture* f) {
    // What the host serves on every address: an echo server on [::] (IPv4 too).
    tcp::acceptor any(f->io, tcp::endpoint(asio::ip::address_v6::any(), 0));
    auto& server = f->upstreams.emplace_back(upstream_server{std::move(any), server_kind::echo});
    f->tasks.spawn(upstream_loop(&server, &f->tasks));
    const std::string port = std::to_string(server.port());
    network_request everything;
    everything.mode = network_mode::all;
    const auto door = f->add_sandbox("sb-all", everything);

    CHECK(co_await refusal_body(door, "203.0.114.1:" + port) ==
          "host 203.0.114.1 is an address of this host\n");
    CHECK(co_await refusal_body(door, "[2001:db9::1]:" + port) ==
          "host 2001:db9::1 is an address of this host\n");
    // Kept current: the address moves, and the verdicts move with it.
    own_network_namespace::ip("addr del 203.0.114.1/32 dev lo");
    own_network_namespace::ip("addr add 203.0.114.2/32 dev lo");
    CHECK(co_await refusal_body(door, "203.0.114.2:" + port) ==
          "host 203.0.114.2 is an address of this host\n");
    const auto gone = co_await refusal_body(door, "203.0.114.1:" + port);
    CHECK(gone.starts_with("could not connect to 203.0.114.1:" + port));  // no route: not ours

    // A name that resolves to one is refused as such; an operator's exact --allow-address opens it.
    network_request pinned = everything;
    pinned.resolve = {"mine.test=203.0.114.2"};
    const auto pinned_door = f->add_sandbox("sb-pinned", pinned);
    CHECK(co_await refusal_body(pinned_door, "mine.test:" + port) ==
          "mine.test resolves to 203.0.114.2, an address of this host\n");
    network_request opened = everything;
    opened.allow_addresses = {"203.0.114.2/32"};
    const auto opened_door = f->add_sandbox("sb-opened", opened);
    auto tunnel = co_await open_tunnel(opened_door, "203.0.114.2:" + port);
    CHECK(co_await echo_through(tunnel, "ours, by the operator's word") ==
          "ours, by the operator's word");
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("the host's own addresses are refused like loopback, as the kernel sees them now") {
    // Both addresses are public unicast to the policy: only the host check refuses them.
    CHECK(classify_address(asio::ip::make_address("203.0.114.1")) == address_class::public_unicast);
    CHECK(classify_address(asio::ip::make_address("2001:db9::1")) == address_class::public_unicast);
    own_network_namespace netns;
    own_network_namespace::ip("link set lo up");
    own_network_namespace::ip("addr add 203.0.114.1/32 dev lo");
    own_network_namespace::ip("addr add 2001:db9::1/128 dev lo nodad");
    proxy_fixture f;
    moat::test::run_async(f.io, host_address_case(&f));
}

// Live updates: the bound an update meets, and the proxy applying a new policy.
namespace {

moat::sandbox_network hosts_network(std::vector<std::string> hosts) {
    moat::sandbox_network n;
    n.mode = hosts.empty() ? network_mode::none : network_mode::allow_list;
    n.allow_hosts = std::move(hosts);
    return n;
}

}  // namespace

TEST_CASE("a network update may narrow, and widen only within the limit, naming what is past it") {
    const auto limit = hosts_network({"a.test", "*.example.org", "c.test:8080"});
    const auto now = hosts_network({"a.test"});
    CHECK(check_network_update(hosts_network({}), now, limit));
    CHECK(check_network_update(hosts_network({"x.example.org", "*.b.example.org"}), now, limit));
    CHECK(check_network_update(hosts_network({"a.test:443", "c.test:8080"}), now, limit));
    for (const auto& [host, named] :
         std::vector<std::pair<std::string, std::string>>{{"example.org", "\"example.org\""},
                                                          {"a.test:8080", "\"a.test:8080\""},
                                                          {"c.test", "\"c.test\""},
                                                          {"evil.test", "\"evil.test\""}}) {
        const auto refused = check_network_update(hosts_network({host}), now, limit);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == moat::errc::permission_denied);
        CHECK(refused.error().detail.find(named) != std::string::npos);
    }
    moat::sandbox_network all;
    all.mode = network_mode::all;
    CHECK_FALSE(check_network_update(all, now, limit));
    CHECK(check_network_update(hosts_network({"evil.test"}), now, all));
    // What is in force may stay, even past a narrower limit (narrowing always works).
    CHECK(check_network_update(hosts_network({"evil.test"}), hosts_network({"evil.test", "z"}),
                               limit));
    // Pins and ranges: only the limit's (or the network's in force).
    auto pinned = hosts_network({"a.test"});
    pinned.resolve = {"a.test=127.0.0.1"};
    pinned.allow_addresses = {"127.0.0.1/32"};
    auto wide_limit = limit;
    wide_limit.resolve = {"a.test=127.0.0.1"};
    wide_limit.allow_addresses = {"127.0.0.0/8"};
    CHECK(check_network_update(pinned, now, wide_limit));
    const auto unpinned = check_network_update(pinned, now, limit);
    REQUIRE_FALSE(unpinned);
    CHECK(unpinned.error().detail.find("--resolve a.test=127.0.0.1") != std::string::npos);
    auto range = hosts_network({"a.test"});
    range.allow_addresses = {"10.0.0.0/8"};
    const auto outside = check_network_update(range, now, wide_limit);
    REQUIRE_FALSE(outside);
    CHECK(outside.error().detail.find("--allow-address 10.0.0.0/8") != std::string::npos);
    const auto bad = check_network_update(hosts_network({"py*pi.org"}), now, limit);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == moat::errc::invalid_argument);
}

namespace {

asio::awaitable<void> live_policy_case(proxy_fixture* f) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto authority = "echo.test:" + std::to_string(echo.port());
    const auto request = allow({authority}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"});
    const auto port = f->add_sandbox("sb-1", request);
    // A tunnel up under the first policy.
    auto tunnel = co_await open_tunnel(port, authority);
    const std::string connect = "CONNECT " + authority + " HTTP/1.1\r\n\r\n";
    // Another host only: the tunnel closes, and a new request for echo.test is refused.
    auto other = make_network_policy(allow({"other.test"}, {}, {"127.0.0.0/8"}));
    REQUIRE(other);
    const auto closed = f->proxy.set_policy("sb-1", std::move(*other));
    REQUIRE(closed);
    CHECK(*closed == 1);
    const auto rest = co_await read_all(tunnel);
    CHECK(rest.empty());
    const auto refused = co_await exchange(port, connect);
    CHECK(refused.starts_with("HTTP/1.1 403"));
    CHECK(refused.find("not on this sandbox's allow-list") != std::string::npos);
    // Off: every request is refused.
    auto off = make_network_policy(network_request{});
    REQUIRE(off);
    REQUIRE(f->proxy.set_policy("sb-1", std::move(*off)));
    const auto off_reply = co_await exchange(port, connect);
    CHECK(off_reply.find("network access is off") != std::string::npos);
    CHECK_FALSE(f->proxy.set_policy("sb-2", std::move(*make_network_policy(request))));
    co_await f->async_stop();
}

asio::awaitable<void> policy_source_case(proxy_fixture* f, bool* changed) {
    auto& echo = f->start_upstream(server_kind::echo);
    const auto authority = "echo.test:" + std::to_string(echo.port());
    auto first =
        make_network_policy(allow({"other.test"}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"}));
    REQUIRE(first);
    const auto wanted = allow({authority}, {"echo.test=127.0.0.1"}, {"127.0.0.0/8"});
    egress_proxy::policy_source source = [changed, wanted]() -> std::optional<network_policy> {
        if (!*changed) return std::nullopt;
        *changed = false;
        auto policy = make_network_policy(wanted);
        return std::move(*policy);
    };
    REQUIRE(f->proxy.add_sandbox("sb-1", std::move(*first), {}, nullptr, source));
    tcp::acceptor acceptor(f->io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    auto& door = f->doors.emplace_back(front_door{std::move(acceptor), "sb-1"});
    f->tasks.spawn(front_loop(&door, &f->proxy));
    const std::string connect = "CONNECT " + authority + " HTTP/1.1\r\nHost: x\r\n\r\n";
    const auto before = co_await exchange(door.port(), connect);
    CHECK(before.starts_with("HTTP/1.1 403"));
    *changed = true;  // as another process rewriting the sandbox's record
    auto tunnel = co_await open_tunnel(door.port(), authority);
    tunnel.close();
    co_await f->async_stop();
}

}  // namespace

TEST_CASE("a new policy refuses new requests and closes tunnels to hosts it no longer allows") {
    proxy_fixture f;
    moat::test::run_async(f.io, live_policy_case(&f));
    CHECK(std::any_of(f.events.begin(), f.events.end(), [](const egress_event& e) {
        return e.reason.starts_with("policy changed: host echo.test:");
    }));
}

TEST_CASE("a sandbox's policy source is asked before each request and its newer policy applies") {
    proxy_fixture f;
    bool changed = false;
    moat::test::run_async(f.io, policy_source_case(&f, &changed));
    CHECK(f.count(egress_outcome::allowed) == 1);
}
