// Running commands: exit codes, wall limits, output caps and volume, stdin, resource limits,
// background children. Process presence is always checked on the host by host pid.
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <moat/with_timeout.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>

#include <csignal>
#include <sstream>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

struct stream_summary {
    std::uint64_t out_bytes = 0;
    std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over stdout
    std::uint64_t err_bytes = 0;
    std::optional<moat::exec_result> result;
    std::optional<moat::error> failure;
};

void fnv1a(std::uint64_t& h, std::string_view data) {
    for (const unsigned char c : data) {
        h ^= c;
        h *= 1099511628211ull;
    }
}

asio::awaitable<stream_summary> drain(moat::backend& b, std::string id, moat::exec_request request,
                                      long* peak_rss) {
    stream_summary s;
    auto stream = co_await b.async_exec_stream(std::move(id), std::move(request));
    if (!stream) {
        s.failure = stream.error();
        co_return s;
    }
    for (;;) {
        auto next = co_await stream->async_next();
        if (!next) {
            s.failure = next.error();
            co_return s;
        }
        if (auto* chunk = std::get_if<moat::output_chunk>(&*next)) {
            if (chunk->channel == moat::output_channel::out) {
                s.out_bytes += chunk->data.size();
                fnv1a(s.hash, chunk->data);
            } else {
                s.err_bytes += chunk->data.size();
            }
            if (peak_rss != nullptr) *peak_rss = std::max(*peak_rss, moat::test::resident_bytes());
            continue;
        }
        s.result = std::get<moat::exec_result>(std::move(*next));
        co_return s;
    }
}

// Reads the stream until stdout contains `marker`, then keeps the stream for the caller.
asio::awaitable<moat::result<moat::exec_stream>> start_until(moat::backend& b, std::string id,
                                                             std::string shell,
                                                             std::string marker) {
    moat::exec_request request;
    request.shell = std::move(shell);
    auto stream = co_await b.async_exec_stream(std::move(id), std::move(request));
    if (!stream) co_return std::move(stream).error();
    std::string seen;
    while (seen.find(marker) == std::string::npos) {
        auto next = co_await stream->async_next();
        if (!next) co_return std::move(next).error();
        auto* chunk = std::get_if<moat::output_chunk>(&*next);
        if (chunk == nullptr)
            co_return moat::make_error(moat::errc::backend_failure, "ended early");
        seen += chunk->data;
    }
    co_return std::move(*stream);
}

asio::awaitable<stream_summary> finish(moat::exec_stream stream) {
    stream_summary s;
    for (;;) {
        auto next = co_await stream.async_next();
        if (!next) {
            s.failure = next.error();
            co_return s;
        }
        if (std::holds_alternative<moat::exec_result>(*next)) {
            s.result = std::get<moat::exec_result>(std::move(*next));
            co_return s;
        }
    }
}

std::uint64_t pids_max_events(pid_t init) {
    std::istringstream in(
        moat::test::read_file(moat::test::cgroup_dir(init, "pids") + "/pids.events"));
    std::string key;
    std::uint64_t value = 0;
    while (in >> key >> value) {
        if (key == "max") return value;
    }
    return 0;
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture, "exit codes, stdout and stderr come back separately") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const auto r = sh(box.id, "echo to-out; echo to-err >&2; exit 3");
    CHECK(r.exit_code == 3);
    CHECK(r.signal == 0);
    CHECK_FALSE(r.timed_out);
    CHECK(r.out.text() == "to-out\n");
    CHECK(r.err.text() == "to-err\n");
    CHECK(r.duration > 0us);

    moat::exec_request argv_request;
    argv_request.argv = {"printf", "%s|", "a b", "$HOME"};  // no shell: no expansion
    const auto direct = run(local->async_exec(box.id, argv_request));
    REQUIRE(direct);
    CHECK(direct->out.text() == "a b|$HOME|");

    moat::exec_request missing;
    missing.argv = {"no-such-program"};
    const auto not_found = run(local->async_exec(box.id, missing));
    REQUIRE(not_found);
    CHECK(not_found->exit_code == 127);
    CHECK(not_found->err.text().find("no-such-program") != std::string::npos);
    destroy(box.id);
}

