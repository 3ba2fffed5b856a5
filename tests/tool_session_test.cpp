// The model-facing tool layer on the real local backend: stateful Python cells, shell commands,
// files, artifacts, shaped results, the retry ceiling, rebuilds and cancellation.
#include <doctest/doctest.h>

#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include "support/local_fixture.hpp"

#include <unistd.h>
#include <cstdlib>
#include <string>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

bool has_notice(const moat::tool_result& r, const std::string& part) {
    for (const auto& n : r.notices)
        if (n.find(part) != std::string::npos) return true;
    return false;
}

// A runtime, a manager and one tool session on the fixture's backend.
struct tool_fixture : local_fixture {
    tool_fixture() : rt(*local), manager(rt, options()), tools(manager, "conversation") {}
    ~tool_fixture() { (void)run(manager.async_shutdown()); }

    static moat::manager_options options() {
        moat::manager_options o;
        o.spec.labels["test"] = "tools";
        return o;
    }

    moat::tool_result python(const std::string& code,
                             std::optional<std::chrono::milliseconds> timeout = {}) {
        auto r = run(tools.async_run_python(code, timeout));
        REQUIRE(r);
        seen += r->to_json();
        return *r;
    }
    moat::tool_result shell(const std::string& command,
                            std::optional<std::chrono::milliseconds> timeout = {}) {
        auto r = run(tools.async_run_shell(command, timeout));
        REQUIRE(r);
        seen += r->to_json();
        return *r;
    }
    moat::tool_result call(const std::string& tool, const std::string& arguments) {
        auto r = run(tools.async_call(tool, arguments));
        REQUIRE(r);
        seen += r->to_json();
        return *r;
    }

    moat::runtime rt;
    moat::session_manager manager;
    moat::tool_session tools;
    std::string seen;  // every result's JSON, for the no-host-details check
};

}  // namespace

TEST_CASE_FIXTURE(tool_fixture,
                  "python cells share one interpreter: variables persist, the pid stays, each "
                  "cell runs once and is saved") {
    MOAT_REQUIRE_NAMESPACES();
    auto first = python("x = 41");
    CHECK(first.status == moat::tool_status::ok);
    CHECK(first.exit_code == 0);
    CHECK(has_notice(first, "printed nothing"));
    CHECK(python("print(x + 1)").stdout_text == "42\n");
    CHECK(python("x * 2").stdout_text == "82\n");  // a final expression is shown
    const auto pid = python("import os\nos.getpid()").stdout_text;
    CHECK(python("os.getpid()").stdout_text == pid);
    python("open('/workspace/count.txt', 'a').write('x')");
    CHECK(shell("wc -c < /workspace/count.txt").stdout_text == "1\n");
    auto saved = call("read_file", R"({"path": "/workspace/.cells/001.py"})");
    CHECK(saved.content == "x = 41");
    auto both = python("import sys\nprint('out')\nprint('err', file=sys.stderr)");
    CHECK(both.stdout_text == "out\n");
    CHECK(both.stderr_text == "err\n");
}

TEST_CASE_FIXTURE(tool_fixture,
                  "a Python exception is an error result with its type, traceback and a hint, "
                  "and the variables survive it") {
    MOAT_REQUIRE_NAMESPACES();
    python("prices = {'apple': 3}");
    auto r = python("def total(d):\n    return d['price'] * 2\ntotal(prices)");
    CHECK(r.status == moat::tool_status::error);
    CHECK(r.exit_code == 1);
    CHECK(r.error_type == "KeyError");
    CHECK(r.traceback.find("Traceback (most recent call last):") != std::string::npos);
    CHECK(r.traceback.find("/workspace/.cells/002.py\", line 2, in total") != std::string::npos);
    CHECK(r.traceback.find("KeyError: 'price'") != std::string::npos);
    CHECK(r.traceback.find("<string>") == std::string::npos);     // no frames of the driver
    CHECK(r.stderr_text.find("Traceback") == std::string::npos);  // not twice
    CHECK(r.hint.find("keys") != std::string::npos);
    CHECK(python("print(prices)").stdout_text == "{'apple': 3}\n");
    auto syntax = python("x = (");
    CHECK(syntax.error_type == "SyntaxError");
    auto missing = python("import numpyy");
    CHECK(missing.error_type == "ModuleNotFoundError");
    CHECK(missing.hint.find("network") != std::string::npos);
    auto json = missing.to_json();
    CHECK(json.find("\"error_type\":\"ModuleNotFoundError\"") != std::string::npos);
}

