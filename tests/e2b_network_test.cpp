// Network options between the e2b backend and `moat serve`, as pure functions: the create body
// the backend writes for each mode, the `network` fields serve parses (capped), and the rule by
// which a request narrows the operator's policy (tests/egress_sandbox_test.cpp runs both ends).
#include "e2b/control_plane_client.hpp"
#include "serve/control_plane.hpp"
#include "serve/e2b_requests.hpp"

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

moat::serve::create_request request(const std::string& body) {
    auto parsed = moat::serve::parse_create_request(body);
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
    const std::string long_entry(moat::serve::max_e2b_network_entry_bytes + 1, 'a');
    std::string many = R"({"network":{"allowOut":[)";
    for (std::size_t i = 0; i <= moat::serve::max_e2b_network_entries; ++i) {
        many += (i ? ",\"" : "\"") + std::to_string(i) + ".test\"";
    }
    many += "]}}";
    for (const std::string& bad :
         {std::string(R"({"network":[]})"), std::string(R"({"network":{"allowOut":"a.test"}})"),
          std::string(R"({"network":{"denyOut":[1]}})"),
          R"({"network":{"allowOut":[")" + long_entry + R"("]}})", many}) {
        const auto refused = moat::serve::parse_create_request(bad);
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
