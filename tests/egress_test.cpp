// The egress proxy's host side (src/egress): the policy, address classification and request
// parsing as pure functions.
#include "egress/address_policy.hpp"
#include "egress/network_policy.hpp"
#include "egress/proxy_request.hpp"

#include <doctest/doctest.h>

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
        // IPv6 forms that carry an IPv4 address are judged by it.
        {"::ffff:127.0.0.1", address_class::loopback},
        {"::ffff:10.0.0.1", address_class::private_use},
        {"::ffff:169.254.169.254", address_class::metadata},
        {"::127.0.0.1", address_class::loopback},
        {"64:ff9b::7f00:1", address_class::loopback},
        {"64:ff9b::a9fe:a9fe", address_class::metadata},
        {"2002:7f00:1::", address_class::loopback},
        {"::ffff:93.184.216.34", address_class::public_unicast},
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
