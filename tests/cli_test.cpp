// The moat CLI as a user runs it: exit codes, streaming, bad input.
#include <moat/version.hpp>

#include <doctest/doctest.h>

#include "support/build_paths.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"
#include "support/moat_cli.hpp"
#include "wire/state_layout.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

using moat::test::cli_outcome;
using moat::test::moat_cli;

}  // namespace

TEST_CASE("moat run streams the command's output and exits with its code") {
    MOAT_REQUIRE_NAMESPACES();
    auto o = moat_cli("run -- python3 -c \"print('hello from the sandbox'); raise SystemExit(7)\"");
    CHECK(o.exit_code == 7);
    CHECK(o.output == "hello from the sandbox\n");
    o = moat_cli("run --env GREETING=hi --workdir /tmp -- sh -c 'echo $GREETING; pwd'");
    CHECK(o.exit_code == 0);
    CHECK(o.output == "hi\n/tmp\n");
}

TEST_CASE("moat run exits 124 when the command passes its timeout") {
    MOAT_REQUIRE_NAMESPACES();
    const auto o = moat_cli("run --timeout 0.5 -- sleep 30");
    CHECK(o.exit_code == 124);
    CHECK(o.output.find("wall limit") != std::string::npos);
}

TEST_CASE("moat run --json prints one JSON object with the result") {
    MOAT_REQUIRE_NAMESPACES();
    const auto o = moat_cli("run --json -- sh -c 'echo out; echo err >&2; exit 2'");
    CHECK(o.exit_code == 2);
    CHECK(o.output.find("\"exit_code\":2") != std::string::npos);
    CHECK(o.output.find("\"stdout\":\"out\\n\"") != std::string::npos);
    CHECK(o.output.find("\"stderr\":\"err\\n\"") != std::string::npos);
    CHECK(o.output.find("\"timed_out\":false") != std::string::npos);
}

TEST_CASE("moat run rejects bad input with one line and an exit code below 124") {
    for (const char* args :
         {"run --timeout -1 -- true", "run --timeout abc -- true", "run --bogus -- true", "run",
          "run --memory 1 -- true", "run --pids 0 -- true", "run --env NOEQUALS -- true",
          "run --workdir relative -- true", "frobnicate"}) {
        const auto o = moat_cli(args);
        CHECK_MESSAGE(o.exit_code == 2, args);
        CHECK_MESSAGE(o.exit_code < 124, args);
        CHECK_MESSAGE(std::count(o.output.begin(), o.output.end(), '\n') == 1,
                      args << ": " << o.output);
        CHECK_MESSAGE(o.output.rfind("moat", 0) == 0, args);
    }
}

