// The model-facing tool layer on the real local backend: stateful Python cells, shell commands,
// files, artifacts, shaped results, the retry ceiling, rebuilds and cancellation.
#include <doctest/doctest.h>

#include <moat/backend.hpp>
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include "core/base64.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"
#include "tools/python_kernel.hpp"
#include "tools/tool_arguments.hpp"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

// A cell that outlives its interrupt: only the kill stops it.
const char* const ignores_interrupts =
    "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass";

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
    auto slow = python(ignores_interrupts, 1s);
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
    INFO(big.message);
    CHECK(big.status == moat::tool_status::ok);
    CHECK(big.stdout_text.size() < 7000 * 2);
    CHECK(big.stdout_text.find("characters omitted") != std::string::npos);
    CHECK(big.stdout_text.find('\x1b') == std::string::npos);
    CHECK(big.stdout_text.find("\xef\xbf\xbd") == std::string::npos);  // nothing was split
    // 20 MB from one cell outruns the relay that carries it out of the sandbox: the supervisor
    // must wait for the relay, not drop what it could not send at once.
    auto many = python(
        "import sys\nfor i in range(2000): sys.stdout.write('x' * 9999 + '\\n')\n"
        "print('the end')");
    INFO(many.message);
    CHECK(many.status == moat::tool_status::ok);
    CHECK(many.stdout_text.ends_with("the end\n"));
    CHECK(many.stdout_omitted > 2000 * 10000 - 14000);
    CHECK(many.stdout_omitted < 2000 * 10000);
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

namespace {

// The real local backend, with its directory listings counted: how many list_dir calls a walk
// makes and how many entries they return.
class listing_counter final : public moat::backend {
  public:
    explicit listing_counter(moat::backend& real) : real_(real) {}

    std::size_t listings = 0;
    std::size_t entries = 0;

    asio::any_io_executor get_executor() const override { return real_.get_executor(); }
    std::string name() const override { return "counting " + real_.name(); }
    asio::awaitable<moat::result<moat::sandbox_info>> async_create(
        moat::sandbox_spec spec) override {
        return real_.async_create(std::move(spec));
    }
    asio::awaitable<moat::result<moat::sandbox_info>> async_attach(std::string id) override {
        return real_.async_attach(std::move(id));
    }
    asio::awaitable<moat::result<moat::sandbox_info>> async_inspect(std::string id) override {
        return real_.async_inspect(std::move(id));
    }
    asio::awaitable<moat::result<std::vector<moat::sandbox_info>>> async_list(
        moat::label_filter filter) override {
        return real_.async_list(std::move(filter));
    }
    asio::awaitable<moat::result<moat::sandbox_info>> async_extend_ttl(
        std::string id, std::chrono::milliseconds ttl) override {
        return real_.async_extend_ttl(std::move(id), ttl);
    }
    asio::awaitable<moat::result<void>> async_destroy(std::string id) override {
        return real_.async_destroy(std::move(id));
    }
    asio::awaitable<moat::result<moat::exec_result>> async_exec(
        std::string id, moat::exec_request request) override {
        return real_.async_exec(std::move(id), std::move(request));
    }
    asio::awaitable<moat::result<moat::exec_stream>> async_exec_stream(
        std::string id, moat::exec_request request) override {
        return real_.async_exec_stream(std::move(id), std::move(request));
    }
    asio::awaitable<moat::result<moat::process>> async_spawn(std::string id,
                                                             moat::exec_request request) override {
        return real_.async_spawn(std::move(id), std::move(request));
    }
    asio::awaitable<moat::result<void>> async_signal(std::string id, std::uint64_t process_id,
                                                     int signal) override {
        return real_.async_signal(std::move(id), process_id, signal);
    }
    asio::awaitable<moat::result<std::vector<moat::file_write_result>>> async_write_files(
        std::string id, std::vector<moat::file_write> files) override {
        return real_.async_write_files(std::move(id), std::move(files));
    }
    asio::awaitable<moat::result<std::vector<moat::file_read_result>>> async_read_files(
        std::string id, std::vector<std::string> paths) override {
        return real_.async_read_files(std::move(id), std::move(paths));
    }
    asio::awaitable<moat::result<moat::file_stat>> async_stat(std::string id,
                                                              std::string path) override {
        return real_.async_stat(std::move(id), std::move(path));
    }
    asio::awaitable<moat::result<std::vector<moat::dir_entry>>> async_list_dir(
        std::string id, std::string path) override {
        return count(real_.async_list_dir(std::move(id), std::move(path)));
    }

