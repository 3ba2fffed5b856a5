// The HTTP server's routing (src/http/router.*): literal and {param} segments, 404 and 405.
#include "http/router.hpp"

#include <doctest/doctest.h>

namespace http = moat::http;
using outcome = http::route_match::outcome;

TEST_CASE("routes match literal and parameter segments, first added first") {
    http::route_table t;
    REQUIRE(t.add("GET", "/sandboxes"));
    REQUIRE(t.add("POST", "/sandboxes"));
    REQUIRE(t.add("GET", "/sandboxes/{id}"));
    REQUIRE(t.add("POST", "/sandboxes/{id}/timeout"));
    REQUIRE(t.add("GET", "/sandboxes/special"));  // shadowed by {id}, which was added first

    auto m = t.match("GET", "/sandboxes/abc");
    REQUIRE(m.result == outcome::found);
    CHECK(m.route_index == 2);
    CHECK(m.params.get("id") == "abc");
    CHECK(m.params.get("other").empty());

    m = t.match("POST", "/sandboxes/abc/timeout");
    REQUIRE(m.result == outcome::found);
    CHECK(m.route_index == 3);
    CHECK(m.params.get("id") == "abc");

    CHECK(t.match("GET", "/sandboxes/special").route_index == 2);
    CHECK(t.match("POST", "/sandboxes").route_index == 1);
}

TEST_CASE("a path that matches under another method is 405 with Allow, others 404") {
    http::route_table t;
    REQUIRE(t.add("GET", "/sandboxes/{id}"));
    REQUIRE(t.add("DELETE", "/sandboxes/{id}"));
    auto m = t.match("PUT", "/sandboxes/x");
    CHECK(m.result == outcome::method_not_allowed);
    CHECK(m.allow == "GET, DELETE");
    CHECK(t.match("GET", "/sandboxes").result == outcome::not_found);
    CHECK(t.match("GET", "/sandboxes/").result == outcome::not_found);  // empty {id}
    CHECK(t.match("GET", "/sandboxes/x/").result == outcome::not_found);
    CHECK(t.match("GET", "/sandboxes/x/y").result == outcome::not_found);
    CHECK(t.match("GET", "").result == outcome::not_found);
}

TEST_CASE("bad patterns and methods are refused") {
    http::route_table t;
    CHECK_FALSE(t.add("GET", "sandboxes"));
    CHECK_FALSE(t.add("GET", "/a/{}"));
    CHECK_FALSE(t.add("GET", "/a/x{id}"));
    CHECK_FALSE(t.add("GET", "/a/{i{d}"));
    CHECK_FALSE(t.add("BAD METHOD", "/a"));
    CHECK(t.size() == 0);
    CHECK(t.add("GET", "/"));
    CHECK(t.match("GET", "/").result == outcome::found);
}
