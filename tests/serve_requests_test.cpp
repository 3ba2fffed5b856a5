// moat serve's parsers of untrusted bytes (E2B request bodies, queries, the metadata filter), its
// envd demultiplexing and its server secret: pure functions and files, no server.
#include <doctest/doctest.h>

#include "core/base64.hpp"
#include "core/rfc3339.hpp"
#include "e2b_protocol/sandbox_requests.hpp"
#include "http/message.hpp"
#include "serve/connect_rpc.hpp"
#include "serve/envd_server.hpp"
#include "serve/server_secret.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace moat::serve;
using namespace moat::e2b_protocol;
using moat::base64url_decode;
using moat::base64url_encode;

TEST_CASE("the SDK's triple-encoded metadata filter decodes to the exact pairs, a b&c=d included") {
    // What e2b 2.51.0 sends for {user: 'a b&c=d', app: 'prod'}: the query decodes it once.
    auto query =
        parse_query("metadata=user%3Da%252520b%252526c%25253Dd%26app%3Dprod&state=running,paused");
    REQUIRE(query);
    REQUIRE(query->contains("metadata"));
    CHECK(query->at("state") == "running,paused");
    auto pairs = parse_metadata_filter(query->at("metadata"));
    REQUIRE(pairs);
    REQUIRE(pairs->size() == 2);
    CHECK((*pairs)[0].first == "user");
    CHECK((*pairs)[0].second == "a b&c=d");
    CHECK((*pairs)[1].first == "app");
    CHECK((*pairs)[1].second == "prod");
    // Go's QueryUnescape: '+' is a space.
    auto plus = parse_metadata_filter("k=a+b");
    REQUIRE(plus);
    CHECK((*plus)[0].second == "a b");
    for (const char* bad : {"novalue", "a=b=c", "k=%zz", "k=%4"}) {
        auto refused = parse_metadata_filter(bad);
        CHECK_MESSAGE(!refused, bad);
        if (!refused) CHECK(refused.error().code == moat::errc::invalid_argument);
    }
}

TEST_CASE("a create body gives its fields, defaults what is absent and names what is wrong") {
    auto v1 = parse_create_request(
        R"({"templateID":"base","metadata":{"user":"a b&c=d"},"envVars":{"FOO":"bar"},)"
        R"("timeout":300,"secure":true,"allow_internet_access":true,"unknown":[1,2]})");
    REQUIRE(v1);
    CHECK(v1->template_id == "base");
    CHECK(v1->timeout_s == 300);
    CHECK(v1->metadata.at("user") == "a b&c=d");
    CHECK(v1->env_vars.at("FOO") == "bar");
    CHECK(v1->secure == true);
    CHECK(v1->allow_internet_access == true);
    auto bare = parse_create_request(R"({"templateID":"base"})");
    REQUIRE(bare);
    CHECK(!bare->timeout_s);
    CHECK(bare->metadata.empty());
    struct refusal {
        const char* body;
        const char* named;
    };
    for (const auto& [body, named] : {
             refusal{"", "empty"},
             refusal{"[]", "object"},
             refusal{"{", "JSON"},
             refusal{R"({"timeout":"300"})", "timeout"},
             refusal{R"({"timeout":-1})", "timeout"},
             refusal{R"({"timeout":1.5})", "timeout"},
             refusal{R"({"metadata":{"a":1}})", "metadata"},
             refusal{R"({"envVars":"x"})", "envVars"},
             refusal{R"({"templateID":7})", "templateID"},
             refusal{R"({"secure":"yes"})", "secure"},
         }) {
        auto r = parse_create_request(body);
        CHECK_MESSAGE(!r, body);
        if (!r) {
            CHECK(r.error().code == moat::errc::invalid_argument);
            CHECK_MESSAGE(r.error().detail.find(named) != std::string::npos, r.error().detail);
        }
    }
    const std::string huge =
        R"({"metadata":{"k":")" + std::string(max_request_body_bytes, 'x') + "\"}}";
    CHECK(!parse_create_request(huge));
    const std::string long_value =
        R"({"metadata":{"k":")" + std::string(max_string_bytes + 1, 'x') + "\"}}";
    CHECK(!parse_create_request(long_value));
}

TEST_CASE("timeout, connect and refresh bodies: required, optional and empty") {
    CHECK(parse_timeout_request(R"({"timeout":30})").value() == 30);
    CHECK(!parse_timeout_request("{}"));
    CHECK(!parse_timeout_request(""));
    CHECK(!parse_connect_request("").value());
    CHECK(!parse_connect_request("{}").value());
    CHECK(parse_connect_request(R"({"timeout":300})").value() == 300);
    CHECK(!parse_connect_request(R"({"timeout":true})"));
    CHECK(parse_refresh_request(R"({"duration":60})").value() == 60);
    CHECK(!parse_refresh_request(R"({"duration":3601})"));
}