  private:
    asio::awaitable<moat::result<std::vector<moat::dir_entry>>> count(
        asio::awaitable<moat::result<std::vector<moat::dir_entry>>> listing) {
        auto listed = co_await std::move(listing);
        ++listings;
        if (listed) entries += listed->size();
        co_return listed;
    }

    moat::backend& real_;
};

}  // namespace

TEST_CASE_FIXTURE(tool_fixture,
                  "a run_shell command of 200 KiB runs, and one past the limit is an argument "
                  "error that suggests a script file, with the sandbox and Python state intact") {
    MOAT_REQUIRE_NAMESPACES();
    python("kept = 7");
    const auto pid = python("import os\nos.getpid()").stdout_text;
    const std::string long_command = ": '" + std::string(200 * 1024, 'x') + "'\necho long-ok";
    auto ran = shell(long_command);
    CHECK(ran.status == moat::tool_status::ok);
    CHECK(ran.stdout_text == "long-ok\n");
    auto reads_stdin = shell(long_command + "\ncat; echo end");  // its own stdin is empty
    CHECK(reads_stdin.stdout_text == "long-ok\nend\n");
    const std::string too_long = "echo " + std::string(moat::file_limits{}.max_file_bytes, 'y');
    auto refused = shell(too_long);
    CHECK(refused.status == moat::tool_status::error);
    CHECK(refused.message.find("command") != std::string::npos);
    CHECK(refused.hint.find("write_file") != std::string::npos);
    CHECK_FALSE(has_notice(refused, "rebuilt"));
    auto after = python("print(kept, os.getpid())");
    CHECK(after.stdout_text == "7 " + pid);
    CHECK_FALSE(has_notice(after, "rebuilt"));
}

TEST_CASE_FIXTURE(local_fixture,
                  "the artifact listing of a model-made tree of thousands of directories makes "
                  "a bounded number of visits") {
    MOAT_REQUIRE_NAMESPACES();
    listing_counter counted(*local);
    moat::runtime rt(counted);
    moat::session_manager manager(rt, moat::manager_options{});
    moat::tool_session tools(manager, "walk");
    auto made = run(tools.async_run_shell(
        "mkdir -p /workspace/out && cd /workspace/out && mkdir -p $(seq -f 'd%g/e/f' 1 4500) && "
        "echo made"));
    REQUIRE(made);
    CHECK(made->stdout_text == "made\n");
    counted.listings = 0;
    counted.entries = 0;
    auto listed = run(tools.async_list_artifacts());
    REQUIRE(listed);
    CHECK(listed->empty());
    CHECK(counted.listings <= 64);
    CHECK(counted.entries <= 2000 + moat::file_limits{}.max_dir_entries);
    REQUIRE(run(tools.async_end()));
    (void)run(manager.async_shutdown());
}

namespace {

// Creates `path` in sandbox `id` through the backend, beside the busy session (a program waits
// for it to appear).
asio::awaitable<void> release_waiting_program(moat::backend& backend, std::string id,
                                              std::string path) {
    std::vector<moat::file_write> files(1);
    files[0].path = std::move(path);
    files[0].content = "go";
    auto written = co_await backend.async_write_files(std::move(id), std::move(files));
    if (!written || !written->front().outcome) std::fprintf(stderr, "could not release\n");
}

}  // namespace