TEST_CASE_FIXTURE(tool_fixture,
                  "a cell past its time limit or a crash restarts the interpreter and the result "
                  "says so") {
    MOAT_REQUIRE_NAMESPACES();
    python("import os\nkept = 1");
    const auto old_pid = python("os.getpid()").stdout_text;
    auto slow = python("while True:\n    pass", 1s);
    CHECK(slow.status == moat::tool_status::timeout);
    CHECK(slow.exit_code == 124);
    CHECK(has_notice(slow, "interpreter restarted"));
    CHECK(slow.message.find("1 s") != std::string::npos);
    // The old interpreter is gone, not merely abandoned.
    auto check = shell("kill -0 " + old_pid.substr(0, old_pid.size() - 1) +
                       " 2>/dev/null && echo alive || echo gone");
    CHECK(check.stdout_text == "gone\n");
    auto lost = python("print(kept)");
    CHECK(lost.error_type == "NameError");
    CHECK(python("import os\nos.getpid()").stdout_text != old_pid);

    auto exited = python("import os\nos._exit(3)");
    CHECK(exited.status == moat::tool_status::error);
    CHECK(exited.exit_code == 3);
    CHECK(has_notice(exited, "interpreter restarted"));
    auto segfault = python("import ctypes\nctypes.string_at(0)");
    CHECK(segfault.status == moat::tool_status::error);
    CHECK(segfault.message.find("SIGSEGV") != std::string::npos);
    CHECK(python("print('back')").stdout_text == "back\n");
}

TEST_CASE_FIXTURE(tool_fixture,
                  "long output reaches the model as head and tail with a marker, ANSI-free and "
                  "valid UTF-8") {
    MOAT_REQUIRE_NAMESPACES();
    auto big = python("print('\\x1b[31m' + 'é' * 200000 + '\\x1b[0m')");
    CHECK(big.status == moat::tool_status::ok);
    CHECK(big.stdout_text.size() < 7000 * 2);
    CHECK(big.stdout_text.find("characters omitted") != std::string::npos);
    CHECK(big.stdout_text.find('\x1b') == std::string::npos);
    CHECK(big.stdout_text.find("\xef\xbf\xbd") == std::string::npos);  // nothing was split
    auto flood = shell("yes line | head -c 5000000");
    CHECK(flood.stdout_text.size() < 7000);
    CHECK(flood.stdout_text.find("characters omitted") != std::string::npos);
}

TEST_CASE_FIXTURE(tool_fixture,
                  "run_shell reports exit codes, stderr, timeouts and a Python script's error "
                  "type") {
    MOAT_REQUIRE_NAMESPACES();
    auto failed = shell("echo hi; echo oops >&2; exit 3");
    CHECK(failed.status == moat::tool_status::error);
    CHECK(failed.exit_code == 3);
    CHECK(failed.stdout_text == "hi\n");
    CHECK(failed.stderr_text == "oops\n");
    auto slow = shell("sleep 30", 500ms);
    CHECK(slow.status == moat::tool_status::timeout);
    CHECK(slow.exit_code == 124);
    auto script = shell("printf 'import json\\njson.loads(\"{\")\\n' > bad.py && python3 bad.py");
    CHECK(script.error_type == "json.decoder.JSONDecodeError");
    auto missing = shell("no-such-tool --help");
    CHECK(missing.exit_code == 127);
    CHECK(missing.hint.find("not installed") != std::string::npos);
    auto harmless = shell("rm -rf / 2>/dev/null; echo done");
    CHECK(harmless.stdout_text == "done\n");
    CHECK(shell("ls /usr/bin/python3").status == moat::tool_status::ok);
}

