// Network options between the e2b backend and `moat serve`, as pure functions: the create body
// the backend writes for each mode, the `network` fields serve parses (capped), and the rule by
// which a request narrows the operator's policy (tests/egress_sandbox_test.cpp runs both ends).
#include "e2b/control_plane_client.hpp"
#include "e2b_protocol/sandbox_requests.hpp"
#include "serve/control_plane.hpp"
#include "serve/sandbox_network.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

using moat::network_mode;
using moat::sandbox_network;

sandbox_network with(network_mode mode, std::vector<std::string> hosts = {}) {
    sandbox_network n;
    n.mode = mode;
    n.allow_hosts = std::move(hosts);
    return n;
}

moat::e2b_protocol::create_request request(const std::string& body) {
    auto parsed = moat::e2b_protocol::parse_create_request(body);
    REQUIRE_MESSAGE(parsed, parsed.error().to_string());
    return std::move(*parsed);
}

}  // namespace

TEST_CASE("the e2b create body says whether the sandbox may reach the internet, and which names") {
    moat::e2b::create_body body;
    body.template_id = "base";
    body.allow_internet_access = false;
    const auto none = moat::e2b::create_json(body, false);
    CHECK(none.find(R"("allow_internet_access":false)") != std::string::npos);
    CHECK(none.find("\"network\"") == std::string::npos);
    body.allow_internet_access = true;
    body.allow_out = {"pypi.org", "*.pythonhosted.org"};
    body.deny_out = {"0.0.0.0/0"};
    const auto listed = moat::e2b::create_json(body, true);
    CHECK(listed.find(R"("allow_internet_access":true)") != std::string::npos);
    CHECK(listed.find(R"("network":{"allowOut":["pypi.org","*.pythonhosted.org"],)"
                      R"("denyOut":["0.0.0.0/0"]})") != std::string::npos);
    // What serve parses back is what was written.
    const auto back = request(listed);
    CHECK(back.allow_internet_access == true);
    REQUIRE(back.network);
    CHECK(back.network->allow_out == body.allow_out);
    CHECK(back.network->deny_out == body.deny_out);
}

TEST_CASE("a create request's network lists are parsed with caps and named when wrong") {
    CHECK_FALSE(request(R"({"templateID":"base"})").network);
    const auto ignored =
        request(R"({"network":{"allowPublicTraffic":false,"egressProxy":{"address":"x"},)"
                R"("maskRequestHost":"h","rules":{"a":[]}}})");
    REQUIRE(ignored.network);
    CHECK(ignored.network->allow_out.empty());
    CHECK(ignored.network->mask_request_host == "h");
    const std::string long_mask(moat::e2b_protocol::max_mask_request_host + 1, 'h');
    const std::string long_entry(moat::e2b_protocol::max_network_entry_bytes + 1, 'a');
    std::string many = R"({"network":{"allowOut":[)";
    for (std::size_t i = 0; i <= moat::e2b_protocol::max_network_entries; ++i) {
        many += (i ? ",\"" : "\"") + std::to_string(i) + ".test\"";
    }
    many += "]}}";
    for (const std::string& bad :
         {std::string(R"({"network":[]})"), std::string(R"({"network":{"allowOut":"a.test"}})"),
          std::string(R"({"network":{"denyOut":[1]}})"),
          R"({"network":{"allowOut":[")" + long_entry + R"("]}})", many,
          std::string(R"({"network":{"maskRequestHost":"a\r\nX-Evil: 1"}})"),
          std::string(R"({"network":{"maskRequestHost":"a b"}})"),
          std::string(R"({"network":{"maskRequestHost":""}})"),
          std::string(R"({"network":{"maskRequestHost":7}})"),
          R"({"network":{"maskRequestHost":")" + long_mask + R"("}})"}) {
        const auto refused = moat::e2b_protocol::parse_create_request(bad);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == moat::errc::invalid_argument);
        CHECK(refused.error().detail.find("network") != std::string::npos);
    }
}