TEST_CASE_FIXTURE(tool_fixture,
                  "run_shell and run_python output reaches the output callback before the "
                  "program ends, and the result keeps the same output") {
    MOAT_REQUIRE_NAMESPACES();
    python("import os");  // a sandbox and an interpreter exist
    REQUIRE(tools.current_sandbox());
    const std::string id = tools.current_sandbox()->id;
    std::string streamed;
    std::string gate;
    moat::output_callback on_output = [&](moat::output_channel channel, std::string_view data) {
        if (channel != moat::output_channel::out) return;
        streamed += data;
        // The program waits for the gate file: only output that arrives while it runs opens it.
        if (streamed.find("first\n") != std::string::npos && !gate.empty()) {
            tasks.spawn(release_waiting_program(*local, id, gate));
            gate.clear();
        }
    };
    gate = "/workspace/go-shell";
    auto shell_run = run(tools.async_run_shell(
        "echo first; while [ ! -e /workspace/go-shell ]; do sleep 0.02; done; echo second", 20s, {},
        on_output));
    REQUIRE(shell_run);
    CHECK(shell_run->status == moat::tool_status::ok);
    CHECK(shell_run->stdout_text == "first\nsecond\n");
    CHECK(streamed == "first\nsecond\n");

    streamed.clear();
    gate = "/workspace/go-python";
    auto cell = run(tools.async_run_python(
        "import time\nprint('first')\nwhile not os.path.exists('/workspace/go-python'):\n"
        "    time.sleep(0.02)\nprint('second')",
        20s, {}, on_output));
    REQUIRE(cell);
    CHECK(cell->status == moat::tool_status::ok);
    CHECK(cell->stdout_text == "first\nsecond\n");
    CHECK(streamed == "first\nsecond\n");  // no end marker reaches the callback
}

TEST_CASE_FIXTURE(tool_fixture,
                  "a code failure is a result, not a tool error, while bad arguments and a lost "
                  "sandbox are") {
    MOAT_REQUIRE_NAMESPACES();
    auto raised = python("1/0");
    CHECK(raised.status == moat::tool_status::error);
    CHECK(raised.error_type == "ZeroDivisionError");
    CHECK_FALSE(raised.is_tool_error());
    CHECK_FALSE(shell("exit 3").is_tool_error());
    CHECK_FALSE(shell("sleep 5", 200ms).is_tool_error());
    auto missing = call("read_file", R"({"path": "nope.txt"})");
    CHECK(missing.error_code == "file_not_found");
    CHECK_FALSE(missing.is_tool_error());
    auto bad = call("run_python", R"({"code": 3})");
    CHECK(bad.argument_error);
    CHECK(bad.error_code == "invalid_arguments");
    CHECK(bad.is_tool_error());
    REQUIRE(run(tools.async_end()));
    auto lost = run(tools.async_run_shell("true"));
    REQUIRE(lost);
    CHECK(lost->is_tool_error());
}

TEST_CASE_FIXTURE(tool_fixture,
                  "base64 file tools round-trip exact bytes, text reads say when they are cut, "
                  "and errors carry codes") {
    MOAT_REQUIRE_NAMESPACES();
    std::string bytes = "a\r\nb\x07\x1b[31m\r\n";
    for (int i = 0; i < 256; ++i) bytes += static_cast<char>(i);
    const std::string encoded = moat::base64_encode(bytes);
    auto wrote = call("write_file",
                      R"({"path":"exact.bin","encoding":"base64","content":")" + encoded + R"("})");
    CHECK(wrote.status == moat::tool_status::ok);
    CHECK(wrote.bytes == bytes.size());
    auto read = call("read_file", R"({"path":"exact.bin","encoding":"base64"})");
    CHECK(read.status == moat::tool_status::ok);
    CHECK(read.encoding == moat::file_encoding::base64);
    CHECK(read.content == encoded);
    CHECK(read.bytes == bytes.size());
    auto exact = run(tools.async_read_workspace_file("exact.bin"));
    REQUIRE(exact);
    CHECK(*exact == bytes);
    auto outside = run(tools.async_read_workspace_file("/etc/passwd"));
    REQUIRE_FALSE(outside);
    CHECK(outside.error().code == moat::errc::invalid_path);

    auto as_text = call("read_file", R"({"path":"exact.bin"})");
    CHECK(as_text.content.find('\r') == std::string::npos);  // text is shaped, as before
    python("open('/workspace/big.txt', 'w').write('y' * 100000)");
    auto big = call("read_file", R"({"path":"big.txt"})");
    CHECK(big.content_omitted > 90000);
    CHECK(big.to_json().find(R"("truncated":true)") != std::string::npos);
    auto flood = shell("yes | head -c 100000");
    CHECK(flood.stdout_omitted > 90000);
    CHECK(shell("echo small").stdout_omitted == 0);

    shell("mkdir -p adir");
    CHECK(call("read_file", R"({"path":"adir","encoding":"base64"})").error_code == "is_directory");
    CHECK(call("write_file", R"({"path":"adir","content":"x"})").error_code == "is_directory");
    CHECK(call("write_file", R"({"path":"/usr/x","content":"x"})").error_code ==
          "permission_denied");
    CHECK(call("list_files", R"({"path":"nowhere"})").error_code == "file_not_found");
}