TEST_CASE_FIXTURE(tool_fixture,
                  "file tools take relative paths, create parents and name the sandbox path in "
                  "errors") {
    MOAT_REQUIRE_NAMESPACES();
    auto wrote = call("write_file", R"({"path": "notes/a.txt", "content": "hello"})");
    CHECK(wrote.status == moat::tool_status::ok);
    CHECK(wrote.path == "/workspace/notes/a.txt");
    CHECK(wrote.bytes == 5);
    auto read = call("read_file", R"({"path": "/workspace/notes/a.txt"})");
    CHECK(read.content == "hello");
    auto listed = call("list_files", R"({"path": "/workspace/notes"})");
    REQUIRE(listed.entries.size() == 1);
    CHECK(listed.entries[0].name == "a.txt");
    CHECK(listed.entries[0].size == 5);
    auto missing = call("read_file", R"({"path": "/workspace/missing.txt"})");
    CHECK(missing.status == moat::tool_status::error);
    CHECK(missing.message.find("/workspace/missing.txt") != std::string::npos);
    auto root = call("write_file", R"({"path": "/usr/evil", "content": "x"})");
    CHECK(root.status == moat::tool_status::error);
    CHECK(root.message.find("/usr/evil") != std::string::npos);
    auto escape = call("read_file", R"({"path": "../../etc/shadow"})");
    CHECK(escape.status == moat::tool_status::error);
    auto everything = call("list_files", "{}");
    CHECK(everything.path == "/workspace");
    CHECK(everything.status == moat::tool_status::ok);
}

TEST_CASE_FIXTURE(tool_fixture,
                  "files under /workspace/out are listed as artifacts and read back as bytes") {
    MOAT_REQUIRE_NAMESPACES();
    auto r = python(
        "import os\nos.makedirs('/workspace/out/tables', exist_ok=True)\n"
        "open('/workspace/out/result.csv', 'w').write('a,b\\n1,2\\n')\n"
        "open('/workspace/out/tables/blob.bin', 'wb').write(bytes(range(256)))");
    REQUIRE(r.artifacts.size() == 2);
    CHECK(r.artifacts[0].path == "result.csv");
    CHECK(r.artifacts[0].size == 8);
    CHECK(r.artifacts[0].media_type == "text/csv");
    CHECK(r.artifacts[1].path == "tables/blob.bin");
    CHECK(r.artifacts[1].media_type == "application/octet-stream");
    auto bytes = run(tools.async_read_artifact("tables/blob.bin"));
    REQUIRE(bytes);
    REQUIRE(bytes->size() == 256);
    CHECK(static_cast<unsigned char>((*bytes)[255]) == 255);
    CHECK_FALSE(run(tools.async_read_artifact("../count.txt")));
    auto listed = run(tools.async_list_artifacts());
    REQUIRE(listed);
    CHECK(listed->size() == 2);
}

TEST_CASE_FIXTURE(tool_fixture,
                  "after three failed calls in a turn the result says stop, and a new turn "
                  "starts over") {
    MOAT_REQUIRE_NAMESPACES();
    tools.begin_turn();
    CHECK_FALSE(has_notice(python("1/0"), "stop retrying"));
    CHECK_FALSE(has_notice(python("1/0"), "stop retrying"));
    CHECK(has_notice(python("1/0"), "stop retrying"));
    python("print(1)");  // a success inside a turn does not reset the count
    CHECK(has_notice(python("1/0"), "stop retrying"));
    tools.begin_turn();
    CHECK_FALSE(has_notice(python("1/0"), "stop retrying"));

    moat::tool_session without_turns(manager, "mcp-like");
    auto fail = [&] { return *run(without_turns.async_run_shell("false")); };
    fail();
    fail();
    CHECK(has_notice(fail(), "stop retrying"));
    REQUIRE(run(without_turns.async_run_shell("true")));
    CHECK_FALSE(has_notice(fail(), "stop retrying"));
    REQUIRE(run(without_turns.async_end()));
}