TEST_CASE("a create request narrows the operator's network, never widens it") {
    using moat::serve::narrow_network;
    const std::string deny_all = R"("denyOut":["0.0.0.0/0"])";
    const auto pypi_evil = request(
        R"({"network":{"allowOut":["pypi.test","evil.test","10.0.0.0/8"],)" + deny_all + "}}");
    const auto offline = request(R"({"allow_internet_access":false})");
    const auto online = request(R"({"allow_internet_access":true})");
    const auto open = request(R"({"network":{"allowOut":["pypi.test"]}})");  // no denyOut

    auto all = with(network_mode::all);
    all.resolve = {"pypi.test=127.0.0.1"};
    const auto operator_list = with(network_mode::allow_list, {"pypi.test", "files.test"});
    const auto none = with(network_mode::none);

    CHECK(narrow_network(all, offline)->mode == network_mode::none);
    CHECK(*narrow_network(all, online) == all);
    CHECK(*narrow_network(all, open) == all);
    const auto from_all = narrow_network(all, pypi_evil);
    REQUIRE(from_all);
    CHECK(from_all->mode == network_mode::allow_list);
    CHECK(from_all->allow_hosts == std::vector<std::string>{"pypi.test", "evil.test"});
    CHECK(from_all->resolve == all.resolve);
    const auto from_list = narrow_network(operator_list, pypi_evil);
    REQUIRE(from_list);
    CHECK(from_list->allow_hosts == std::vector<std::string>{"pypi.test"});
    CHECK(narrow_network(operator_list, offline)->mode == network_mode::none);
    CHECK(*narrow_network(operator_list, online) == operator_list);
    const auto disjoint = request(R"({"network":{"allowOut":["evil.test"],)" + deny_all + "}}");
    CHECK(narrow_network(operator_list, disjoint)->mode == network_mode::none);
    const auto only_cidrs = request(R"({"network":{"allowOut":["1.2.3.4"],)" + deny_all + "}}");
    CHECK(narrow_network(all, only_cidrs)->mode == network_mode::none);
    for (const auto& r : {offline, online, open, pypi_evil}) {
        CHECK(narrow_network(none, r)->mode == network_mode::none);
    }
    for (const std::string bad : {"py*pi.test", "pypi.test:8080"}) {
        const auto refused = narrow_network(
            all, request(R"({"network":{"allowOut":[")" + bad + R"("],)" + deny_all + "}}"));
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == moat::errc::invalid_argument);
        CHECK(refused.error().detail.find(bad) != std::string::npos);
    }
}

TEST_CASE(
    "denyOut ranges other than 0.0.0.0/0 are taken when the sandbox's egress already refuses "
    "them, and refused with 400 naming them when it would reach them") {
    using moat::serve::narrow_network;
    const auto deny = [](const std::string& list, const std::string& extra = "") {
        return request(R"({)" + extra + R"("network":{"denyOut":[)" + list + "]}}");
    };
    const auto all = with(network_mode::all);
    auto unlocked = with(network_mode::all);
    unlocked.allow_addresses = {"10.20.0.0/16"};
    const auto operator_list = with(network_mode::allow_list, {"pypi.test"});
    const auto none = with(network_mode::none);

    // Under `all` a public range would be reached by name: refused, each range named, the ones
    // already refused not.
    const auto publics = narrow_network(all, deny(R"("8.8.8.8","10.0.0.0/8","1.2.3.0/24","::/0")"));
    REQUIRE_FALSE(publics);
    CHECK(publics.error().code == moat::errc::invalid_argument);
    for (const std::string named : {"8.8.8.8", "1.2.3.0/24", "::/0"}) {
        CHECK_MESSAGE(publics.error().detail.find(named) != std::string::npos, named);
    }
    CHECK(publics.error().detail.find("10.0.0.0/8") == std::string::npos);
    CHECK(publics.error().detail.find("denyOut") != std::string::npos);
    // Ranges the proxy refuses anyway (private, loopback, link-local, CGNAT, multicast, ULA, ...).
    const auto already = narrow_network(
        all, deny(R"("10.0.0.0/8","192.168.1.0/24","172.16.0.0/12","127.0.0.1","169.254.0.0/16",)"
                  R"("100.64.0.0/10","224.0.0.0/4","fd00::/8","fe80::/10","::1")"));
    REQUIRE_MESSAGE(already, already.error().to_string());
    CHECK(*already == all);
    // A range the operator's --allow-address opens (even in part) would be reached: refused.
    const auto opened = narrow_network(unlocked, deny(R"("10.0.0.0/8")"));
    REQUIRE_FALSE(opened);
    CHECK(opened.error().detail.find("10.0.0.0/8") != std::string::npos);
    CHECK(narrow_network(unlocked, deny(R"("10.30.0.0/16")")));
    // Where only names (an allow-list) or nothing are reachable, every range holds: as in E2B,
    // allowOut's names take precedence over denyOut.
    for (const auto& op : {operator_list, none}) {
        const auto narrowed = narrow_network(op, deny(R"("8.8.8.8","1.2.3.0/24")"));
        REQUIRE_MESSAGE(narrowed, narrowed.error().to_string());
        CHECK(*narrowed == op);
    }
    const auto switched = narrow_network(
        all,
        request(R"({"network":{"allowOut":["pypi.test"],"denyOut":["0.0.0.0/0","8.8.8.8"]}})"));
    REQUIRE_MESSAGE(switched, switched.error().to_string());
    CHECK(switched->mode == network_mode::allow_list);
    const auto offline =
        narrow_network(all, deny(R"("8.8.8.8")", R"("allow_internet_access":false,)"));
    REQUIRE_MESSAGE(offline, offline.error().to_string());
    CHECK(offline->mode == network_mode::none);
    // Not an address range: refused whatever the policy, named.
    for (const auto& op : {all, none}) {
        for (const std::string bad : {"example.com", "1.2.3.4/33", "10.0.0.1/8", "1.2.3"}) {
            CAPTURE(bad);
            const auto refused = narrow_network(op, deny("\"" + bad + "\""));
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == moat::errc::invalid_argument);
            CHECK(refused.error().detail.find(bad) != std::string::npos);
        }
    }
}