namespace {

// Runs the CLI with stdout alone captured (stderr passes through to the test's log).
cli_outcome moat_stdout(const std::string& args) {
    return moat_cli(args + " 2>/dev/null");
}

std::string last_line(const std::string& text) {
    std::string trimmed = text;
    while (!trimmed.empty() && trimmed.back() == '\n') trimmed.pop_back();
    const auto newline = trimmed.rfind('\n');
    return newline == std::string::npos ? trimmed : trimmed.substr(newline + 1);
}

// The host pid `moat ls --json` reports for `id`, or -1.
int listed_pid(const std::string& id) {
    const auto listed = moat_stdout("ls --json");
    const auto at = listed.output.find("\"id\":\"" + id + "\"");
    if (at == std::string::npos) return -1;
    const auto pid_at = listed.output.find("\"host_pid\":", at);
    if (pid_at == std::string::npos) return -1;
    return std::atoi(listed.output.c_str() + pid_at + 11);
}

std::string temporary_dir() {
    char name[] = "/tmp/moat-cli-test-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    return name;
}

void write_host_file(const std::string& path, const std::string& data) {
    std::ofstream out(path, std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

}  // namespace

TEST_CASE("every command answers --help with its usage, and moat --version names the versions") {
    for (const std::string command :
         {"run", "create", "exec", "port-forward", "session", "cp", "destroy", "ls", "inventory",
          "janitor", "smoke", "doctor", "bench", "mcp", "demo", "serve", "template", "network"}) {
        for (const std::string& ask : {command + " --help", command + " -h", "help " + command}) {
            const auto o = moat_stdout(ask);
            INFO(ask << ": " << o.output);
            CHECK(o.exit_code == 0);
            CHECK(o.output.starts_with("usage:\n  " + command));
            CHECK(o.output.find("exit codes:") != std::string::npos);
        }
    }
    // After a "--" a --help is the sandbox command's, not moat's.
    const auto passed = moat_stdout("exec sb-00000000000000000000 -- ls --help");
    CHECK(passed.exit_code == 4);
    CHECK(passed.output.find("usage:") == std::string::npos);
    const auto unknown = moat_cli("help frobnicate");
    CHECK(unknown.exit_code == 2);
    CHECK(unknown.output == "moat help: unknown command 'frobnicate' (see moat --help)\n");
    const auto version = moat_stdout("--version");
    CHECK(version.exit_code == 0);
    CHECK(version.output.starts_with("moat " + std::string(moat::version) +
                                     " (helper wire protocol "));
    CHECK(version.output.ends_with(")\n"));
}

TEST_CASE("moat create, exec, cp and destroy work on one sandbox from separate processes") {
    MOAT_REQUIRE_NAMESPACES();
    const auto created = moat_stdout("create --ttl 600 --label test=cli --env GREETING=hi");
    REQUIRE(created.exit_code == 0);
    const std::string id = last_line(created.output);
    REQUIRE(id.rfind("sb-", 0) == 0);
    const int pid = listed_pid(id);
    REQUIRE(pid > 0);
    CHECK(moat::test::is_running(pid));

    // Files persist across exec calls from separate processes; the spec's environment too.
    CHECK(moat_cli("exec " + id + " -- sh -c 'echo $GREETING > /workspace/note'").exit_code == 0);
    auto o = moat_cli("exec " + id + " -- cat /workspace/note");
    CHECK(o.exit_code == 0);
    CHECK(o.output == "hi\n");
    CHECK(moat_cli("exec " + id + " -- sh -c 'exit 9'").exit_code == 9);

    // Binary-safe copies in both directions: every byte value, then 300 KB of random data.
    const std::string dir = temporary_dir();
    std::string all_bytes;
    for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
    std::string random(300 * 1024, '\0');
    std::ifstream("/dev/urandom", std::ios::binary).read(random.data(), 300 * 1024);
    for (const auto& [name, data] : {std::pair{std::string("bytes.bin"), all_bytes},
                                     std::pair{std::string("random.bin"), random}}) {
        write_host_file(dir + "/" + name, data);
        CHECK(moat_cli("cp " + dir + "/" + name + " " + id + ":/workspace/").exit_code == 0);
        o = moat_cli("exec " + id + " -- sha256sum /workspace/" + name);
        CHECK(o.output.find("/workspace/" + name) != std::string::npos);
        CHECK(
            moat_cli("cp " + id + ":/workspace/" + name + " " + dir + "/back-" + name).exit_code ==
            0);
        CHECK(moat::test::read_file(dir + "/back-" + name) == data);
    }
    // --stdin feeds the CLI's stdin to the command.
    o = moat_cli("exec --stdin " + id + " -- wc -c < " + dir + "/bytes.bin");
    CHECK(o.exit_code == 0);
    CHECK(o.output == "256\n");
    // Into a host directory: the file keeps its name.
    CHECK(moat_cli("cp " + id + ":/workspace/note " + dir).exit_code == 0);
    CHECK(moat::test::read_file(dir + "/note") == "hi\n");
    std::filesystem::remove_all(dir);

    o = moat_stdout("ls");
    CHECK(o.output.find(id) != std::string::npos);
    CHECK(o.output.find("test=cli") != std::string::npos);

    o = moat_cli("destroy " + id);
    CHECK(o.exit_code == 0);
    CHECK(o.output == "destroyed " + id + "\n");
    CHECK_FALSE(moat::test::is_running(pid));
    CHECK(moat_stdout("ls").output.find(id) == std::string::npos);

    // Gone for good: one line, an exit code below 124.
    for (const std::string& args :
         {"exec " + id + " -- true", "destroy " + id, "cp " + id + ":/workspace/note -"}) {
        o = moat_cli(args);
        CHECK_MESSAGE(o.exit_code == 4, args);
        CHECK_MESSAGE(std::count(o.output.begin(), o.output.end(), '\n') == 1, o.output);
        CHECK(o.output.find("no sandbox with id") != std::string::npos);
    }
}

TEST_CASE("a sandbox from moat create ends at its TTL with no moat process alive" *
          moat::test::runs_alone) {
    MOAT_REQUIRE_NAMESPACES();
    const auto created = moat_stdout("create --ttl 1 --label test=cli-ttl");
    REQUIRE(created.exit_code == 0);
    const std::string id = last_line(created.output);
    const int pid = listed_pid(id);
    REQUIRE(pid > 0);
    // The CLI and its helper have exited; only the sandbox's pid 1 keeps the time.
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(pid); }));
    auto o = moat_cli("exec " + id + " -- true");
    CHECK(o.exit_code == 4);
    CHECK(o.output.find("TTL expired") != std::string::npos);
    // The next moat process that lists (or creates) sweeps what is proven dead: no janitor or
    // destroy is needed for the record, socket and cgroups to go.
    o = moat_stdout("ls --label test=cli-ttl");
    CHECK(o.output.find(id) == std::string::npos);
    CHECK(moat_cli("destroy " + id).exit_code == 4);
}