TEST_CASE("RFC 3339 times and base64url tokens round-trip") {
    const auto t = parse_rfc3339("2026-12-01T14:40:11.123Z");
    REQUIRE(t);
    CHECK(format_rfc3339(*t) == "2026-12-01T14:40:11.123Z");
    const auto offset = parse_rfc3339("2026-12-01T16:40:11.123+02:00");
    REQUIRE(offset);
    CHECK(*offset == *t);
    for (const char* bad :
         {"", "2026-12-01", "2026-13-01T00:00:00Z", "2026-12-01T00:00:00",
          "2026-12-01T00:00:00Zjunk", "0026-12-01T14:40:11.12342z", "9999-12-31T23:59:59Z"}) {
        CHECK_MESSAGE(!parse_rfc3339(bad), bad);
    }
    // The one printer behind every RFC 3339 moat writes: seconds, milliseconds, nanoseconds.
    const auto nanos = moat::detail::parse_rfc3339("2026-12-01T14:40:11.123456789Z");
    REQUIRE(nanos);
    CHECK(moat::detail::format_rfc3339(*nanos) == "2026-12-01T14:40:11Z");
    CHECK(moat::detail::format_rfc3339(*nanos, 3) == "2026-12-01T14:40:11.123Z");
    CHECK(moat::detail::format_rfc3339(*nanos, 9) == "2026-12-01T14:40:11.123456789Z");
    CHECK(moat::detail::parse_rfc3339(moat::detail::format_rfc3339(*nanos, 9)) == nanos);
    CHECK(moat::detail::format_rfc3339(std::chrono::system_clock::time_point{}) ==
          "1970-01-01T00:00:00Z");
    for (const std::string& s : std::vector<std::string>{
             "", "a", "ab", "abc", "1700000000000__sb-0123", std::string("\xff\x00\x7f", 3)}) {
        CHECK(base64url_decode(base64url_encode(s)) == s);
    }
    CHECK(!base64url_decode("a+b/"));
}

TEST_CASE(
    "envd finds the sandbox in E2b-Sandbox-Id or in a 49983-<id>.<domain> Host under the "
    "configured domain only") {
    moat::http::request_head head;
    head.headers.add("Host", "127.0.0.1:49983");
    CHECK(!requested_sandbox_id(head, "e2b.local"));
    head.headers.add("E2b-Sandbox-Id", "sb-1");
    CHECK(requested_sandbox_id(head, "e2b.local") == "sb-1");
    CHECK(requested_sandbox_id(head, "") == "sb-1");
    moat::http::request_head by_host;
    by_host.headers.add("Host", "49983-sb-2.e2b.local:8443");
    CHECK(requested_sandbox_id(by_host, "e2b.local") == "sb-2");
    CHECK(!requested_sandbox_id(by_host, "other.local"));
    CHECK(!requested_sandbox_id(by_host, ""));
    moat::http::request_head other_port;
    other_port.headers.add("Host", "3000-sb-2.e2b.local");
    CHECK(!requested_sandbox_id(other_port, "e2b.local"));
    CHECK(sandbox_id_in_host("49983-sb-2.E2B.Local.", "e2b.local") == "sb-2");
    CHECK(sandbox_id_in_host("49983-sb-2.e2b.local.:443", "e2b.local") == "sb-2");
    for (const std::string other :
         {"49983-sb-2.evil.example", "49983-sb-2.e2b.local.evil.example", "49983-sb-2.x.e2b.local",
          "49983-.e2b.local", "49983-sb-2", "e2b.local", "[::1]:49983", "49983-sb-2.e2b.local..",
          "x49983-sb-2.e2b.local"}) {
        CAPTURE(other);
        CHECK(sandbox_id_in_host(other, "e2b.local").empty());
    }
}

