// JSON-RPC 2.0 as MCP speaks it over stdio: the line parser (untrusted bytes) and the writers.
#include "mcp/jsonrpc.hpp"

#include <doctest/doctest.h>

#include <string>

namespace mcp = moat::mcp;
using kind = mcp::jsonrpc_message::kind;

namespace {

mcp::jsonrpc_message expect_invalid(std::string_view line, int code) {
    auto m = mcp::parse_jsonrpc(line);
    INFO(line);
    CHECK(m.what == kind::invalid);
    CHECK(m.error_code == code);
    CHECK_FALSE(m.error_message.empty());
    CHECK(m.error_message.find('\n') == std::string::npos);
    return m;
}

}  // namespace

TEST_CASE("a JSON-RPC request keeps its id, method and params") {
    const auto m = mcp::parse_jsonrpc(
        R"({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_python",)"
        R"( "arguments": {"code": "x = 1"}}})");
    REQUIRE(m.what == kind::request);
    CHECK(m.id == "7");
    CHECK(m.method == "tools/call");
    CHECK(m.params == R"({"name":"run_python","arguments":{"code":"x = 1"}})");
    CHECK(m.error_code == 0);
}

TEST_CASE("a JSON-RPC id may be a string or an integer and comes back as JSON text") {
    CHECK(mcp::parse_jsonrpc(R"({"jsonrpc":"2.0","id":"abc","method":"ping"})").id == R"("abc")");
    CHECK(mcp::parse_jsonrpc(R"({"jsonrpc":"2.0","id":"a\"b\n","method":"ping"})").id ==
          R"("a\"b\n")");
    CHECK(mcp::parse_jsonrpc(R"({"jsonrpc":"2.0","id":-3,"method":"ping"})").id == "-3");
    CHECK(mcp::parse_jsonrpc(R"({"jsonrpc":"2.0","id":18446744073709551615,"method":"ping"})").id ==
          "18446744073709551615");
    CHECK(mcp::parse_jsonrpc(R"({"jsonrpc":"2.0","id":"","method":"ping"})").id == R"("")");
}

TEST_CASE("a JSON-RPC id that is a fraction, a boolean or an object is an invalid request") {
    for (const auto* line : {R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})",
                             R"({"jsonrpc":"2.0","id":true,"method":"ping"})",
                             R"({"jsonrpc":"2.0","id":{"a":1},"method":"ping"})",
                             R"({"jsonrpc":"2.0","id":[1],"method":"ping"})"}) {
        const auto m = expect_invalid(line, -32600);
        CHECK(m.id.empty());
    }
}

TEST_CASE("a JSON-RPC request with a null id is invalid") {
    const auto m = expect_invalid(R"({"jsonrpc":"2.0","id":null,"method":"ping"})", -32600);
    CHECK(m.id.empty());
}

TEST_CASE("a JSON-RPC message without an id and with a method is a notification") {
    const auto m = mcp::parse_jsonrpc(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
    REQUIRE(m.what == kind::notification);
    CHECK(m.id.empty());
    CHECK(m.method == "notifications/initialized");
    CHECK(m.params.empty());

    const auto cancelled = mcp::parse_jsonrpc(
        R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}})");
    REQUIRE(cancelled.what == kind::notification);
    CHECK(cancelled.params == R"({"requestId":4})");
}

TEST_CASE("JSON-RPC params may be an array but not a scalar or null") {
    const auto m = mcp::parse_jsonrpc(R"({"jsonrpc":"2.0","id":1,"method":"m","params":[1,"a"]})");
    REQUIRE(m.what == kind::request);
    CHECK(m.params == R"([1,"a"])");
    for (const auto* params : {"3", R"("x")", "null", "true"}) {
        const std::string line =
            std::string(R"({"jsonrpc":"2.0","id":2,"method":"m","params":)") + params + "}";
        const auto bad = expect_invalid(line, -32600);
        CHECK(bad.id == "2");
        CHECK(bad.error_message.find("params") != std::string::npos);
    }
}

TEST_CASE("a JSON-RPC message with a result or an error and an id is a response") {
    const auto ok = mcp::parse_jsonrpc(R"({"jsonrpc":"2.0","id":"s1","result":{}})");
    CHECK(ok.what == kind::response);
    CHECK(ok.id == R"("s1")");
    const auto failed =
        mcp::parse_jsonrpc(R"({"jsonrpc":"2.0","id":5,"error":{"code":-1,"message":"x"}})");
    CHECK(failed.what == kind::response);
    CHECK(failed.id == "5");
    // The reply to a message the peer could not read has a null id.
    const auto unread = mcp::parse_jsonrpc(
        R"({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}})");
    CHECK(unread.what == kind::response);
    CHECK(unread.id.empty());
}

TEST_CASE("a JSON-RPC response without an id or with both result and error is invalid") {
    expect_invalid(R"({"jsonrpc":"2.0","result":{}})", -32600);
    expect_invalid(R"({"jsonrpc":"2.0","id":null,"result":{}})", -32600);
    const auto both = expect_invalid(
        R"({"jsonrpc":"2.0","id":9,"result":{},"error":{"code":1,"message":"m"}})", -32600);
    CHECK(both.id == "9");
}