TEST_CASE_FIXTURE(local_fixture,
                  "with a tool prefix only the prefixed names are tools and hints use them") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    moat::session_manager manager(rt, moat::manager_options{});
    moat::tool_options options;
    options.tool_prefix = "moat_";
    moat::tool_session tools(manager, "prefixed", options);
    auto ran = run(tools.async_call("moat_run_shell", R"({"command":"echo hi"})"));
    REQUIRE(ran);
    CHECK(ran->stdout_text == "hi\n");
    auto bare = run(tools.async_call("run_shell", R"({"command":"echo hi"})"));
    REQUIRE(bare);
    CHECK(bare->argument_error);
    CHECK(bare->message.find("unknown tool 'run_shell'") != std::string::npos);
    CHECK(bare->hint.find("moat_run_python") != std::string::npos);
    auto missing = run(tools.async_call("moat_read_file", R"({"path":"none"})"));
    REQUIRE(missing);
    CHECK(missing->hint.find("moat_list_files") != std::string::npos);
    const auto definitions = tools.definitions();
    REQUIRE(definitions.size() == 9);
    CHECK(definitions[0].name == "moat_run_python");
    CHECK(definitions[3].description.find("moat_run_shell") != std::string::npos);
    for (const auto& d : moat::tool_definitions()) {
        if (d.name.starts_with("run_"))
            CHECK(d.description.find("at most 600") != std::string::npos);
    }
    REQUIRE(run(tools.async_end()));
    (void)run(manager.async_shutdown());
}

TEST_CASE("the tool descriptions say what the network allows: off by default, else the hosts") {
    auto described = [](const moat::sandbox_network& network, const std::string& tool) {
        for (const auto& d : moat::tool_definitions({}, {}, network))
            if (d.name == tool) return d.description;
        FAIL("no tool " << tool);
        return std::string();
    };
    const moat::sandbox_network off;
    for (const char* tool : {"run_python", "run_shell"}) {
        CAPTURE(tool);
        CHECK(described(off, tool).find("The network is off") != std::string::npos);
        CHECK(described(off, tool).find("pypi.org") == std::string::npos);
    }
    moat::sandbox_network listed;
    listed.mode = moat::network_mode::allow_list;
    listed.allow_hosts = {"pypi.org", "*.pythonhosted.org"};
    for (const char* tool : {"run_python", "run_shell"}) {
        CAPTURE(tool);
        const auto text = described(listed, tool);
        CHECK(text.find("network is off") == std::string::npos);
        CHECK(text.find("only to pypi.org, *.pythonhosted.org") != std::string::npos);
        CHECK(text.find("HTTP_PROXY") != std::string::npos);
        CHECK(text.find("other hosts are refused") != std::string::npos);
        // PyPI is on the list: pip installs from it, into the sandbox's one Python.
        CHECK(text.find("pip install PKG installs from PyPI") != std::string::npos);
    }
    moat::sandbox_network open;
    open.mode = moat::network_mode::all;
    CHECK(described(open, "run_shell").find("public hosts") != std::string::npos);
    CHECK(described(open, "run_python").find("pip install PKG installs from PyPI") !=
          std::string::npos);
    // An allow-list without PyPI (files.pythonhosted.org missing): pip only from those hosts.
    moat::sandbox_network mirror;
    mirror.mode = moat::network_mode::allow_list;
    mirror.allow_hosts = {"pypi.org", "mirror.example"};
    for (const auto& text : {described(mirror, "run_python"), described(mirror, "run_shell")}) {
        CHECK(text.find("PyPI (pypi.org, files.pythonhosted.org) is not among the allowed hosts") !=
              std::string::npos);
        CHECK(text.find("installs from PyPI") == std::string::npos);
    }
    CHECK(described(off, "run_python").find("installs from PyPI") == std::string::npos);
    // A session's own definitions follow its manager's spec.
    moat::test::local_fixture f;
    moat::runtime rt(*f.local);
    moat::manager_options options;
    options.spec.network = listed;
    moat::session_manager manager(rt, options);
    moat::tool_session tools(manager, "described");
    CHECK(tools.network() == listed);
    for (const auto& d : tools.definitions()) {
        if (d.name == "run_python") CHECK(d.description.find("pypi.org") != std::string::npos);
    }
}