TEST_CASE("moat exec, cp and destroy reject bad ids and paths with one line below 124") {
    MOAT_REQUIRE_NAMESPACES();
    const struct {
        const char* args;
        int code;
    } cases[] = {
        {"exec sb-00000000000000000000 -- true", 4},
        {"exec not-an-id -- true", 4},
        {"exec", 2},
        {"exec sb-00000000000000000000", 2},
        {"cp sb-00000000000000000000:relative/path /tmp/x", 2},
        {"cp /tmp/a /tmp/b", 2},
        {"cp sb-00000000000000000000:/a sb-00000000000000000000:/b", 2},
        {"cp /nonexistent/file sb-00000000000000000000:/workspace/x", 3},
        {"destroy", 2},
        {"destroy sb-00000000000000000000", 4},
        {"create --ttl 0", 2},
        {"create --label novalue", 2},
        {"ls --bogus", 2},
    };
    for (const auto& c : cases) {
        const auto o = moat_cli(c.args);
        CHECK_MESSAGE(o.exit_code == c.code, c.args << ": " << o.output);
        CHECK_MESSAGE(std::count(o.output.begin(), o.output.end(), '\n') == 1,
                      c.args << ": " << o.output);
        CHECK_MESSAGE(o.output.rfind("moat", 0) == 0, c.args);
    }
}

TEST_CASE("moat doctor reports every isolation layer and passes its live check") {
    MOAT_REQUIRE_NAMESPACES();
    const auto o = moat_cli("doctor");
    CHECK_MESSAGE(o.exit_code == 0, o.output);
    for (const char* layer :
         {"user_ns", "pid_ns", "net_ns", "seccomp", "cgroup_memory", "cgroup_pids", "cgroup_cpu"}) {
        CHECK_MESSAGE(o.output.find(std::string(layer)) != std::string::npos, layer);
    }
    CHECK(o.output.find("MISSING") == std::string::npos);
    CHECK(o.output.find("destroy            ok") != std::string::npos);
}

