// moat session exec / end / ls as a shell-based agent runs them: separate moat processes that
// name one key share one sandbox through the host-local store.
#include <doctest/doctest.h>

#include "support/build_paths.hpp"
#include "support/local_fixture.hpp"
#include "support/moat_cli.hpp"
#include "support/redis_server.hpp"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

using moat::test::cli_outcome;
using moat::test::moat_cli;

namespace {

// Runs a shell command line (several moat processes at once) and collects its output.
cli_outcome run_shell_line(const std::string& line) {
    FILE* pipe = ::popen(line.c_str(), "r");
    REQUIRE(pipe != nullptr);
    cli_outcome o;
    std::array<char, 4096> buffer{};
    std::size_t n;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
        o.output.append(buffer.data(), n);
    const int status = ::pclose(pipe);
    o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return o;
}

std::string store_dir() {
    char name[] = "/tmp/moat-session-store-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    return name;
}

std::size_t count_of(const std::string& text, const std::string& part) {
    std::size_t n = 0;
    for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
}

}  // namespace

namespace {

// Six concurrent `moat session exec` with one key, then ls, end, a second end and an unknown key,
// through the store that `store` (a --store flag) names.
void one_sandbox_per_key(const std::string& store, const std::string& key_suffix) {
    const std::string key = "cli-session-" + std::to_string(::getpid()) + "-" + key_suffix;
    const std::string exec = std::string(moat::test::moat_cli_path()) + " session exec " + store +
                             " " + key +
                             " -- sh -c 'echo $$ >> /workspace/log; cat /workspace/log | wc -l'";
    std::string line;
    for (int i = 0; i < 6; ++i) line += exec + " >/dev/null 2>&1 & ";
    line += "wait";
    REQUIRE(run_shell_line(line).exit_code == 0);

    // Six processes wrote into one sandbox's workspace.
    auto counted = moat_cli("session exec " + store + " " + key + " -- wc -l /workspace/log");
    CHECK(counted.exit_code == 0);
    CHECK(counted.output == "6 /workspace/log\n");
    auto listed = moat_cli("session ls");
    CHECK(listed.exit_code == 0);
    CHECK(count_of(listed.output, key + " ") == 1);
    // The sandbox carries the session's label.
    auto labelled = moat_cli("ls --label moat.session=" + key);
    CHECK(count_of(labelled.output, "sb-") == 1);

    auto ended = moat_cli("session end " + store + " " + key);
    CHECK(ended.exit_code == 0);
    CHECK(ended.output == "ended " + key + "\n");
    CHECK(count_of(moat_cli("ls --label moat.session=" + key).output, "sb-") == 0);
    auto again = moat_cli("session end " + store + " " + key);
    CHECK(again.exit_code == 4);
    CHECK(again.output.find("no session named") != std::string::npos);
    auto unknown = moat_cli("session end " + store + " never-used-" + key);
    CHECK(unknown.exit_code == 4);
}

}  // namespace

TEST_CASE(
    "concurrent moat session exec processes with one key share one sandbox, end confirms, an "
    "unknown key exits 4") {
    MOAT_REQUIRE_NAMESPACES();
    SUBCASE("through the host-local store") {
        one_sandbox_per_key("--store host:" + store_dir(), "host");
    }
    SUBCASE("through a Redis store") {
        moat::test::redis_server redis;
        one_sandbox_per_key("--store " + redis.unix_url(), "redis");
    }
}

TEST_CASE("moat session rejects bad input with one line and exit code 2") {
    for (const char* args :
         {"session", "session frob", "session exec", "session exec key",
          "session exec --bogus k -- true", "session end", "session end a b", "session ls extra",
          "session exec --store redis://user:secret@host:notaport k -- true"}) {
        const auto o = moat_cli(args);
        CHECK_MESSAGE(o.exit_code == 2, args);
        CHECK_MESSAGE(o.output.find("secret") == std::string::npos, args);
        CHECK_MESSAGE(o.output.rfind("moat", 0) == 0, args);
    }
}

namespace {

// One `moat mcp --session KEY` connection: initialize, one run_python call, and stdin closed once
// its answer is out (bounded: 60 s). Returns moat mcp's exit status line and the call's answer.
cli_outcome mcp_turn(const std::string& store, const std::string& key, const std::string& code) {
    const std::string script = R"(moat=$1; store=$2; key=$3; code=$4; out=$(mktemp)
{ printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}' \
    '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
    "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"run_python\",\"arguments\":{\"code\":\"$code\"}}}"
  i=0; while [ $i -lt 600 ] && ! grep -q '"id":2' "$out"; do sleep 0.1; i=$((i+1)); done
} | "$moat" mcp --session "$key" --store "$store" > "$out" 2>/dev/null
echo "exit $?"; grep '"id":2' "$out"; rm -f "$out")";
    char path[] = "/tmp/moat-mcp-turn-XXXXXX";
    const int fd = ::mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size()));
    ::close(fd);
    auto outcome =
        run_shell_line("sh " + std::string(path) + " " + std::string(moat::test::moat_cli_path()) +
                       " " + store + " " + key + " '" + code + "'");
    ::unlink(path);
    return outcome;
}

}  // namespace

TEST_CASE("moat mcp --session keeps its sandbox and Python state for the next connection") {
    MOAT_REQUIRE_NAMESPACES();
    const std::string store = "host:" + store_dir();
    const std::string key = "mcp-session-" + std::to_string(::getpid());
    const auto first = mcp_turn(store, key, "x = 41");
    CHECK(first.output.starts_with("exit 0\n"));
    CHECK(first.output.find(R"(\"status\":\"ok\")") != std::string::npos);
    // Between the connections the session's sandbox is there.
    CHECK(count_of(moat_cli("ls --label moat.session=" + key).output, "sb-") == 1);
    const auto second = mcp_turn(store, key, "print(x + 1)");
    CHECK(second.output.starts_with("exit 0\n"));
    CHECK_MESSAGE(second.output.find(R"(\"stdout\":\"42\\n\")") != std::string::npos,
                  second.output);
    const auto ended = moat_cli("session end --store " + store + " " + key);
    CHECK(ended.output == "ended " + key + "\n");
    CHECK(count_of(moat_cli("ls --label moat.session=" + key).output, "sb-") == 0);
}