// pid 1 searches PATH itself (its command child shares pid 1's memory and must not set
// `environ`): the same entries, order and errors as execvp.
TEST_CASE_FIXTURE(local_fixture, "argv[0] is looked up in the request's PATH as execvp would") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const auto setup = sh(box.id,
                          "mkdir -p /tmp/denied /tmp/found /tmp/plain /tmp/first && "
                          "touch /tmp/file && "
                          "printf '#!/bin/sh\\necho denied\\n' > /tmp/denied/tool && "
                          "printf '#!/bin/sh\\necho found \"$@\"\\n' > /tmp/found/tool && "
                          "printf '#!/bin/sh\\necho first\\n' > /tmp/first/tool && "
                          "printf 'echo plain \"$@\"\\n' > /tmp/plain/tool && "
                          "chmod 644 /tmp/denied/tool && chmod 755 /tmp/found/tool "
                          "/tmp/first/tool /tmp/plain/tool");
    REQUIRE(setup.exit_code == 0);
    const auto exec = [&](std::vector<std::string> argv, std::string path, std::string cwd = {}) {
        moat::exec_request request;
        request.argv = std::move(argv);
        request.env["PATH"] = std::move(path);
        request.cwd = std::move(cwd);
        auto r = run(local->async_exec(box.id, request));
        REQUIRE(r);
        return *r;
    };
    // Missing, not a directory, not executable (remembered), then found: the found one runs
    // with its arguments, and an entry after it is never tried.
    const auto found =
        exec({"tool", "a", "b c"}, "/tmp/missing:/tmp/file:/tmp/denied:/tmp/found:/tmp/first");
    CHECK(found.exit_code == 0);
    CHECK(found.out.text() == "found a b c\n");
    // Only a file that may not run: EACCES, not the ENOENT of the entries after it.
    const auto denied = exec({"tool"}, "/tmp/denied:/tmp/missing");
    CHECK(denied.exit_code == 126);
    CHECK(denied.err.text() == "moat: cannot run 'tool': Permission denied\n");
    // Otherwise the last entry's error.
    const auto missing = exec({"tool"}, "/tmp/file:/tmp/missing");
    CHECK(missing.exit_code == 127);
    CHECK(missing.err.text() == "moat: cannot run 'tool': No such file or directory\n");
    const auto not_directory = exec({"tool"}, "/tmp/missing:/tmp/file");
    CHECK(not_directory.err.text() == "moat: cannot run 'tool': Not a directory\n");
    // A script without #! runs with /bin/sh, its arguments after it.
    const auto plain = exec({"tool", "x", "y"}, "/tmp/plain");
    CHECK(plain.out.text() == "plain x y\n");
    // An empty entry is the working directory; a name with a slash is not searched.
    const auto here = exec({"tool"}, "/tmp/missing::/tmp/first", "/tmp/found");
    CHECK(here.out.text() == "found\n");
    const auto relative = exec({"./tool"}, "/tmp/first", "/tmp/found");
    CHECK(relative.out.text() == "found\n");
    const auto long_name = exec({std::string(300, 'n')}, "/tmp/found");
    CHECK(long_name.err.text().find("File name too long") != std::string::npos);

    // Close to the record's cap: every argument and the environment arrive intact.
    std::vector<std::string> many = {"sh", "-c", "echo $# ${#BIG} $1 ${600}", "sh"};
    for (int i = 1; i <= 600; ++i) many.push_back(std::to_string(i) + std::string(150, 'a'));
    moat::exec_request large;
    large.argv = many;
    large.env["BIG"] = std::string(20000, 'b');
    const auto big = run(local->async_exec(box.id, large));
    REQUIRE(big);
    CHECK(big->out.text() ==
          "600 20000 1" + std::string(150, 'a') + " 600" + std::string(150, 'a') + "\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "stdin bytes reach the program and then end") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    moat::exec_request request;
    request.argv = {"wc", "-c"};
    request.stdin_data = std::string(200000, 'z');
    const auto r = run(local->async_exec(box.id, request));
    REQUIRE(r);
    CHECK(r->out.text() == "200000\n");
    request.stdin_data.clear();
    request.argv = {"cat"};
    const auto empty = run(local->async_exec(box.id, request));
    REQUIRE(empty);
    CHECK(empty->out.text().empty());
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "a busy loop ends at the wall limit with 124 and nothing left") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const pid_t init = *box.host_pid;
    moat::exec_request request;
    request.argv = {"python3", "-c", "print('looping', flush=True)\nwhile True: pass"};
    request.wall_limit = 1500ms;
    auto started = run(local->async_exec_stream(box.id, request));
    REQUIRE(started);
    pid_t python = -1;
    CHECK(moat::test::eventually([&] {
        python = moat::test::find_descendant(init, "while True");
        return python > 0;
    }));
    CHECK(moat::test::is_running(python));
    const auto s = run(finish(std::move(*started)));
    REQUIRE(s.result);
    CHECK(s.result->timed_out);
    CHECK(s.result->exit_code == 124);
    CHECK(s.result->signal == SIGKILL);
    CHECK(moat::test::eventually([&] { return moat::test::is_gone(python); }));
    CHECK(sh(box.id, "echo still-usable").out.text() == "still-usable\n");
    destroy(box.id);
}