TEST_CASE("SIGINT or SIGTERM to moat run kills the command, destroys the sandbox and exits 128+N") {
    MOAT_REQUIRE_NAMESPACES();
    for (const int sig : {SIGINT, SIGTERM}) {
        CAPTURE(sig);
        char arg0[] = "moat", arg1[] = "run", arg2[] = "--", arg3[] = "sleep", arg4[] = "1000";
        char* argv[] = {arg0, arg1, arg2, arg3, arg4, nullptr};
        pid_t cli = -1;
        REQUIRE(::posix_spawn(&cli, moat::test::moat_cli_path(), nullptr, nullptr, argv, environ) ==
                0);
        pid_t sleeper = -1;
        REQUIRE(moat::test::eventually(
            [&] {
                sleeper = moat::test::find_descendant(cli, "sleep 1000");
                return sleeper > 0;
            },
            std::chrono::seconds(20)));
        const auto family = moat::test::descendants(cli);
        REQUIRE(::kill(cli, sig) == 0);
        int status = 0;
        REQUIRE(::waitpid(cli, &status, 0) == cli);
        REQUIRE(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 128 + sig);
        for (const pid_t p : family) {
            CHECK(moat::test::eventually([&] { return !moat::test::is_running(p); }));
        }
    }
}

TEST_CASE("moat janitor cleans up after kill -9 and never touches a live, unexpired sandbox" *
          moat::test::runs_alone) {
    MOAT_REQUIRE_NAMESPACES();
    // Survivors: one live for ten minutes, one whose TTL passes. Created first: the first create
    // or list of a moat process sweeps what is proven dead (the next two cases), so between
    // their deaths and the janitor no moat process here creates or lists.
    const std::string live = last_line(moat_stdout("create --ttl 600 --label test=janitor").output);
    const std::string expired =
        last_line(moat_stdout("create --ttl 8 --label test=janitor").output);
    const int live_pid = listed_pid(live);
    const int expired_pid = listed_pid(expired);
    REQUIRE(live_pid > 0);
    REQUIRE(expired_pid > 0);
    // A process holding a sandbox is killed with -9: its record and cgroups stay behind.
    char arg0[] = "moat", arg1[] = "run", arg2[] = "--", arg3[] = "sleep", arg4[] = "1000";
    char* argv[] = {arg0, arg1, arg2, arg3, arg4, nullptr};
    pid_t crashed = -1;
    REQUIRE(::posix_spawn(&crashed, moat::test::moat_cli_path(), nullptr, nullptr, argv, environ) ==
            0);
    REQUIRE(moat::test::eventually(
        [&] { return moat::test::find_descendant(crashed, "sleep 1000") > 0; },
        std::chrono::seconds(20)));
    const auto listed_before = moat_stdout("ls --json --label moat.cli=run").output;
    const auto id_at = listed_before.find("\"id\":\"");
    REQUIRE(id_at != std::string::npos);
    const std::string stale = listed_before.substr(id_at + 6, 23);
    // The sweep at that list must have found the expired survivor still running (its TTL is 8 s).
    REQUIRE(moat::test::is_running(expired_pid));
    ::kill(crashed, SIGKILL);
    int status = 0;
    ::waitpid(crashed, &status, 0);

    CHECK(moat::test::eventually([&] { return !moat::test::is_running(expired_pid); },
                                 std::chrono::seconds(20)));
    // A process holding the live survivor (a command in it) is killed with -9: its command dies
    // with its connection, the survivor stays.
    std::string exec_id = live;
    char e0[] = "moat", e1[] = "exec", e3[] = "--", e4[] = "sleep", e5[] = "999";
    char* exec_argv[] = {e0, e1, exec_id.data(), e3, e4, e5, nullptr};
    pid_t holder = -1;
    REQUIRE(::posix_spawn(&holder, moat::test::moat_cli_path(), nullptr, nullptr, exec_argv,
                          environ) == 0);
    pid_t held = -1;
    REQUIRE(moat::test::eventually([&] {
        held = moat::test::find_descendant(live_pid, "sleep 999");
        return held > 0;
    }));
    ::kill(holder, SIGKILL);
    ::waitpid(holder, &status, 0);
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(held); }));
    CHECK(moat::test::is_running(live_pid));
    // An orphaned sandbox cgroup (a helper killed between mkdir and the record).
    const std::string live_cgroup = moat::test::cgroup_dir(live_pid, "pids");
    const std::string orphan =
        live_cgroup.substr(0, live_cgroup.rfind('/')) + "/sb-00000000000000000001";
    REQUIRE(::mkdir(orphan.c_str(), 0755) == 0);
    // Older than the janitor's grace (a younger one may be a create under way: the next one).
    timespec two_minutes_ago[2] = {};
    two_minutes_ago[0].tv_sec = two_minutes_ago[1].tv_sec = ::time(nullptr) - 120;
    REQUIRE(::utimensat(AT_FDCWD, orphan.c_str(), two_minutes_ago, 0) == 0);
    const std::string young_orphan =
        live_cgroup.substr(0, live_cgroup.rfind('/')) + "/sb-00000000000000000002";
    REQUIRE(::mkdir(young_orphan.c_str(), 0755) == 0);

    // A dry run says what it would do and changes nothing.
    auto dry = moat_cli("janitor --dry-run");
    CHECK(dry.exit_code == 0);
    CHECK(dry.output.find("would destroy " + stale) != std::string::npos);
    CHECK(dry.output.find("would destroy " + expired) != std::string::npos);
    CHECK(dry.output.find(live) == std::string::npos);
    CHECK(dry.output.find("would remove_cgroup " + orphan) != std::string::npos);
    CHECK(::access(moat::wire::record_path("/run/moat", stale).c_str(), F_OK) == 0);
    CHECK(::access(orphan.c_str(), F_OK) == 0);

    auto done = moat_cli("janitor");
    CHECK_MESSAGE(done.exit_code == 0, done.output);
    CHECK(done.output.find("destroy: done " + stale) != std::string::npos);
    CHECK(done.output.find("destroy: done " + expired) != std::string::npos);
    const auto after = moat_stdout("ls").output;
    CHECK(after.find(stale) == std::string::npos);
    CHECK(after.find(expired) == std::string::npos);
    CHECK(after.find(live) != std::string::npos);
    CHECK(moat::test::is_running(live_pid));
    CHECK(::access(orphan.c_str(), F_OK) != 0);
    CHECK(done.output.find(young_orphan) == std::string::npos);
    CHECK(::rmdir(young_orphan.c_str()) == 0);
    // Nothing left to do.
    CHECK(moat_cli("janitor").output.find(stale) == std::string::npos);
    CHECK(moat_cli("destroy " + live).exit_code == 0);
}