TEST_CASE("a JSON-RPC message must say jsonrpc 2.0 and have a string method") {
    const auto old = expect_invalid(R"({"jsonrpc":"1.0","id":3,"method":"ping"})", -32600);
    CHECK(old.id == "3");
    expect_invalid(R"({"id":3,"method":"ping"})", -32600);
    expect_invalid(R"({"jsonrpc":2.0,"id":3,"method":"ping"})", -32600);
    const auto number = expect_invalid(R"({"jsonrpc":"2.0","id":"q","method":5})", -32600);
    CHECK(number.id == R"("q")");
    const auto none = expect_invalid(R"({"jsonrpc":"2.0","id":4})", -32600);
    CHECK(none.id == "4");
}

TEST_CASE("a JSON-RPC batch is refused because MCP removed batches") {
    const auto m = expect_invalid(R"([{"jsonrpc":"2.0","id":1,"method":"ping"}])", -32600);
    CHECK(m.error_message == "batches are not supported");
    CHECK(m.id.empty());
    expect_invalid("[]", -32600);
}

TEST_CASE("text that is not JSON is a JSON-RPC parse error") {
    for (const auto* line : {"", "{", "not json", R"({"jsonrpc":"2.0","id":1,})", "\xff\xfe",
                             R"({"jsonrpc":"2.0","id":1,"method":"a"} trailing)",
                             R"({"jsonrpc":"2.0","method":"\ud800"})"}) {
        const auto m = expect_invalid(line, -32700);
        CHECK(m.id.empty());
    }
}

TEST_CASE("a JSON value that is not an object is an invalid JSON-RPC request") {
    for (const auto* line : {"3", R"("x")", "null", "true"}) expect_invalid(line, -32600);
}

TEST_CASE("a JSON-RPC line longer than the limit is refused before parsing") {
    const std::string line = R"({"jsonrpc":"2.0","id":1,"method":"ping"})";
    CHECK(mcp::parse_jsonrpc(line, line.size()).what == kind::request);
    const auto m = mcp::parse_jsonrpc(line, line.size() - 1);
    CHECK(m.what == kind::invalid);
    CHECK(m.error_code == -32600);
    CHECK(m.error_message == "message too large");
}

TEST_CASE("a JSON-RPC message with a NUL byte inside a string keeps it") {
    const std::string line = std::string(R"({"jsonrpc":"2.0","id":1,"method":"a\u0000b"})");
    const auto m = mcp::parse_jsonrpc(line);
    REQUIRE(m.what == kind::request);
    CHECK(m.method == std::string("a\0b", 3));
}

TEST_CASE("JSON-RPC results, errors and notifications are written as one line") {
    CHECK(mcp::jsonrpc_result("7", R"({"tools":[]})") ==
          R"({"jsonrpc":"2.0","id":7,"result":{"tools":[]}})");
    CHECK(mcp::jsonrpc_result(R"("a")", "") == R"({"jsonrpc":"2.0","id":"a","result":{}})");
    CHECK(
        mcp::jsonrpc_error("", -32700, "parse error: \"x\"\n") ==
        R"({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error: \"x\"\n"}})");
    CHECK(mcp::jsonrpc_error("3", -32601, "no such method") ==
          R"({"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"no such method"}})");
    CHECK(mcp::jsonrpc_notification("notifications/progress", R"({"progress":1})") ==
          R"({"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}})");
    CHECK(mcp::jsonrpc_notification("notifications/tools/list_changed", "") ==
          R"({"jsonrpc":"2.0","method":"notifications/tools/list_changed"})");
}

TEST_CASE("what the JSON-RPC writers produce parses back with the same id") {
    for (const auto* id : {"12", R"("x\"y")", R"("é")"}) {
        const auto reply = mcp::parse_jsonrpc(mcp::jsonrpc_error(id, -32600, "bad\x01\xff"));
        CHECK(reply.what == kind::response);
        CHECK(reply.id == id);
    }
    const auto note = mcp::parse_jsonrpc(mcp::jsonrpc_notification("a\nb", "[]"));
    CHECK(note.what == kind::notification);
    CHECK(note.method == "a\nb");
}

TEST_CASE("JSON-RPC params fields are read by name and type") {
    const std::string params =
        R"({"name":"run_shell","arguments":{"command":"ls"},"n":2,"z":null})";
    CHECK(mcp::string_field(params, "name") == "run_shell");
    CHECK_FALSE(mcp::string_field(params, "arguments"));
    CHECK_FALSE(mcp::string_field(params, "missing"));
    CHECK(mcp::raw_field(params, "arguments") == R"({"command":"ls"})");
    CHECK(mcp::raw_field(params, "n") == "2");
    CHECK(mcp::raw_field(params, "name") == R"("run_shell")");
    CHECK(mcp::raw_field(params, "z") == "null");
    CHECK_FALSE(mcp::raw_field(params, "missing"));
    CHECK_FALSE(mcp::raw_field("[1,2]", "name"));
    CHECK_FALSE(mcp::raw_field("", "name"));
    CHECK_FALSE(mcp::string_field("{broken", "name"));
}