namespace {

asio::awaitable<moat::result<std::variant<moat::output_chunk, moat::exec_result>>> next_within(
    moat::exec_stream& stream, std::chrono::milliseconds limit) {
    co_return co_await moat::with_timeout(stream.async_next(), moat::deadline::after(limit));
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a deadline on a running exec kills the process and keeps the sandbox") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const pid_t init = *box.host_pid;
    auto stream = run(start_until(*local, box.id, "echo started; exec sleep 1000", "started"));
    REQUIRE(stream);
    pid_t sleeper = -1;
    CHECK(moat::test::eventually([&] {
        sleeper = moat::test::find_descendant(init, "sleep 1000");
        return sleeper > 0;
    }));
    CHECK(moat::test::is_running(sleeper));
    const auto next = run(next_within(*stream, 200ms));
    REQUIRE_FALSE(next);
    CHECK(next.error().code == moat::errc::deadline_exceeded);
    CHECK(moat::test::eventually([&] { return moat::test::is_gone(sleeper); }));
    CHECK(sh(box.id, "echo still-ready").out.text() == "still-ready\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "cancelling the caller kills the command and reports cancelled") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const pid_t init = *box.host_pid;
    moat::exec_request request;
    request.shell = "sleep 1000";
    asio::cancellation_signal cancel;
    std::optional<stream_summary> outcome;
    asio::co_spawn(io, drain(*local, box.id, request, nullptr),
                   asio::bind_cancellation_slot(
                       cancel.slot(), [&outcome](std::exception_ptr e, stream_summary s) {
                           if (e) {
                               try {
                                   std::rethrow_exception(e);
                               } catch (const std::exception& x) {
                                   FAIL("the exec coroutine threw: " << std::string(x.what()) << " "
                                                                     << typeid(x).name());
                               }
                           }
                           outcome = std::move(s);
                       }));
    pid_t sleeper = -1;
    const auto limit = std::chrono::steady_clock::now() + 20s;
    while (sleeper < 0 && std::chrono::steady_clock::now() < limit) {
        io.run_one_for(10ms);
        sleeper = moat::test::find_descendant(init, "sleep 1000");
    }
    REQUIRE(sleeper > 0);
    CHECK(moat::test::is_running(sleeper));
    cancel.emit(asio::cancellation_type::terminal);
    while (!outcome && std::chrono::steady_clock::now() < limit) io.run_one_for(10ms);
    REQUIRE(outcome);
    REQUIRE(outcome->failure);
    CHECK(outcome->failure->code == moat::errc::cancelled);
    CHECK(moat::test::eventually([&] { return moat::test::is_gone(sleeper); }));
    CHECK(sh(box.id, "echo still-ready").out.text() == "still-ready\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "background children die with their command" * moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const pid_t init = *box.host_pid;
    auto stream = run(start_until(
        *local, box.id, "sleep 1000 & setsid sleep 1001 & echo ready; sleep 0.3", "ready"));
    REQUIRE(stream);
    pid_t child = -1, escaped = -1;
    CHECK(moat::test::eventually([&] {
        child = moat::test::find_descendant(init, "sleep 1000");
        escaped = moat::test::find_descendant(init, "sleep 1001");
        return child > 0 && escaped > 0;
    }));
    CHECK(moat::test::is_running(child));
    CHECK(moat::test::is_running(escaped));
    const auto s = run(finish(std::move(*stream)));
    REQUIRE(s.result);
    CHECK(s.result->exit_code == 0);
    CHECK(moat::test::eventually([&] { return moat::test::is_gone(child); }));
    CHECK(moat::test::eventually([&] { return moat::test::is_gone(escaped); }));
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "output beyond the cap keeps head and tail with the omitted count") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // 5 MiB of numbered lines: far over the 1 MiB kept per stream.
    const auto r = sh(box.id, "seq 1 700000; echo END-OF-OUTPUT");
    CHECK(r.exit_code == 0);
    CHECK(r.out.is_truncated());
    CHECK(r.out.head.size() == 512 * 1024);
    CHECK(r.out.tail.size() == 512 * 1024);
    CHECK(r.out.head.substr(0, 6) == "1\n2\n3\n");
    CHECK(r.out.tail.ends_with("700000\nEND-OF-OUTPUT\n"));
    CHECK(r.out.total_bytes == r.out.head.size() + r.out.tail.size() + r.out.omitted_bytes);
    CHECK(r.out.total_bytes > 4'000'000);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "300 MB of output reaches a streaming consumer whole while host RSS stays flat") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    constexpr std::uint64_t total = 300ull * 1000 * 1000;
    // Deterministic content: the same pattern computed here.
    std::string line;
    for (int i = 0; i < 99; ++i) line += static_cast<char>('a' + i % 26);
    line += '\n';
    REQUIRE(line.size() == 100);
    std::uint64_t expected = 1469598103934665603ull;
    for (std::uint64_t i = 0; i < total / line.size(); ++i) fnv1a(expected, line);

    moat::exec_request request;
    request.shell = "yes '" + line.substr(0, 99) + "' | head -c " + std::to_string(total);
    request.wall_limit = 300s;
    const long rss_before = moat::test::resident_bytes();
    long peak = rss_before;
    const auto s = run(drain(*local, box.id, request, &peak), 600s);
    REQUIRE(s.result);
    CHECK(s.result->exit_code == 0);
    CHECK(s.out_bytes == total);
    CHECK(s.hash == expected);
    CHECK(peak - rss_before < 64L * 1024 * 1024);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "a fork bomb hits the pids limit and the sandbox still works") {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.limits.pids = 64;
    const auto box = create(spec);
    const pid_t init = *box.host_pid;
    const auto before = pids_max_events(init);
    const auto r = sh(box.id, "bomb() { bomb | bomb & }; bomb; sleep 2", 3s);
    (void)r;
    CHECK(pids_max_events(init) > before);
    CHECK(moat::test::eventually([&] { return moat::test::descendants(init).empty(); }));
    CHECK(sh(box.id, "echo survived").out.text() == "survived\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a 2 GiB allocation is OOM-killed under 128 MB and succeeds under 4096 MB" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const std::string allocate =
        "python3 -c \"b = bytearray(2 * 1024**3)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
        "print('allocated')\"";
    moat::sandbox_spec small;
    small.limits.memory_bytes = 128ull << 20;
    const auto a = create(small);
    moat::exec_request direct;
    direct.argv = {"python3", "-c",
                   "b = bytearray(2 * 1024**3)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
                   "print('allocated')"};
    const auto killed = run(local->async_exec(a.id, direct));
    REQUIRE(killed);
    CHECK(killed->oom_killed);
    CHECK(killed->signal == SIGKILL);
    CHECK(killed->exit_code == 128 + SIGKILL);
    CHECK(killed->out.text().find("allocated") == std::string::npos);
    // Through a shell the kill shows as exit status 137; it is still reported as an OOM kill.
    const auto via_shell = sh(a.id, allocate);
    CHECK(via_shell.oom_killed);
    CHECK(via_shell.exit_code == 137);
    CHECK_FALSE(sh(a.id, "echo fine").oom_killed);
    // A later SIGKILL that is not the OOM killer's is not blamed on it.
    const auto plain_kill = sh(a.id, "kill -9 $$");
    CHECK(plain_kill.exit_code == 128 + SIGKILL);
    CHECK_FALSE(plain_kill.oom_killed);
    destroy(a.id);

    moat::sandbox_spec big;
    big.limits.memory_bytes = 4096ull << 20;
    const auto b = create(big);
    const auto fine = sh(b.id, allocate, 120s);
    CHECK_FALSE(fine.oom_killed);
    CHECK(fine.exit_code == 0);
    CHECK(fine.out.text() == "allocated\n");
    destroy(b.id);
}

TEST_CASE_FIXTURE(local_fixture, "filling /workspace gives ENOSPC inside") {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.limits.workspace_bytes = 16ull << 20;
    const auto box = create(spec);
    const auto r =
        sh(box.id, "dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1; df -k /workspace");
    CHECK(r.exit_code == 0);
    CHECK(r.out.text().find("No space left on device") != std::string::npos);
    CHECK(sh(box.id, "echo ok").out.text() == "ok\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "bad exec requests fail with invalid_argument naming the field") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    moat::exec_request empty;
    auto r = run(local->async_exec(box.id, empty));
    REQUIRE_FALSE(r);
    CHECK(r.error().code == moat::errc::invalid_argument);
    moat::exec_request negative;
    negative.shell = "true";
    negative.wall_limit = -1s;
    r = run(local->async_exec(box.id, negative));
    REQUIRE_FALSE(r);
    CHECK(r.error().detail.find("wall_limit") != std::string::npos);
    moat::exec_request relative;
    relative.shell = "true";
    relative.cwd = "workspace";
    r = run(local->async_exec(box.id, relative));
    REQUIRE_FALSE(r);
    CHECK(r.error().detail.find("cwd") != std::string::npos);
    r = run(local->async_exec("sb-00000000000000000000", negative));
    REQUIRE_FALSE(r);
    CHECK(r.error().code == moat::errc::sandbox_not_found);
    destroy(box.id);
}