TEST_CASE("moat inventory shows usage and moat smoke passes") {
    MOAT_REQUIRE_NAMESPACES();
    const std::string id = last_line(moat_stdout("create --ttl 60 --label test=inventory").output);
    auto o = moat_stdout("inventory --json --label test=inventory");
    CHECK(o.exit_code == 0);
    CHECK(o.output.find(id) != std::string::npos);
    CHECK(o.output.find("\"memory_used_bytes\":null") == std::string::npos);
    CHECK(o.output.find("\"pids_current\":1") != std::string::npos);
    CHECK(o.output.find("\"owner_instance\":\"") != std::string::npos);
    CHECK(o.output.find("\"cpu_time_us\":null") == std::string::npos);
    CHECK(o.output.find("\"cpu_time_us\":") != std::string::npos);
    CHECK(o.output.find("\"disk_total_bytes\":null") == std::string::npos);
    // A file written in the workspace shows in the disk's use.
    REQUIRE(
        moat_cli("exec " + id + " -- sh -c 'head -c 3000000 /dev/zero > /workspace/f'").exit_code ==
        0);
    auto filled = moat_stdout("inventory --json --label test=inventory");
    const auto at = filled.output.find("\"disk_used_bytes\":");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoull(filled.output.substr(at + 18)) >= 3000000);
    auto table = moat_stdout("inventory --label test=inventory");
    CHECK(table.output.find(" CPU ") != std::string::npos);
    CHECK(table.output.find(" DISK ") != std::string::npos);
    CHECK(moat_cli("destroy " + id).exit_code == 0);
    const auto smoke = moat_cli("smoke");
    CHECK_MESSAGE(smoke.exit_code == 0, smoke.output);
    CHECK(smoke.output.find("all checks passed") != std::string::npos);
}

