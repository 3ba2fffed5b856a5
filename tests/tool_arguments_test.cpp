// A tool call's arguments, as a model or an MCP client sends them (untrusted JSON).
#include "tools/tool_arguments.hpp"

#include "core/base64.hpp"

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it
#include <string>

namespace {

// The detail of a refused call, checked to be one line of errc::invalid_argument.
std::string refusal(std::string_view tool, std::string_view json, double max = 600) {
    const auto r = moat::parse_tool_arguments(tool, json, max);
    INFO(tool, " ", json);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == moat::errc::invalid_argument);
    CHECK(r.error().detail.find('\n') == std::string::npos);
    return r.error().detail;
}

}  // namespace

TEST_CASE("run_python arguments give the code and an optional timeout") {
    auto r = moat::parse_tool_arguments("run_python", R"j({"code":"x = 1\nprint(x)"})j");
    REQUIRE(r);
    CHECK(r->code == "x = 1\nprint(x)");
    CHECK_FALSE(r->timeout_seconds);

    r = moat::parse_tool_arguments("run_python", R"({"code":"  pass","timeout_seconds":5})");
    REQUIRE(r);
    CHECK(r->code == "  pass");  // kept exactly: indentation matters to Python
    CHECK(r->timeout_seconds == 5.0);
}

TEST_CASE("run_shell arguments give the command and ignore unknown fields") {
    const auto r = moat::parse_tool_arguments(
        "run_shell", R"({"command":"ls -l","timeout_seconds":2.5,"cwd":"/tmp","code":7})");
    REQUIRE(r);
    CHECK(r->command == "ls -l");
    CHECK(r->timeout_seconds == 2.5);
    CHECK(r->code.empty());
}

TEST_CASE("a missing or blank code or command names the field") {
    CHECK(refusal("run_python", "{}") == "code: required string is missing");
    CHECK(refusal("run_python", R"({"code":null})") == "code: required string is missing");
    CHECK(refusal("run_python", R"({"code":""})") == "code: is empty");
    CHECK(refusal("run_python", R"({"code":" \n\t "})") == "code: is empty");
    CHECK(refusal("run_shell", R"({"cmd":"ls"})") == "command: required string is missing");
    CHECK(refusal("run_shell", R"({"command":"\r\n"})") == "command: is empty");
}

TEST_CASE("a field of the wrong type says what it got") {
    CHECK(refusal("run_python", R"({"code":42})") == "code: must be a string, not a number");
    CHECK(refusal("run_shell", R"({"command":["ls","-l"]})") ==
          "command: must be a string, not an array");
    CHECK(refusal("read_file", R"({"path":{"p":1}})") == "path: must be a string, not an object");
    CHECK(refusal("write_file", R"({"path":"/a","content":false})") ==
          "content: must be a string, not a boolean");
}

TEST_CASE("timeout_seconds must be a number greater than 0 and at most the maximum") {
    const std::string message = "timeout_seconds: must be a number greater than 0 and at most 600";
    for (const auto* timeout : {"0", "-1", "600.5", "601", "1e9", R"("5")", "true", "[5]"}) {
        const std::string json = std::string(R"({"code":"1","timeout_seconds":)") + timeout + "}";
        CHECK(refusal("run_python", json) == message);
    }
    CHECK(refusal("run_shell", R"({"command":"ls","timeout_seconds":31})", 30) ==
          "timeout_seconds: must be a number greater than 0 and at most 30");
    CHECK(refusal("run_shell", R"({"command":"ls","timeout_seconds":3})", 2.5) ==
          "timeout_seconds: must be a number greater than 0 and at most 2.5");

    for (const auto* timeout : {"0.5", "1", "600", "599.99", "null"}) {
        const std::string json = std::string(R"({"code":"1","timeout_seconds":)") + timeout + "}";
        INFO(json);
        CHECK(moat::parse_tool_arguments("run_python", json));
    }
    const auto half =
        moat::parse_tool_arguments("run_python", R"({"code":"1","timeout_seconds":0.5})");
    REQUIRE(half);
    CHECK(half->timeout_seconds == 0.5);
    const auto none =
        moat::parse_tool_arguments("run_python", R"({"code":"1","timeout_seconds":null})");
    REQUIRE(none);
    CHECK_FALSE(none->timeout_seconds);
}

TEST_CASE("write_file needs a path and content and content may be empty") {
    auto r =
        moat::parse_tool_arguments("write_file", R"({"path":"/workspace/a.txt","content":""})");
    REQUIRE(r);
    CHECK(r->path == "/workspace/a.txt");
    CHECK(r->content.empty());

    r = moat::parse_tool_arguments("write_file", R"({"path":"rel/b.txt","content":"x\u0000y"})");
    REQUIRE(r);
    CHECK(r->path == "rel/b.txt");
    CHECK(r->content == std::string("x\0y", 3));

    CHECK(refusal("write_file", R"({"path":"/a"})") == "content: required string is missing");
    CHECK(refusal("write_file", R"({"content":"x"})") == "path: required string is missing");
}