TEST_CASE_FIXTURE(tool_fixture,
                  "the retry ceiling counts only run_python and run_shell failures and can be "
                  "turned off") {
    MOAT_REQUIRE_NAMESPACES();
    tools.begin_turn();
    for (int i = 0; i < 5; ++i) {
        CHECK_FALSE(has_notice(call("read_file", R"({"path":"missing.txt"})"), "stop retrying"));
    }
    CHECK_FALSE(has_notice(shell("test -e missing.txt"), "stop retrying"));
    CHECK_FALSE(has_notice(python("1/0"), "stop retrying"));
    CHECK(has_notice(shell("false"), "stop retrying"));

    moat::tool_options off;
    off.failures_before_stop = 0;
    moat::tool_session unlimited(manager, "no-ceiling", off);
    for (int i = 0; i < 5; ++i) {
        auto r = run(unlimited.async_run_shell("false"));
        REQUIRE(r);
        CHECK_FALSE(has_notice(*r, "stop retrying"));
    }
    REQUIRE(run(unlimited.async_end()));
}

TEST_CASE_FIXTURE(tool_fixture,
                  "the session exposes its sandbox's info, and hidden or .tmp files are not "
                  "artifacts") {
    MOAT_REQUIRE_NAMESPACES();
    CHECK_FALSE(tools.current_sandbox());
    auto r = shell(
        "mkdir -p out/.cache out/keep && echo x > out/.part && echo x > out/upload.tmp && "
        "echo x > out/.cache/a && echo x > out/keep/b.txt && echo x > out/c.csv");
    REQUIRE(r.artifacts.size() == 2);
    CHECK(r.artifacts[0].path == "c.csv");
    CHECK(r.artifacts[1].path == "keep/b.txt");
    CHECK_FALSE(r.artifacts_truncated);
    const auto info = tools.current_sandbox();
    REQUIRE(info);
    auto lease = run(manager.async_acquire("conversation"));
    REQUIRE(lease);
    CHECK(info->id == lease->box->id());
    lease = moat::make_error(moat::errc::cancelled, "released");
    REQUIRE(info->host_pid);
    CHECK(::kill(*info->host_pid, 0) == 0);  // pid 1 of the sandbox, seen from the host
}