// A load test (2 million requests, two minutes under ASan): the dev build only, like the soak.
// The sanitizers see the same read and write paths in every other moat mcp test.
#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("moat mcp stops reading a client that does not read its responses, then serves all" *
          moat::test::shares_host) {
    // 2 million pings: 84 MB of requests and 120 MB of responses if nothing pushed back.
    constexpr std::size_t requests = 2'000'000;
    int to_server[2];
    int from_server[2];
    REQUIRE(::pipe2(to_server, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(from_server, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_server[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_server[1], 1);
    std::string program = moat::test::moat_cli_path();
    std::string command = "mcp";
    char* argv[] = {program.data(), command.data(), nullptr};
    pid_t server = -1;
    REQUIRE(::posix_spawn(&server, program.c_str(), &actions, nullptr, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(to_server[0]);
    ::close(from_server[1]);
    // The server's own footprint once it has answered one request: what the flood may add is
    // bounded below.
    const std::string first = R"({"jsonrpc":"2.0","id":0,"method":"ping"})"
                              "\n";
    REQUIRE(::write(to_server[1], first.data(), first.size()) ==
            static_cast<ssize_t>(first.size()));
    for (char c = 0; c != '\n';) REQUIRE(::read(from_server[0], &c, 1) == 1);
    const long baseline = moat::test::resident_bytes(server);
    REQUIRE(baseline > 0);

    std::atomic<std::size_t> written{0};
    std::thread writer([&] {
        const std::string line = R"({"jsonrpc":"2.0","id":1,"method":"ping"})"
                                 "\n";
        std::string batch;
        for (int i = 0; i < 1000; ++i) batch += line;
        for (std::size_t sent = 0; sent < requests; sent += 1000) {
            std::string_view rest = batch;
            while (!rest.empty()) {
                const ssize_t n = ::write(to_server[1], rest.data(), rest.size());
                if (n <= 0) break;
                rest.remove_prefix(static_cast<std::size_t>(n));
            }
            if (!rest.empty()) break;
            written += 1000;
        }
        ::close(to_server[1]);
    });
    // Wait until the writer stalls: the server has stopped reading.
    std::size_t last = 0;
    int still = 0;
    for (int i = 0; i < 600 && still < 5 && written < requests; ++i) {
        ::usleep(100'000);
        still = written == last ? still + 1 : 0;
        last = written;
    }
    CHECK(written < requests);
    const long rss = moat::test::resident_bytes(server);
    CHECK(rss > 0);
    // Without the cap it holds over 200 MB more than at its start.
    constexpr long bound = 96L << 20;
    CHECK(rss - baseline < bound);
    CHECK(rss < bound);

    std::size_t responses = 0;
    std::array<char, 1 << 16> buffer{};
    for (;;) {
        const ssize_t n = ::read(from_server[0], buffer.data(), buffer.size());
        if (n <= 0) break;
        responses += static_cast<std::size_t>(std::count(buffer.data(), buffer.data() + n, '\n'));
    }
    writer.join();
    ::close(from_server[0]);
    int status = 0;
    REQUIRE(::waitpid(server, &status, 0) == server);
    CHECK(responses == requests);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}
#endif

namespace {

// Runs `moat args` with stdout and stderr on a pseudo-terminal (script(1) allocates it and copies
// to its own stdout what the terminal received), or on a pipe when `on_terminal` is false.
std::string terminal_output(const std::string& args, bool on_terminal = true) {
    const std::string command = std::string(moat::test::moat_cli_path()) + " " + args;
    std::string quoted = "'";
    for (const char c : command) {
        if (c == '\'') {
            quoted += "'\\''";
        } else {
            quoted += c;
        }
    }
    quoted += "'";
    const std::string line =
        on_terminal ? "script -qec " + quoted + " /dev/null </dev/null" : command + " 2>&1";
    FILE* pipe = ::popen(line.c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::string out;
    std::array<char, 4096> buffer{};
    std::size_t n;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
        out.append(buffer.data(), n);
    ::pclose(pipe);
    return out;
}

}  // namespace

TEST_CASE(
    "escape sequences from a sandbox never reach the host terminal unless --raw, and pass "
    "unchanged into a pipe") {
    MOAT_REQUIRE_NAMESPACES();
    // OSC 52 (clipboard), OSC 0 (title), CSI 2J (clear), on stdout and stderr.
    const std::string hostile =
        "-- sh -c \"printf 'clip\\033]52;c;aGk=\\007 clear\\033[2J\\n'; "
        "printf 'title\\033]0;owned\\007\\n' >&2\"";
    const auto shown = terminal_output("run " + hostile);
    CHECK(shown.find('\x1b') == std::string::npos);
    CHECK(shown.find('\x07') == std::string::npos);
    CHECK(shown.find("clip^[]52;c;aGk=^G clear^[[2J") != std::string::npos);
    CHECK(shown.find("title^[]0;owned^G") != std::string::npos);
    const auto raw = terminal_output("run --raw " + hostile);
    CHECK(raw.find("\x1b]52;c;aGk=\x07") != std::string::npos);
    const auto piped = terminal_output("run " + hostile, false);
    CHECK(piped.find("\x1b]52;c;aGk=\x07") != std::string::npos);
    CHECK(piped.find("\x1b]0;owned\x07") != std::string::npos);

    const auto created = moat_stdout("create --ttl 120 --label test=cli");
    REQUIRE(created.exit_code == 0);
    const std::string id = last_line(created.output);
    CHECK(
        moat_cli("exec " + id + " -- sh -c \"printf 'file\\033]52;c;aGk=\\007\\n' > /workspace/e\"")
            .exit_code == 0);
    const auto exec_shown = terminal_output("exec " + id + " -- cat /workspace/e");
    CHECK(exec_shown.find('\x1b') == std::string::npos);
    CHECK(exec_shown.find("file^[]52;c;aGk=^G") != std::string::npos);
    CHECK(terminal_output("exec --raw " + id + " -- cat /workspace/e").find('\x1b') !=
          std::string::npos);
    const auto cp_shown = terminal_output("cp " + id + ":/workspace/e -");
    CHECK(cp_shown.find('\x1b') == std::string::npos);
    CHECK(cp_shown.find("file^[]52;c;aGk=^G") != std::string::npos);
    CHECK(terminal_output("cp --raw " + id + ":/workspace/e -").find('\x1b') != std::string::npos);
    CHECK(terminal_output("cp " + id + ":/workspace/e -", false) == "file\x1b]52;c;aGk=\x07\n");
    CHECK(moat_cli("destroy " + id).exit_code == 0);
}

TEST_CASE(
    "moat serve refuses to start without an API key, or off loopback without TLS, in one line") {
    const std::string key_file = "/tmp/moat-serve-cli-test-key-" + std::to_string(::getpid());
    {
        std::ofstream out(key_file);
        out << "e2b_0123456789abcdef0123456789abcdef01234567\n";
    }
    const std::string key = "--api-key-file " + key_file;
    const std::pair<const char*, std::string> cases[] = {
        {"no key", "env -u MOAT_API_KEY"},
        {"empty key", "env MOAT_API_KEY="},
    };
    for (const auto& [what, prefix] : cases) {
        const auto o = moat_cli(prefix, "serve --listen 127.0.0.1:0 --envd-listen 127.0.0.1:0");
        CHECK_MESSAGE(o.exit_code == 2, what);
        CHECK_MESSAGE(std::count(o.output.begin(), o.output.end(), '\n') == 1,
                      what << ": " << o.output);
        CHECK_MESSAGE(o.output.find("no API key") != std::string::npos, what << ": " << o.output);
    }
    for (const std::string& args :
         std::vector<std::string>{"serve --listen 0.0.0.0:0 --envd-listen 127.0.0.1:0 " + key,
                                  "serve --listen 127.0.0.1:0 --envd-listen 0.0.0.0:0 " + key,
                                  "serve --listen [::]:0 --envd-listen 127.0.0.1:0 " + key}) {
        const auto o = moat_cli(args);
        CHECK_MESSAGE(o.exit_code == 2, args);
        CHECK_MESSAGE(std::count(o.output.begin(), o.output.end(), '\n') == 1,
                      args << ": " << o.output);
        CHECK_MESSAGE(o.output.find("without TLS") != std::string::npos, args << ": " << o.output);
    }
    for (const std::string& args : std::vector<std::string>{
             "serve --listen nonsense " + key, "serve --max-sandboxes 0 " + key,
             "serve --tls-cert /nonexistent " + key,
             std::string("serve --api-key-file /nonexistent"), "serve --bogus " + key}) {
        const auto o = moat_cli(args);
        CHECK_MESSAGE(o.exit_code == 2, args);
        CHECK_MESSAGE(std::count(o.output.begin(), o.output.end(), '\n') == 1,
                      args << ": " << o.output);
    }
    ::unlink(key_file.c_str());
}

TEST_CASE(
    "moat mcp logs why a tool was unavailable on stderr, never the API key, as MOAT_LOG says") {
    const auto bad = moat_cli("MOAT_LOG=loud", "mcp < /dev/null");
    CHECK(bad.exit_code == 2);
    CHECK(std::count(bad.output.begin(), bad.output.end(), '\n') == 1);
    CHECK_MESSAGE(bad.output.find("'loud'") != std::string::npos, bad.output);

    // A fleet nobody listens on (port 1 of loopback): the model gets "unavailable", the
    // operator's stderr gets the cause, and the key appears in neither. The client keeps its
    // end open until the call's answer is out (bounded): at EOF moat mcp stops its calls.
    const std::string key = "e2b_k3y_that_must_never_be_printed";
    const auto dir =
        std::filesystem::temp_directory_path() / ("moat-mcp-log-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const auto script = dir / "client.sh";
    std::ofstream(script) << R"(moat=$1; out=$(mktemp); err=$(mktemp)
{ cat <<'END'
{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_shell","arguments":{"command":"true"}}}
END
i=0; while [ $i -lt 600 ] && ! grep -q '"id":2' "$out"; do sleep 0.1; i=$((i+1)); done
} | "$moat" mcp --backend e2b > "$out" 2> "$err"
echo "exit $?"; cat "$out" "$err"; rm -f "$out" "$err"
)";
    const std::string env = "E2B_API_KEY=" + key + " E2B_API_URL=http://127.0.0.1:1 " +
                            "E2B_SANDBOX_URL=http://127.0.0.1:1";
    for (const std::string level : {"", "MOAT_LOG=warning", "MOAT_LOG=off"}) {
        const auto o = moat_cli(env + " " + level + " sh " + script.string(), "");
        INFO(level << ": " << o.output);
        CHECK(o.output.rfind("exit 0\n", 0) == 0);
        CHECK(o.output.find(R"(\"status\":\"unavailable\")") != std::string::npos);
        const bool logged =
            o.output.find("moat mcp: warning [tools] run_shell: ") != std::string::npos;
        CHECK(logged == (level != "MOAT_LOG=off"));
        CHECK(o.output.find(key) == std::string::npos);
    }
    std::filesystem::remove_all(dir);
}