TEST_CASE("read_file needs a path and list_files may leave it out") {
    CHECK(refusal("read_file", "{}") == "path: required string is missing");
    const auto read = moat::parse_tool_arguments("read_file", R"({"path":"/etc/../x"})");
    REQUIRE(read);
    CHECK(read->path == "/etc/../x");  // the tool layer resolves and checks paths

    auto list = moat::parse_tool_arguments("list_files", "{}");
    REQUIRE(list);
    CHECK(list->path.empty());
    list = moat::parse_tool_arguments("list_files", R"({"path":null})");
    REQUIRE(list);
    CHECK(list->path.empty());
    list = moat::parse_tool_arguments("list_files", R"({"path":"/workspace/out"})");
    REQUIRE(list);
    CHECK(list->path == "/workspace/out");
    CHECK(refusal("list_files", R"({"path":3})") == "path: must be a string, not a number");
}

TEST_CASE("tool arguments that are not a JSON object are refused") {
    CHECK(refusal("run_python", "[1]") == "arguments: not a JSON object");
    CHECK(refusal("run_python", "null") == "arguments: not a JSON object");
    CHECK(refusal("run_python", R"j("print(1)")j") == "arguments: not a JSON object");
    CHECK(refusal("run_python", R"({"code":)") == "arguments: not valid JSON");
    CHECK(refusal("run_python", "\xff") == "arguments: not valid JSON");
}

TEST_CASE("empty tool arguments are the empty object") {
    CHECK(refusal("run_python", "") == "code: required string is missing");
    CHECK(refusal("read_file", "  \n") == "path: required string is missing");
    CHECK(moat::parse_tool_arguments("list_files", ""));
}

TEST_CASE("an unknown tool is refused with its name bounded and printable") {
    CHECK(refusal("run_java", "{}") == "unknown tool 'run_java'");
    CHECK(refusal("", "{}") == "unknown tool ''");
    const std::string detail = refusal("a\nb\x1b[31m" + std::string(200, 'x'), "{}");
    CHECK(detail.find('\x1b') == std::string::npos);
    CHECK(detail.size() < 100);
    CHECK(detail.find("a?b?[31m") != std::string::npos);
}

TEST_CASE("read_file and write_file take an encoding, and base64 content is decoded exactly") {
    auto text = moat::parse_tool_arguments("read_file", R"({"path":"a","encoding":"text"})");
    REQUIRE(text);
    CHECK_FALSE(text->base64);
    auto raw = moat::parse_tool_arguments("read_file", R"({"path":"a","encoding":"base64"})");
    REQUIRE(raw);
    CHECK(raw->base64);
    CHECK(refusal("read_file", R"({"path":"a","encoding":"utf-16"})") ==
          R"(encoding: must be "text" or "base64")");

    // "\r\n", a NUL, bytes 0x80 and 0xff: exactly these five bytes.
    auto bytes = moat::parse_tool_arguments(
        "write_file", R"({"path":"b","content":"DQoAgP8=","encoding":"base64"})");
    REQUIRE(bytes);
    CHECK(bytes->content == std::string("\r\n\0\x80\xff", 5));
    auto unpadded = moat::parse_tool_arguments(
        "write_file", R"({"path":"b","content":"aGk","encoding":"base64"})");
    REQUIRE(unpadded);
    CHECK(unpadded->content == "hi");
    CHECK(refusal("write_file", R"({"path":"b","content":"a*b=","encoding":"base64"})") ==
          R"(content: not valid base64 (encoding is "base64"))");
    CHECK(refusal("write_file", R"({"path":"b","content":"aGk=aGk=","encoding":"base64"})")
              .starts_with("content: not valid base64"));
    // Without the encoding, the same text is the content itself.
    auto plain = moat::parse_tool_arguments("write_file", R"({"path":"b","content":"aGk="})");
    REQUIRE(plain);
    CHECK(plain->content == "aGk=");
}

TEST_CASE("base64 encodes and decodes every byte value and length") {
    std::string all;
    for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
    for (std::size_t n = 0; n <= all.size(); n += 37) {
        const std::string part = all.substr(0, n);
        const auto encoded = moat::base64_encode(part);
        CHECK(encoded.size() == (n + 2) / 3 * 4);
        const auto decoded = moat::base64_decode(encoded);
        REQUIRE(decoded);
        CHECK(*decoded == part);
    }
    CHECK(moat::base64_encode("hi") == "aGk=");
    CHECK(moat::base64_decode("aG\nk=") == std::optional<std::string>("hi"));
    CHECK_FALSE(moat::base64_decode("a"));
    CHECK_FALSE(moat::base64_decode("aGk=="));
    CHECK_FALSE(moat::base64_decode("===="));
}

TEST_CASE("the background-process tools take a command and cwd, or an integer id of at least 1") {
    auto start =
        moat::parse_tool_arguments("start_process", R"({"command":"sleep 1","cwd":"srv"})");
    REQUIRE(start);
    CHECK(start->command == "sleep 1");
    CHECK(start->cwd == "srv");
    CHECK(moat::parse_tool_arguments("start_process", "{}").error().detail ==
          "command: required string is missing");
    CHECK(moat::parse_tool_arguments("list_processes", "").has_value());
    auto stop = moat::parse_tool_arguments("stop_process", R"({"id": 3})");
    REQUIRE(stop);
    CHECK(stop->id == 3);
    CHECK(moat::parse_tool_arguments("read_process_output", R"({"id": 2.0})")->id == 2);
    for (const char* bad : {R"({})", R"({"id": 0})", R"({"id": -1})", R"({"id": 1.5})",
                            R"({"id": "1"})", R"({"id": 1e12})"}) {
        auto parsed = moat::parse_tool_arguments("read_process_output", bad);
        REQUIRE_FALSE(parsed);
        CHECK(parsed.error().detail.rfind("id: ", 0) == 0);
    }
}