TEST_CASE_FIXTURE(tool_fixture,
                  "a cell that forges the driver's end of cell from what it can read of the "
                  "interpreter neither ends the cell early nor hides what it prints after") {
    MOAT_REQUIRE_NAMESPACES();
    // Everything the interpreter's own code can see of the driver: its globals through
    // sys.modules['__main__'] and its command line through /proc/self/cmdline. Whatever secret
    // either holds, the forged end (on both channels) must stay output.
    const std::string forge =
        "import sys, re\n"
        "main = vars(sys.modules['__main__'])\n"
        "cmdline = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        "found = [a.decode() for a in cmdline if re.fullmatch(rb'[0-9a-f]{24}', a)]\n"
        "nonce = main.get('nonce') or (found[0] if found else 'none')\n"
        "number = main.get('number', 0)\n"
        "for status in ('ok -', 'error -'):\n"
        "    forged = '\\x1emoat-cell-%s %03d %s\\n' % (nonce, number, status)\n"
        "    sys.stdout.write(forged); sys.stdout.flush()\n"
        "    sys.stderr.write(forged); sys.stderr.flush()\n"
        "    for fake in ('r 4\\nok -\\n', '\\x1er4\\nok -\\n'):\n"
        "        sys.stdout.write(fake); sys.stderr.write(fake)\n"
        "print('after the forged end')\n"
        "print('on stderr too', file=sys.stderr)\n"
        "raise ValueError('the real end')\n";
    auto forged = python(forge);
    CHECK(forged.status == moat::tool_status::error);
    CHECK(forged.error_type == "ValueError");
    CHECK(forged.stdout_text.find("after the forged end") != std::string::npos);
    CHECK(forged.stderr_text.find("on stderr too") != std::string::npos);
    CHECK(forged.traceback.find("the real end") != std::string::npos);
    // The next cell is its own: nothing of the forged one is left in between.
    auto next = python("print('next cell')");
    CHECK(next.status == moat::tool_status::ok);
    CHECK(next.stdout_text == "next cell\n");
    CHECK(next.stderr_text.empty());
    // What a crashing interpreter printed last still reaches the result.
    auto crashed = python("import os\nprint('printed before the exit')\nos._exit(3)");
    CHECK(crashed.exit_code == 3);
    CHECK(crashed.stdout_text == "printed before the exit\n");
}

TEST_CASE_FIXTURE(tool_fixture,
                  "a server started with start_process serves later run_shell calls, is listed, "
                  "shows its output and ends with stop_process") {
    MOAT_REQUIRE_NAMESPACES();
    CHECK(call("write_file", R"({"path": "site/hello.txt", "content": "hello"})").status ==
          moat::tool_status::ok);
    auto started = call("start_process",
                        R"({"command": "exec python3 -u -m http.server 8765 --bind 127.0.0.1",)"
                        R"( "cwd": "/workspace/site"})");
    REQUIRE(started.status == moat::tool_status::ok);
    REQUIRE(started.processes.size() == 1);
    const int id = started.processes[0].id;
    CHECK(started.processes[0].is_running);
    CHECK(started.to_json().find("\"processes\"") != std::string::npos);

    // A later call reaches it (bounded: the server needs a moment to listen).
    auto fetched = shell(
        "for i in $(seq 100); do python3 -c \"import urllib.request; "
        "print(urllib.request.urlopen('http://127.0.0.1:8765/hello.txt').read().decode())\" "
        "2>/dev/null && exit 0; sleep 0.1; done; exit 1");
    CHECK(fetched.status == moat::tool_status::ok);
    CHECK(fetched.stdout_text == "hello\n");

    auto listed = call("list_processes", "{}");
    REQUIRE(listed.processes.size() == 1);
    CHECK(listed.processes[0].id == id);
    CHECK(listed.processes[0].is_running);
    CHECK(listed.processes[0].command.find("http.server") != std::string::npos);

    auto output = call("read_process_output", "{\"id\": " + std::to_string(id) + "}");
    CHECK(output.status == moat::tool_status::ok);
    CHECK(output.stderr_text.find("GET /hello.txt") != std::string::npos);
    CHECK(output.to_json().find("\"stderr\"") != std::string::npos);

    auto stopped = call("stop_process", "{\"id\": " + std::to_string(id) + "}");
    CHECK(stopped.status == moat::tool_status::ok);
    REQUIRE(stopped.processes.size() == 1);
    CHECK_FALSE(stopped.processes[0].is_running);
    CHECK(call("list_processes", "{}").processes.at(0).is_running == false);
    // Gone from the sandbox, not merely forgotten (its own command line names it).
    CHECK(shell("grep -l 'http[.]server' /proc/[0-9]*/cmdline 2>/dev/null | wc -l").stdout_text ==
          "0\n");
    CHECK(call("stop_process", R"({"id": 99})").error_code == "invalid_arguments");
}