TEST_CASE_FIXTURE(tool_fixture,
                  "a sandbox lost behind the session's back is rebuilt and the result says so") {
    MOAT_REQUIRE_NAMESPACES();
    python("kept = 1");
    auto id = run(tools.async_list_artifacts());
    REQUIRE(id);
    auto lease = run(manager.async_acquire("conversation"));
    REQUIRE(lease);
    const std::string old_id = lease->box->id();
    lease = moat::make_error(moat::errc::cancelled, "released");
    REQUIRE(run(local->async_destroy(old_id)));
    auto after = python("print(kept)");
    CHECK(has_notice(after, "environment was rebuilt"));
    CHECK(after.error_type == "NameError");
}

TEST_CASE_FIXTURE(tool_fixture,
                  "bad arguments are error results naming the field, and the session goes on") {
    MOAT_REQUIRE_NAMESPACES();
    auto no_code = call("run_python", "{}");
    CHECK(no_code.status == moat::tool_status::error);
    CHECK(no_code.message.find("code") != std::string::npos);
    auto bad_timeout = call("run_shell", R"({"command": "true", "timeout_seconds": 9999})");
    CHECK(bad_timeout.message.find("timeout_seconds") != std::string::npos);
    auto unknown = call("run_java", "{}");
    CHECK(unknown.status == moat::tool_status::error);
    CHECK(unknown.message.find("run_java") != std::string::npos);
    auto not_json = call("run_shell", "{nope");
    CHECK(not_json.status == moat::tool_status::error);
    CHECK(call("run_shell", R"({"command": "echo ok", "timeout_seconds": 5})").stdout_text ==
          "ok\n");
}

TEST_CASE_FIXTURE(tool_fixture,
                  "a caller's deadline kills the running cell and the next cell "
                  "says the interpreter restarted") {
    MOAT_REQUIRE_NAMESPACES();
    python("import os\nkept = 1");
    const auto old_pid = python("os.getpid()").stdout_text;
    const auto limit = moat::deadline::after(1s);
    auto stopped = run(tools.async_run_python("import time\ntime.sleep(100)", 60s, limit));
    REQUIRE_FALSE(stopped);
    CHECK(stopped.error().code == moat::errc::deadline_exceeded);
    auto check = shell("kill -0 " + old_pid.substr(0, old_pid.size() - 1) +
                       " 2>/dev/null && echo alive || echo gone");
    CHECK(check.stdout_text == "gone\n");
    auto next = python("print('next')");
    CHECK(next.stdout_text == "next\n");
    CHECK(has_notice(next, "interpreter restarted"));
}

TEST_CASE_FIXTURE(tool_fixture, "no host environment, path or secret appears in a result") {
    MOAT_REQUIRE_NAMESPACES();
    ::setenv("MOAT_TOOL_TEST_SECRET", "s3cr3t-value-91", 1);
    char cwd[4096] = {};
    REQUIRE(::getcwd(cwd, sizeof cwd) != nullptr);
    shell("env; pwd; ls /");
    python("import os\nprint(dict(os.environ))");
    call("read_file", R"({"path": "/proc/1/environ"})");
    call("list_files", R"({"path": "/nonexistent/dir"})");
    CHECK(seen.find("s3cr3t-value-91") == std::string::npos);
    CHECK(seen.find(cwd) == std::string::npos);
    CHECK(seen.find("/run/moat") == std::string::npos);
    ::unsetenv("MOAT_TOOL_TEST_SECRET");
}

TEST_CASE_FIXTURE(tool_fixture,
                  "ending the session stops the interpreter and destroys the "
                  "sandbox, confirmed") {
    MOAT_REQUIRE_NAMESPACES();
    python("x = 1");
    auto lease = run(manager.async_acquire("conversation"));
    REQUIRE(lease);
    const std::string id = lease->box->id();
    lease = moat::make_error(moat::errc::cancelled, "released");
    REQUIRE(run(tools.async_end()));
    auto gone = run(local->async_inspect(id));
    CHECK((!gone || gone->state != moat::sandbox_state::running));
    auto after = run(tools.async_run_shell("true"));
    REQUIRE(after);
    CHECK(after->status == moat::tool_status::unavailable);
}

TEST_CASE_FIXTURE(tool_fixture, "ending a session that never ran anything succeeds") {
    MOAT_REQUIRE_NAMESPACES();
    moat::tool_session idle(manager, "never-used");
    CHECK(run(idle.async_end()));
    CHECK(manager.sessions() == 0);
}