namespace {

moat::e2b_protocol::network_update_request update(const std::string& body) {
    auto parsed = moat::e2b_protocol::parse_network_update_request(body);
    REQUIRE_MESSAGE(parsed, parsed.error().to_string());
    return std::move(*parsed);
}

}  // namespace

TEST_CASE("a network update body is parsed as E2B's, ignoring what moat serve has not") {
    const auto all = update(R"({"allowOut":["pypi.test","1.1.1.1"],"denyOut":["0.0.0.0/0"],)"
                            R"("allow_internet_access":true,"egressProxy":{"address":"p:1"},)"
                            R"("rules":{"pypi.test":[]}})");
    CHECK(all.network.allow_out == std::vector<std::string>{"pypi.test", "1.1.1.1"});
    CHECK(all.network.deny_out == std::vector<std::string>{"0.0.0.0/0"});
    CHECK(all.allow_internet_access == true);
    const auto empty = update("{}");
    CHECK(empty.network.allow_out.empty());
    CHECK_FALSE(empty.allow_internet_access);
    // The writer's body reads back the same.
    const auto back = update(moat::e2b_protocol::encode_network_update_request(all));
    CHECK(back.network.allow_out == all.network.allow_out);
    CHECK(back.allow_internet_access == all.allow_internet_access);
    for (const std::string bad : {"", "[]", R"({"allowOut":"x"})", R"({"denyOut":[1]})",
                                  R"({"allow_internet_access":"yes"})"}) {
        const auto refused = moat::e2b_protocol::parse_network_update_request(bad);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == moat::errc::invalid_argument);
    }
}

TEST_CASE("a network update maps onto the operator's network and names a host past it") {
    using moat::serve::network_for_update;
    const auto operator_list = with(network_mode::allow_list, {"pypi.test", "files.test"});
    auto all = with(network_mode::all);
    all.resolve = {"pypi.test=127.0.0.1"};
    const std::string deny_all = R"("denyOut":["0.0.0.0/0"])";
    // Every field omitted: the operator's network, the fullest an update may ask for.
    CHECK(*network_for_update(operator_list, update("{}")) == operator_list);
    CHECK(*network_for_update(all, update("{}")) == all);
    CHECK(network_for_update(all, update(R"({"allow_internet_access":false})"))->mode ==
          network_mode::none);
    CHECK(network_for_update(all, update("{" + deny_all + "}"))->mode == network_mode::none);
    const auto listed =
        network_for_update(all, update(R"({"allowOut":["evil.test"],)" + deny_all + "}"));
    REQUIRE(listed);
    CHECK(listed->allow_hosts == std::vector<std::string>{"evil.test"});
    CHECK(listed->resolve == all.resolve);
    const auto pypi =
        network_for_update(operator_list, update(R"({"allowOut":["pypi.test"],)" + deny_all + "}"));
    REQUIRE(pypi);
    CHECK(pypi->allow_hosts == std::vector<std::string>{"pypi.test"});
    // Past the operator's list: refused naming the host, where a create would drop it.
    const auto past = network_for_update(
        operator_list, update(R"({"allowOut":["pypi.test","evil.test"],)" + deny_all + "}"));
    REQUIRE_FALSE(past);
    CHECK(past.error().code == moat::errc::permission_denied);
    CHECK(past.error().detail.find("\"evil.test\"") != std::string::npos);
    const auto from_none = network_for_update(
        with(network_mode::none), update(R"({"allowOut":["pypi.test"],)" + deny_all + "}"));
    REQUIRE_FALSE(from_none);
    CHECK(from_none.error().code == moat::errc::permission_denied);
    // A bad name, or a public range moat cannot deny under all: 400 as for a create.
    const auto bad = network_for_update(all, update(R"({"allowOut":["py*pi"],)" + deny_all + "}"));
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == moat::errc::invalid_argument);
    const auto public_range = network_for_update(all, update(R"({"denyOut":["8.8.8.8"]})"));
    REQUIRE_FALSE(public_range);
    CHECK(public_range.error().code == moat::errc::invalid_argument);
}