TEST_CASE_FIXTURE(tool_fixture,
                  "background processes are bounded per session, their output is capped, and "
                  "they end with the session") {
    MOAT_REQUIRE_NAMESPACES();
    const int most = moat::tool_options{}.max_background_processes;
    for (int i = 0; i < most; ++i) {
        auto started = call("start_process", R"({"command": "sleep 300"})");
        REQUIRE(started.status == moat::tool_status::ok);
    }
    auto refused = call("start_process", R"({"command": "sleep 300"})");
    CHECK(refused.status == moat::tool_status::error);
    CHECK(refused.message.find(std::to_string(most)) != std::string::npos);
    CHECK_FALSE(refused.is_tool_error());
    CHECK(call("list_processes", "{}").processes.size() == static_cast<std::size_t>(most));
    // A stopped one frees its place.
    CHECK(call("stop_process", R"({"id": 1})").status == moat::tool_status::ok);
    auto flood = call("start_process", R"({"command": "head -c 5000000 /dev/zero | tr '\\0' x"})");
    REQUIRE(flood.status == moat::tool_status::ok);
    const std::string flood_id = std::to_string(flood.processes.at(0).id);
    // It ends on its own once its 5 MB are written (the pump keeps reading, bounded wait).
    moat::tool_result shown;
    for (int i = 0; i < 200; ++i) {
        shown = call("read_process_output", "{\"id\": " + flood_id + "}");
        if (!shown.processes.at(0).is_running) break;
        (void)shell("sleep 0.05");
    }
    CHECK_FALSE(shown.processes.at(0).is_running);
    CHECK(shown.processes.at(0).exit_code == 0);
    CHECK(shown.processes.at(0).stdout_bytes == 5'000'000);
    CHECK(shown.stdout_text.size() < 70'000);
    CHECK(shown.stdout_omitted > 0);

    std::size_t running = 0;
    for (const auto& p : call("list_processes", "{}").processes) running += p.is_running ? 1 : 0;
    CHECK(running == static_cast<std::size_t>(most - 1));
    // The session's end stops them with its sandbox, and does not wait on them.
    const auto pid = tools.current_sandbox()->host_pid;
    REQUIRE(pid);
    REQUIRE(run(tools.async_end()));
    CHECK_FALSE(moat::test::is_running(*pid));
}

namespace {

// True if some process on the host has exactly `command` as its command line.
bool host_runs(const std::string& command) {
    DIR* proc = ::opendir("/proc");
    if (proc == nullptr) return false;
    bool found = false;
    while (const dirent* e = ::readdir(proc)) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        std::string line = moat::test::read_file(std::string("/proc/") + e->d_name + "/cmdline");
        std::replace(line.begin(), line.end(), '\0', ' ');
        if (line == command + " ") {
            found = true;
            break;
        }
    }
    ::closedir(proc);
    return found;
}

}  // namespace

TEST_CASE_FIXTURE(tool_fixture,
                  "after run_python, a run_shell command's setsid escapes are stopped when it "
                  "ends and it returns long before its wall limit") {
    MOAT_REQUIRE_NAMESPACES();
    // The interpreter stays alive between calls: the sandbox is never idle from here on.
    CHECK(python("x = 1").status == moat::tool_status::ok);
    auto detached = shell("setsid sleep 4271 >/dev/null 2>&1 & sleep 0.3; echo started");
    CHECK(detached.status == moat::tool_status::ok);
    CHECK(detached.stdout_text == "started\n");
    CHECK(has_notice(detached, "stopped when it ended"));
    CHECK(moat::test::eventually([] { return !host_runs("sleep 4271"); }));
    // The escaped process holds the pipe: before, the call ended at its wall limit plus slack
    // (35 s); the watchdog here is far below that.
    auto r = run(tools.async_run_shell("setsid sleep 4373 & sleep 0.3; echo started", 30s), 20s);
    REQUIRE(r);
    CHECK(r->status == moat::tool_status::ok);
    CHECK(r->stdout_text == "started\n");
    CHECK(moat::test::eventually([] { return !host_runs("sleep 4373"); }));
    // The interpreter was not touched.
    CHECK(python("print(x)").stdout_text == "1\n");
}