TEST_CASE("a port request names its sandbox and port by Host, else by E2b-Sandbox-Id and -Port") {
    const auto named = parse_sandbox_host("8000-sb-2.E2B.local.:443", "e2b.local");
    REQUIRE(named);
    CHECK(named->id == "sb-2");
    CHECK(named->port == 8000);
    CHECK(parse_sandbox_host("65535-sb-2.e2b.local", "e2b.local")->port == 65535);
    for (const std::string other :
         {"0-sb-2.e2b.local", "65536-sb-2.e2b.local", "x-sb-2.e2b.local", "-sb-2.e2b.local",
          "8000sb-2.e2b.local", "8000-.e2b.local", "8000-sb-2.other.local", "+80-sb-2.e2b.local",
          "8000-sb-2.e2b.local.evil", "[::1]:8000", "8000-sb-2"}) {
        CAPTURE(other);
        CHECK_FALSE(parse_sandbox_host(other, "e2b.local"));
    }
    CHECK_FALSE(parse_sandbox_host("8000-sb-2.e2b.local", ""));
    // A domain given with its trailing dot is the same domain; one with a ':' names nothing.
    REQUIRE(parse_sandbox_host("8000-sb-2.e2b.local.", "e2b.local."));
    CHECK(parse_sandbox_host("8000-sb-2.e2b.local", "e2b.local.")->id == "sb-2");
    CHECK_FALSE(parse_sandbox_host("8-1.::-", ":"));

    // envd's own port is envd's, by name or by header.
    const auto head = [](std::string host, std::string id, std::string port) {
        moat::http::request_head h;
        if (!host.empty()) h.headers.add("Host", std::move(host));
        if (!id.empty()) h.headers.add("E2b-Sandbox-Id", std::move(id));
        if (!port.empty()) h.headers.add("E2b-Sandbox-Port", std::move(port));
        return h;
    };
    CHECK_FALSE(requested_port(head("49983-sb-2.e2b.local", "", ""), "e2b.local"));
    // The name wins over the headers, as at E2B's proxy.
    const auto by_name = head("8000-sb-2.e2b.local", "sb-9", "9000");
    REQUIRE(requested_port(by_name, "e2b.local"));
    CHECK(requested_port(by_name, "e2b.local")->id == "sb-2");
    CHECK(requested_port(by_name, "e2b.local")->port == 8000);
    const auto by_header = head("127.0.0.1:49983", "sb-3", "49999");
    REQUIRE(requested_port(by_header, "e2b.local"));
    CHECK(requested_port(by_header, "e2b.local")->id == "sb-3");
    CHECK(requested_port(by_header, "e2b.local")->port == 49999);
    CHECK_FALSE(requested_port(head("", "sb-3", "49983"), ""));
    const auto bad_port = head("", "sb-3", "80a");
    REQUIRE(requested_port(bad_port, ""));
    CHECK(requested_port(bad_port, "")->port == 0);
    CHECK_FALSE(requested_port(head("", "sb-3", ""), ""));
}

TEST_CASE("Keepalive-Ping-Interval is whole seconds from 1 to an hour, larger values clamped") {
    using namespace std::chrono_literals;
    CHECK(parse_keepalive_interval("50") == 50s);
    CHECK(parse_keepalive_interval("1") == 1s);
    CHECK(parse_keepalive_interval("3600") == 3600s);
    CHECK(max_keepalive_interval == 3600s);
    // Past the hour, however many digits: the client asked for few keep-alives, and gets one an
    // hour (a ten-digit value once overflowed the deadline and flooded the stream).
    for (const std::string huge : {"3601", "9999999999", "99999999999999999999",
                                   "000000000000000000000000000000000000000007200"}) {
        CAPTURE(huge);
        CHECK(parse_keepalive_interval(huge) == max_keepalive_interval);
    }
    CHECK(parse_keepalive_interval("0000000000000000000000000000005") == 5s);
    // Not a positive number: the caller's default (envd's 90 s), as envd does.
    for (const std::string bad : {"", "0", "-5", "+5", "1.5", "5s", " 5", "abc", "0x10"}) {
        CAPTURE(bad);
        CHECK_FALSE(parse_keepalive_interval(bad));
    }
}

TEST_CASE("the server secret is made once, private, and gives stable tokens per sandbox") {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("moat-serve-secret-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "secret").string();
    auto first = server_secret::load_or_create(path);
    REQUIRE(first);
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(st.st_size == 32);
    auto again = server_secret::load_or_create(path);
    REQUIRE(again);
    CHECK(first->access_token("sb-1") == again->access_token("sb-1"));
    CHECK(first->access_token("sb-1") != first->access_token("sb-2"));
    CHECK(first->access_token("sb-1").size() == 64);
    CHECK(first->scope() == again->scope());
    ::chmod(path.c_str(), 0644);
    auto exposed = server_secret::load_or_create(path);
    REQUIRE(!exposed);
    CHECK(exposed.error().detail.find("0600") != std::string::npos);
    std::filesystem::remove_all(dir);
    CHECK(constant_time_equals("abc", "abc"));
    CHECK(!constant_time_equals("abc", "abd"));
    CHECK(!constant_time_equals("abc", "abcd"));
}
