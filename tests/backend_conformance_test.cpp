// The backend conformance suite: one set of checks of the contract in backend.hpp, exec.hpp and
// files.hpp, written once over a backend kind and instantiated for each backend:
//
//   local          the local backend on this host
//   e2b over http  the e2b backend against a `moat serve` the suite starts (plain HTTP, loopback)
//   e2b over tls   the same over HTTPS, trusting only a CA the suite generates (support/test_ca)
//
// Where the backends differ by contract, the difference is a parameter of the kind (the layout:
// /workspace for local, /home/user for E2B), never a skipped check. Host processes are looked at
// from the host, never through the backend: every sandbox's pid 1 is found (local: sandbox_info::
// host_pid; e2b: the new moat-agent below the suite's `moat serve`), and "nothing left" means no
// descendant of it runs the command.
//
// One `moat serve` per kind per test process (ctest runs each case in its own process), started
// on first use and stopped at exit.
#include <moat/backend.hpp>
#include <moat/e2b_backend.hpp>
#include <moat/errc.hpp>
#include <moat/local_backend.hpp>
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/tools.hpp>
#include <moat/with_timeout.hpp>

#include "http/client.hpp"

#include "support/async_test.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"
#include "support/serve_process.hpp"
#include "support/test_ca.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <doctest/doctest.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using moat::errc;

namespace {

// ---- the backend kinds --------------------------------------------------------------------

struct local_kind {
    static constexpr const char* home = "/workspace";
    static std::unique_ptr<moat::backend> make(asio::any_io_executor executor) {
        return moat::make_local_backend(std::move(executor));
    }
    // pid 1 of a sandbox just created, seen from the host.
    static pid_t pid1(const moat::sandbox_info& info, const std::vector<pid_t>&) {
        REQUIRE(info.host_pid.has_value());
        return *info.host_pid;
    }
    static std::vector<pid_t> agents() { return {}; }
};

moat::test::test_ca& suite_ca() {
    static moat::test::test_ca ca;
    return ca;
}

template <bool Tls>
struct e2b_kind {
    static constexpr const char* home = "/home/user";
    static moat::test::serve_process& serve() {
        if constexpr (Tls) {
            auto& ca = suite_ca();
            static moat::test::serve_process s([&ca] {
                moat::test::serve_process_options o;
                o.tls_cert_file = ca.server_cert_file;
                o.tls_key_file = ca.server_key_file;
                return o;
            }());
            return s;
        } else {
            static moat::test::serve_process s;
            return s;
        }
    }
    static moat::e2b_config config() {
        moat::e2b_config c;
        c.api_key = serve().api_key();
        c.api_url = serve().api_url();
        c.sandbox_url = serve().envd_url();
        c.domain = "localhost";
        if constexpr (Tls) {
            c.ca_file = suite_ca().ca_file;
            c.use_system_ca_store = false;
        }
        return c;
    }
    static std::unique_ptr<moat::backend> make(asio::any_io_executor executor) {
        return moat::make_e2b_backend(std::move(executor), config());
    }
    static std::vector<pid_t> agents() { return serve().sandbox_agents(); }
    static pid_t pid1(const moat::sandbox_info& info, const std::vector<pid_t>& before) {
        std::vector<pid_t> added;
        for (pid_t p : agents()) {
            if (std::find(before.begin(), before.end(), p) == before.end()) added.push_back(p);
        }
        REQUIRE_MESSAGE(added.size() == 1, "creating " << info.id << " added " << added.size()
                                                       << " sandbox agents below moat serve");
        return added.front();
    }
};
using e2b_http_kind = e2b_kind<false>;
using e2b_tls_kind = e2b_kind<true>;

// ---- the harness ----------------------------------------------------------------------------

using next_item = std::variant<moat::output_chunk, moat::exec_result>;

struct drained {
    std::string out;
    std::string err;
    std::optional<moat::exec_result> result;
    std::optional<moat::error> failure;
};

template <class Stream>
asio::awaitable<drained> drain(Stream& stream) {
    drained d;
    for (;;) {
        auto next = co_await stream.async_next();
        if (!next) {
            d.failure = next.error();
            co_return d;
        }
        if (auto* chunk = std::get_if<moat::output_chunk>(&*next)) {
            if (chunk->channel == moat::output_channel::out) {
                d.out += chunk->data;
            } else {
                d.err += chunk->data;
            }
            continue;
        }
        d.result = std::get<moat::exec_result>(std::move(*next));
        co_return d;
    }
}

// Reads until `want` bytes of stdout arrived (or the stream ended or failed).
asio::awaitable<std::string> read_out(moat::process& p, std::size_t want) {
    std::string out;
    while (out.size() < want) {
        auto next = co_await p.async_next();
        if (!next) break;
        auto* chunk = std::get_if<moat::output_chunk>(&*next);
        if (chunk == nullptr) break;
        if (chunk->channel == moat::output_channel::out) out += chunk->data;
    }
    co_return out;
}

// Gone, a zombie, exiting (PF_EXITING in /proc/<pid>/stat's flags) or with SIGKILL pending: it
// will not run the program's code again.
bool is_dying(pid_t pid) {
    const std::string stat = moat::test::read_file("/proc/" + std::to_string(pid) + "/stat");
    const std::size_t close = stat.rfind(')');
    if (stat.empty() || close == std::string::npos) return true;
    std::istringstream fields(stat.substr(close + 2));
    std::string state;
    fields >> state;
    if (state == "Z" || state == "X") return true;
    std::string skip;
    for (int i = 0; i < 5; ++i) fields >> skip;  // ppid pgrp session tty_nr tpgid
    unsigned long flags = 0;
    fields >> flags;
    constexpr unsigned long pf_exiting = 0x4;
    if ((flags & pf_exiting) != 0) return true;
    std::istringstream status(moat::test::read_file("/proc/" + std::to_string(pid) + "/status"));
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("SigPnd:", 0) != 0 && line.rfind("ShdPnd:", 0) != 0) continue;
        const unsigned long long pending = std::stoull(line.substr(7), nullptr, 16);
        if ((pending & (1ull << (SIGKILL - 1))) != 0) return true;
    }
    return false;
}

template <class Kind>
struct conformance {
    conformance() : b(Kind::make(io.get_executor())) {}
    ~conformance() {
        for (const auto& [id, pid] : pid1s) {
            (void)pid;
            if (destroyed.count(id) == 0) (void)run(b->async_destroy(id));
        }
        b.reset();
        io.run_for(std::chrono::seconds(1));
    }

    template <class T>
    T run(asio::awaitable<T> task, std::chrono::seconds watchdog = std::chrono::seconds(120)) {
        return moat::test::run_async(io, std::move(task), watchdog);
    }

    moat::sandbox_info create(moat::sandbox_spec spec = {}) {
        const std::vector<pid_t> before = Kind::agents();
        auto made = run(b->async_create(std::move(spec)));
        REQUIRE_MESSAGE(made.has_value(), made.error().detail);
        pid1s[made->id] = Kind::pid1(*made, before);
        return *made;
    }

    moat::result<moat::exec_result> exec(const std::string& id, moat::exec_request request) {
        return run(b->async_exec(id, std::move(request)));
    }

    moat::exec_result sh(const std::string& id, const std::string& shell,
                         std::chrono::milliseconds wall_limit = 60s) {
        moat::exec_request request = moat::test::shell(shell);
        request.wall_limit = wall_limit;
        auto r = exec(id, std::move(request));
        REQUIRE_MESSAGE(r.has_value(), shell << ": " << r.error().detail);
        return *r;
    }

    void destroy(const std::string& id) {
        auto gone = run(b->async_destroy(id));
        REQUIRE_MESSAGE(gone.has_value(), gone.error().detail);
        destroyed.insert(id);
    }

    pid_t pid1(const std::string& id) const { return pid1s.at(id); }

    // Host processes of the sandbox whose command line contains `needle`.
    std::vector<pid_t> host_processes(const std::string& id, const std::string& needle) const {
        std::vector<pid_t> found;
        for (pid_t p : moat::test::descendants(pid1(id))) {
            if (moat::test::is_running(p) &&
                moat::test::command_line(p).find(needle) != std::string::npos) {
                found.push_back(p);
            }
        }
        return found;
    }

    // Nothing of a command that was killed (by its wall limit, a cancel, a deadline) is left:
    // at once, each process still visible is dying (exiting, or SIGKILL pending: the backend
    // confirms the command's own end, and the rest of its group was killed with it), and soon
    // after none is left.
    // Without `confirmed` (a dropped stream, whose destructor cannot wait), only the latter.
    void check_nothing_left(const std::string& id, const std::string& needle,
                            const std::string& what, bool confirmed = true) {
        for (pid_t p : confirmed ? host_processes(id, needle) : std::vector<pid_t>{}) {
            CHECK_MESSAGE(is_dying(p), what << ": still running, not killed: " << describe({p}));
        }
        // The backend's executor runs meanwhile: a remote kill travels over it.
        const bool gone = moat::test::eventually([&] {
            io.restart();
            io.run_for(std::chrono::milliseconds(10));
            return host_processes(id, needle).empty();
        });
        CHECK_MESSAGE(gone, what << ": left running: " << describe(host_processes(id, needle)));
    }

    std::string describe(const std::vector<pid_t>& pids) const {
        std::string out;
        for (pid_t p : pids) out += std::to_string(p) + ": " + moat::test::command_line(p) + "; ";
        return out;
    }

    asio::io_context io;
    std::unique_ptr<moat::backend> b;
    std::map<std::string, pid_t> pid1s;
    std::set<std::string> destroyed;
};

bool is(const moat::error& e, errc code) {
    return e.code == moat::make_error_code(code);
}

std::string unique_value() {
    return std::to_string(::getpid()) + "-" +
           std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace

TYPE_TO_STRING_AS("local", local_kind);
TYPE_TO_STRING_AS("e2b over http", e2b_http_kind);
TYPE_TO_STRING_AS("e2b over tls", e2b_tls_kind);
#define MOAT_CONFORMANCE_KINDS local_kind, e2b_http_kind, e2b_tls_kind

// ---- the suite's own support --------------------------------------------------------------

namespace {

asio::awaitable<moat::result<moat::http::full_response>> fetch_health(moat::http::client& client,
                                                                      std::string url) {
    moat::http::request req;
    req.url = url + "/health";
    req.limit = moat::deadline::after(10s);
    co_return co_await client.async_fetch(std::move(req), 4096);
}

}  // namespace

TEST_CASE("a test's moat serve answers over plain HTTP and over TLS with the test CA, then stops") {
    moat::test::test_ca ca;
    asio::io_context io;
    {
        moat::test::serve_process serve;
        CHECK(serve.api_url().rfind("http://127.0.0.1:", 0) == 0);
        CHECK(serve.envd_url().rfind("http://127.0.0.1:", 0) == 0);
        CHECK(serve.api_port() != 0);
        moat::http::client client(io.get_executor());
        const auto health = moat::test::run_async(io, fetch_health(client, serve.api_url()));
        REQUIRE_MESSAGE(health.has_value(), health.error().detail);
        CHECK(health->status() == 200);
        CHECK(serve.sandbox_agents().empty());
        CHECK(serve.sandbox_processes().empty());
        CHECK(serve.stop() == 0);
        CHECK(!serve.is_running());
    }
    {
        moat::test::serve_process_options options;
        options.tls_cert_file = ca.server_cert_file;
        options.tls_key_file = ca.server_key_file;
        options.max_sandboxes = 4;
        moat::test::serve_process serve(options);
        CHECK(serve.api_url().rfind("https://127.0.0.1:", 0) == 0);
        moat::http::client_options trusting;
        trusting.use_system_ca_store = false;
        trusting.ca_file = ca.ca_file;
        moat::http::client client(io.get_executor(), trusting);
        const auto health = moat::test::run_async(io, fetch_health(client, serve.api_url()));
        REQUIRE_MESSAGE(health.has_value(), health.error().detail);
        CHECK(health->status() == 200);
        moat::http::client_options other;
        other.use_system_ca_store = false;
        other.ca_file = ca.unknown_ca_file;
        moat::http::client stranger(io.get_executor(), other);
        const auto refused = moat::test::run_async(io, fetch_health(stranger, serve.api_url()));
        REQUIRE(!refused.has_value());
        CHECK(refused.error().detail.find("certificate verify failed") != std::string::npos);
        CHECK(serve.stop() == 0);
    }
}

// ---- lifecycle ------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("a backend creates, inspects, lists, extends and destroys a sandbox, confirmed",
                   Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const std::string run_label = unique_value();
    moat::sandbox_spec spec;
    spec.labels = {{"suite", "conformance"}, {"run", run_label}};
    spec.ttl = 10min;
    const auto box = t.create(spec);
    CHECK(box.state == moat::sandbox_state::running);
    CHECK(box.labels.at("run") == run_label);
    CHECK(box.layout.home == Kind::home);
    CHECK(box.expires_at > box.created_at);
    const pid_t init = t.pid1(box.id);
    CHECK(moat::test::is_running(init));

    const auto seen = t.run(t.b->async_inspect(box.id));
    REQUIRE_MESSAGE(seen.has_value(), seen.error().detail);
    CHECK(seen->id == box.id);
    CHECK(seen->state == moat::sandbox_state::running);
    CHECK(seen->labels.at("suite") == "conformance");

    const auto listed = t.run(t.b->async_list({{"run", run_label}}));
    REQUIRE_MESSAGE(listed.has_value(), listed.error().detail);
    REQUIRE(listed->size() == 1);
    CHECK(listed->front().id == box.id);
    const auto none = t.run(t.b->async_list({{"run", run_label + "-other"}}));
    REQUIRE(none.has_value());
    CHECK(none->empty());

    const auto extended = t.run(t.b->async_extend_ttl(box.id, 2h));
    REQUIRE_MESSAGE(extended.has_value(), extended.error().detail);
    CHECK(extended->expires_at > box.expires_at + 1h);
    const auto too_long =
        t.run(t.b->async_extend_ttl(box.id, moat::sandbox_spec::max_ttl + std::chrono::hours(1)));
    REQUIRE(!too_long.has_value());
    CHECK_MESSAGE(is(too_long.error(), errc::invalid_argument), too_long.error().detail);
    const auto unknown_extend = t.run(t.b->async_extend_ttl("sb-unknown-conformance", 1h));
    REQUIRE(!unknown_extend.has_value());
    CHECK(is(unknown_extend.error(), errc::sandbox_not_found));

    CHECK(t.sh(box.id, "echo alive").out.text() == "alive\n");
    t.destroy(box.id);
    // Confirmed: pid 1 is gone when destroy returns, not later.
    CHECK(moat::test::is_gone(init));
    const auto after = t.run(t.b->async_inspect(box.id));
    REQUIRE(!after.has_value());
    CHECK(is(after.error(), errc::sandbox_not_found));
    const auto again = t.run(t.b->async_destroy(box.id));
    REQUIRE(!again.has_value());
    CHECK(is(again.error(), errc::sandbox_not_found));
    const auto listed_after = t.run(t.b->async_list({{"run", run_label}}));
    REQUIRE(listed_after.has_value());
    CHECK(listed_after->empty());
    const auto exec_after = t.exec(box.id, moat::test::shell("true"));
    REQUIRE(!exec_after.has_value());
    CHECK_MESSAGE((is(exec_after.error(), errc::sandbox_not_found) ||
                   is(exec_after.error(), errc::sandbox_unavailable)),
                  exec_after.error().detail);
}

TEST_CASE_TEMPLATE("a backend attaches a sandbox another instance created to survive its owner",
                   Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    moat::sandbox_spec spec;
    spec.survive_owner = true;
    spec.ttl = 5min;
    spec.labels = {{"run", unique_value()}};
    const auto box = t.create(spec);
    CHECK(t.sh(box.id, "echo kept > \"$HOME/kept.txt\"").exit_code == 0);

    auto other = Kind::make(t.io.get_executor());
    const auto attached = t.run(other->async_attach(box.id));
    REQUIRE_MESSAGE(attached.has_value(), attached.error().detail);
    CHECK(attached->id == box.id);
    CHECK(attached->layout.home == Kind::home);
    CHECK(attached->labels == box.labels);
    const auto twice = t.run(other->async_attach(box.id));
    REQUIRE(twice.has_value());
    CHECK(twice->id == box.id);
    const auto read = t.run(other->async_exec(box.id, moat::test::shell("cat \"$HOME/kept.txt\"")));
    REQUIRE_MESSAGE(read.has_value(), read.error().detail);
    CHECK(read->out.text() == "kept\n");
    const auto unknown = t.run(other->async_attach("sb-unknown-conformance"));
    REQUIRE(!unknown.has_value());
    CHECK(is(unknown.error(), errc::sandbox_not_found));

    const pid_t init = t.pid1(box.id);
    const auto gone = t.run(other->async_destroy(box.id));
    REQUIRE_MESSAGE(gone.has_value(), gone.error().detail);
    t.destroyed.insert(box.id);
    CHECK(moat::test::is_gone(init));
    other.reset();
}

// ---- exec -----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE(
    "exec reports exit codes, signals, both streams, stdin, env, argv and the layout's workdir",
    Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const auto box = t.create();
    const auto ok = t.sh(box.id, "echo out; echo err >&2");
    CHECK(ok.exit_code == 0);
    CHECK(ok.signal == 0);
    CHECK(!ok.timed_out);
    CHECK(ok.out.text() == "out\n");
    CHECK(ok.err.text() == "err\n");
    const auto three = t.sh(box.id, "exit 3");
    CHECK(three.exit_code == 3);
    CHECK(three.signal == 0);
    const auto killed = t.sh(box.id, "kill -9 $$");
    CHECK(killed.exit_code == 128 + SIGKILL);
    CHECK(killed.signal == SIGKILL);
    CHECK(!killed.timed_out);

    moat::exec_request piped = moat::test::shell("cat; echo");
    piped.stdin_data = std::string("piped\0input", 11);
    const auto cat = t.exec(box.id, piped);
    REQUIRE_MESSAGE(cat.has_value(), cat.error().detail);
    CHECK(cat->out.text() == std::string("piped\0input\n", 12));

    moat::exec_request with_env =
        moat::test::shell("printf '%s|%s' \"$MOAT_CONFORMANCE\" \"$HOME\"");
    with_env.env["MOAT_CONFORMANCE"] = "a value with spaces";
    const auto env = t.exec(box.id, with_env);
    REQUIRE(env.has_value());
    CHECK(env->out.text() == std::string("a value with spaces|") + Kind::home);

    CHECK(t.sh(box.id, "pwd").out.text() == box.layout.workdir + "\n");
    moat::exec_request in_tmp = moat::test::shell("pwd");
    in_tmp.cwd = "/tmp";
    const auto tmp = t.exec(box.id, in_tmp);
    REQUIRE(tmp.has_value());
    CHECK(tmp->out.text() == "/tmp\n");

    moat::exec_request argv;
    argv.argv = {"printf", "%s|", "a b", "c;d", "$HOME"};
    const auto printed = t.exec(box.id, argv);
    REQUIRE_MESSAGE(printed.has_value(), printed.error().detail);
    CHECK(printed->out.text() == "a b|c;d|$HOME|");
    moat::exec_request missing;
    missing.argv = {"/nonexistent/program"};
    const auto not_found = t.exec(box.id, missing);
    // A program that cannot start is the program's outcome (127), or a caller error; never a hang.
    if (not_found.has_value()) {
        CHECK(not_found->exit_code != 0);
    } else {
        CHECK_MESSAGE(is(not_found.error(), errc::invalid_argument), not_found.error().detail);
    }
    t.destroy(box.id);
}

TEST_CASE_TEMPLATE(
    "exec keeps head and tail past the output cap and ends a command past its "
    "wall limit with 124, leaving no process",
    Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const auto box = t.create();
    moat::exec_request loud = moat::test::shell(
        "head -c 100000 /dev/zero | tr '\\0' a; head -c 50000 /dev/zero | tr '\\0' b >&2");
    loud.output.head_bytes = 1000;
    loud.output.tail_bytes = 500;
    const auto capped = t.exec(box.id, loud);
    REQUIRE_MESSAGE(capped.has_value(), capped.error().detail);
    CHECK(capped->exit_code == 0);
    CHECK(capped->out.total_bytes == 100000);
    CHECK(capped->out.head == std::string(1000, 'a'));
    CHECK(capped->out.tail == std::string(500, 'a'));
    CHECK(capped->out.omitted_bytes == 98500);
    CHECK(capped->out.is_truncated());
    CHECK(capped->err.total_bytes == 50000);
    CHECK(capped->err.head == std::string(1000, 'b'));
    CHECK(capped->err.omitted_bytes == 48500);

    const auto late = t.sh(box.id, "echo begun; sleep 4321; echo never", 700ms);
    CHECK(late.timed_out);
    CHECK(late.exit_code == 124);
    CHECK(late.out.text() == "begun\n");
    t.check_nothing_left(box.id, "sleep 4321", "past the wall limit");
    CHECK(t.sh(box.id, "echo after").out.text() == "after\n");
    t.destroy(box.id);
}

// ---- streams and background processes --------------------------------------------------------

TEST_CASE_TEMPLATE("exec_stream delivers each stream in order, all of it, and the result last",
                   Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const auto box = t.create();
    auto stream = t.run(t.b->async_exec_stream(
        box.id, moat::test::shell("for i in 1 2 3; do echo line$i; echo err$i >&2; done; exit 5")));
    REQUIRE_MESSAGE(stream.has_value(), stream.error().detail);
    const auto d = t.run(drain(*stream));
    REQUIRE_MESSAGE(d.result.has_value(), (d.failure ? d.failure->detail : ""));
    CHECK(d.out == "line1\nline2\nline3\n");
    CHECK(d.err == "err1\nerr2\nerr3\n");
    CHECK(d.result->exit_code == 5);
    CHECK(d.result->out.head.empty());

    auto big = t.run(t.b->async_exec_stream(
        box.id, moat::test::shell("head -c 3000000 /dev/zero | tr '\\0' x")));
    REQUIRE(big.has_value());
    const auto all = t.run(drain(*big));
    REQUIRE(all.result.has_value());
    CHECK(all.out.size() == 3000000);
    CHECK(all.out.find_first_not_of('x') == std::string::npos);
    CHECK(all.result->exit_code == 0);
    t.destroy(box.id);
}

TEST_CASE_TEMPLATE("a spawned process reads stdin until it is closed and ends on a signal", Kind,
                   MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const auto box = t.create();
    moat::exec_request cat_request;
    cat_request.argv = {"cat"};
    auto cat = t.run(t.b->async_spawn(box.id, cat_request));
    REQUIRE_MESSAGE(cat.has_value(), cat.error().detail);
    CHECK(cat->pid() > 0);
    auto wrote = t.run(cat->async_write_stdin("hello\n"));
    REQUIRE_MESSAGE(wrote.has_value(), wrote.error().detail);
    CHECK(t.run(read_out(*cat, 6)) == "hello\n");
    REQUIRE(t.run(cat->async_write_stdin("world")).has_value());
    REQUIRE(t.run(cat->async_close_stdin()).has_value());
    const auto closed_write = t.run(cat->async_write_stdin("late"));
    REQUIRE(!closed_write.has_value());
    CHECK_MESSAGE(is(closed_write.error(), errc::invalid_argument), closed_write.error().detail);
    const auto cat_end = t.run(drain(*cat));
    REQUIRE(cat_end.result.has_value());
    CHECK(cat_end.out == "world");
    CHECK(cat_end.result->exit_code == 0);

    moat::exec_request sleeper;
    sleeper.argv = {"sleep", "5555"};
    auto terminated = t.run(t.b->async_spawn(box.id, sleeper));
    REQUIRE(terminated.has_value());
    CHECK(moat::test::eventually([&] { return !t.host_processes(box.id, "sleep 5555").empty(); }));
    REQUIRE(t.run(terminated->async_signal(SIGTERM)).has_value());
    const auto term_end = t.run(drain(*terminated));
    REQUIRE(term_end.result.has_value());
    CHECK(term_end.result->signal == SIGTERM);
    CHECK(term_end.result->exit_code == 128 + SIGTERM);
    CHECK(t.host_processes(box.id, "sleep 5555").empty());

    sleeper.argv = {"sleep", "5556"};
    auto killed = t.run(t.b->async_spawn(box.id, sleeper));
    REQUIRE(killed.has_value());
    const auto sent = t.run(t.b->async_signal(box.id, killed->id(), SIGKILL));
    REQUIRE_MESSAGE(sent.has_value(), sent.error().detail);
    const auto kill_end = t.run(drain(*killed));
    REQUIRE(kill_end.result.has_value());
    CHECK(kill_end.result->signal == SIGKILL);
    CHECK(kill_end.result->exit_code == 128 + SIGKILL);
    CHECK(t.host_processes(box.id, "sleep 5556").empty());
    t.destroy(box.id);
}

TEST_CASE_TEMPLATE("a resident outlives its dropped handle and ends with its sandbox", Kind,
                   MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const auto box = t.create();
    moat::exec_request service;
    service.argv = {"sleep", "7777"};
    service.wall_limit = moat::exec_request::max_spawn_wall_limit;
    service.resident = true;
    {
        auto spawned = t.run(t.b->async_spawn(box.id, service));
        REQUIRE_MESSAGE(spawned.has_value(), spawned.error().detail);
        CHECK(moat::test::eventually(
            [&] { return !t.host_processes(box.id, "sleep 7777").empty(); }));
    }
    // A non-resident's drop kills it over the same executor: give that every chance to happen
    // (two round trips and a while of the executor) before looking.
    moat::exec_request plain;
    plain.argv = {"sleep", "7778"};
    {
        auto dropped = t.run(t.b->async_spawn(box.id, plain));
        REQUIRE(dropped.has_value());
        CHECK(moat::test::eventually(
            [&] { return !t.host_processes(box.id, "sleep 7778").empty(); }));
    }
    (void)t.sh(box.id, "true");
    t.check_nothing_left(box.id, "sleep 7778", "a dropped spawn", false);
    (void)t.sh(box.id, "true");
    REQUIRE_MESSAGE(t.host_processes(box.id, "sleep 7777").size() == 1,
                    "the resident did not survive its handle");
    const pid_t resident = t.host_processes(box.id, "sleep 7777").front();
    t.destroy(box.id);
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(resident); }));
}

TEST_CASE_TEMPLATE(
    "the tool layer runs on the backend: its layout, Python cells sharing one interpreter, files",
    Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    CHECK(t.b->layout_for({}).home == Kind::home);
    CHECK(t.b->layout_for({}).workdir == Kind::home);
    moat::runtime rt(*t.b);
    moat::session_manager manager(rt, moat::manager_options{});
    moat::tool_session tools(manager, "conformance");
    CHECK(tools.layout().workdir == Kind::home);
    CHECK(tools.layout().artifacts_dir == std::string(Kind::home) + "/out");
    bool described = false;
    for (const auto& definition : tools.definitions()) {
        if (definition.name == "run_shell") {
            described = definition.description.find(Kind::home) != std::string::npos;
        }
    }
    CHECK_MESSAGE(described, "run_shell's description does not name " << Kind::home);

    auto first = t.run(tools.async_run_python("import os\nx = 41\nprint(os.getpid())"));
    REQUIRE(first.has_value());
    INFO(first->to_json());
    CHECK(first->status == moat::tool_status::ok);
    auto second = t.run(tools.async_run_python("print(x + 1)\nprint(os.getpid())"));
    REQUIRE(second.has_value());
    INFO(second->to_json());
    CHECK(second->status == moat::tool_status::ok);
    CHECK(second->stdout_text == "42\n" + first->stdout_text);
    auto wrote = t.run(tools.async_call("write_file", R"({"path": "out/r.txt", "content": "hi"})"));
    REQUIRE(wrote.has_value());
    CHECK(wrote->status == moat::tool_status::ok);
    CHECK(wrote->path == std::string(Kind::home) + "/out/r.txt");
    auto seen = t.run(tools.async_run_python("print(open('out/r.txt').read())"));
    REQUIRE(seen.has_value());
    CHECK(seen->stdout_text == "hi\n");
    // A cell past its limit is interrupted through the backend's stdin while its output streams,
    // and the interpreter keeps its state; a figure lands in the layout's artifacts directory.
    auto slow = t.run(tools.async_run_python(
        "import time\nprint('waiting', flush=True)\nwhile True:\n    time.sleep(0.05)",
        std::chrono::milliseconds(1000)));
    REQUIRE(slow.has_value());
    INFO(slow->to_json());
    CHECK(slow->status == moat::tool_status::timeout);
    CHECK(slow->error_type == "KeyboardInterrupt");
    CHECK(t.run(tools.async_run_python("x"))->stdout_text == "41\n");
    auto chart = t.run(tools.async_run_python("import matplotlib.pyplot as plt\nplt.plot([1, 2])"));
    REQUIRE(chart.has_value());
    REQUIRE(chart->images.size() == 1);
    auto png = t.run(tools.async_read_artifact(chart->images[0].path));
    REQUIRE(png.has_value());
    CHECK(png->size() == chart->images[0].size);
    REQUIRE(t.run(tools.async_end()).has_value());
    (void)t.run(manager.async_shutdown());
}

// ---- files ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE(
    "files round-trip binary content, refuse symlink escapes, name per-path errors and enforce "
    "limits",
    Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const auto box = t.create();
    const std::string home = Kind::home;
    std::string binary;
    for (int i = 0; i < 4096; ++i) {
        for (int c = 0; c < 256; ++c) binary += static_cast<char>(c);
    }
    std::vector<moat::file_write> writes = {{home + "/bin.dat", binary, 0644},
                                            {home + "/small.txt", "hi", 0644},
                                            {home + "/missing/x.txt", "x", 0644},
                                            {"relative.txt", "x", 0644}};
    const auto written = t.run(t.b->async_write_files(box.id, writes));
    REQUIRE_MESSAGE(written.has_value(), written.error().detail);
    REQUIRE(written->size() == 4);
    CHECK((*written)[0].outcome.has_value());
    CHECK((*written)[1].outcome.has_value());
    REQUIRE(!(*written)[2].outcome.has_value());
    CHECK_MESSAGE(is((*written)[2].outcome.error(), errc::file_not_found),
                  (*written)[2].outcome.error().detail);
    REQUIRE(!(*written)[3].outcome.has_value());
    CHECK(is((*written)[3].outcome.error(), errc::invalid_path));
    CHECK(t.sh(box.id, "test -e \"$HOME/missing\" || echo absent").out.text() == "absent\n");

    const auto read = t.run(t.b->async_read_files(
        box.id, {home + "/bin.dat", home + "/small.txt", home + "/nope", home}));
    REQUIRE(read.has_value());
    REQUIRE(read->size() == 4);
    REQUIRE((*read)[0].content.has_value());
    CHECK(*(*read)[0].content == binary);
    CHECK(*(*read)[1].content == "hi");
    REQUIRE(!(*read)[2].content.has_value());
    CHECK(is((*read)[2].content.error(), errc::file_not_found));
    REQUIRE(!(*read)[3].content.has_value());
    CHECK(is((*read)[3].content.error(), errc::is_directory));
    // Seen by a command, not by the file API: the size and bytes 255..257 (255, 0, 1).
    CHECK(t.sh(box.id, "wc -c < \"$HOME/bin.dat\"").out.text() == "1048576\n");
    CHECK(t.sh(box.id, "od -An -tu1 -j 255 -N 3 \"$HOME/bin.dat\" | tr -s ' '").out.text() ==
          " 255 0 1\n");

    const auto stat = t.run(t.b->async_stat(box.id, home + "/bin.dat"));
    REQUIRE_MESSAGE(stat.has_value(), stat.error().detail);
    CHECK(stat->type == moat::file_type::regular);
    CHECK(stat->size == binary.size());
    CHECK(stat->mode == 0644);
    const auto listing = t.run(t.b->async_list_dir(box.id, home));
    REQUIRE_MESSAGE(listing.has_value(), listing.error().detail);
    std::vector<std::string> names;
    for (const auto& e : *listing) names.push_back(e.name);
    CHECK(std::is_sorted(names.begin(), names.end()));
    CHECK(std::find(names.begin(), names.end(), "bin.dat") != names.end());
    CHECK(std::find(names.begin(), names.end(), "small.txt") != names.end());
    const auto not_dir = t.run(t.b->async_list_dir(box.id, home + "/small.txt"));
    REQUIRE(!not_dir.has_value());
    CHECK(is(not_dir.error(), errc::invalid_path));

    // Symlinks planted inside resolve against the sandbox's own root, never the host's.
    const std::string secret = "/tmp/moat-conformance-secret-" + unique_value();
    const std::string planted = "/tmp/moat-conformance-planted-" + unique_value();
    {
        std::ofstream out(secret);
        out << "host secret";
    }
    CHECK(t.sh(box.id, "ln -s " + secret + " \"$HOME/escape\" && ln -s ../../../../../.." + secret +
                           " \"$HOME/climb\" && ln -s /tmp \"$HOME/tmplink\"")
              .exit_code == 0);
    const auto escaped = t.run(t.b->async_read_files(box.id, {home + "/escape", home + "/climb"}));
    REQUIRE(escaped.has_value());
    for (const auto& r : *escaped) {
        REQUIRE_MESSAGE(!r.content.has_value(), r.path << " read the host's file");
        CHECK_MESSAGE(is(r.content.error(), errc::file_not_found), r.content.error().detail);
    }
    const auto link_stat = t.run(t.b->async_stat(box.id, home + "/escape"));
    REQUIRE(link_stat.has_value());
    CHECK(link_stat->type == moat::file_type::symlink);
    std::vector<moat::file_write> through = {
        {home + "/tmplink/" + planted.substr(5), "planted", 0644},
        {home + "/escape", "replaced the link", 0644}};
    const auto through_written = t.run(t.b->async_write_files(box.id, through));
    REQUIRE(through_written.has_value());
    CHECK((*through_written)[0].outcome.has_value());  // into the sandbox's own /tmp
    CHECK((*through_written)[1].outcome.has_value());  // the link replaced, not its target
    CHECK(::access(planted.c_str(), F_OK) != 0);
    CHECK(moat::test::read_file(secret) == "host secret");
    CHECK(t.sh(box.id, "cat " + planted).out.text() == "planted");
    CHECK(t.sh(box.id, "test -L \"$HOME/escape\" || cat \"$HOME/escape\"").out.text() ==
          "replaced the link");
    ::unlink(secret.c_str());

    // Limits: a file past max_file_bytes is too_large for its path; a batch past max_files is
    // too_large as a whole, and nothing is done.
    CHECK(t.sh(box.id, "head -c 10485761 /dev/zero > \"$HOME/big\"").exit_code == 0);
    const auto big = t.run(t.b->async_read_files(box.id, {home + "/big", home + "/small.txt"}));
    REQUIRE(big.has_value());
    REQUIRE(!(*big)[0].content.has_value());
    CHECK_MESSAGE(is((*big)[0].content.error(), errc::too_large), (*big)[0].content.error().detail);
    CHECK((*big)[1].content.has_value());
    std::vector<moat::file_write> many;
    for (std::size_t i = 0; i <= moat::file_limits{}.max_files; ++i) {
        many.push_back({home + "/many-" + std::to_string(i), "x", 0644});
    }
    const auto too_many = t.run(t.b->async_write_files(box.id, many));
    REQUIRE(!too_many.has_value());
    CHECK(is(too_many.error(), errc::too_large));
    CHECK(t.sh(box.id, "ls \"$HOME\" | grep -c many- || true").out.text() == "0\n");
    t.destroy(box.id);
}

namespace {

struct source_state {
    std::size_t chunks = 0;
    std::size_t chunk_bytes = 0;
    std::size_t sent = 0;
    std::optional<std::size_t> fail_after;  // chunks
};

std::string chunk_content(std::size_t index, std::size_t bytes) {
    std::string s(bytes, '\0');
    for (std::size_t i = 0; i < bytes; ++i) s[i] = static_cast<char>((index * 31 + i * 7) & 0xff);
    return s;
}

asio::awaitable<moat::result<std::string>> next_chunk(std::shared_ptr<source_state> s) {
    if (s->fail_after && s->sent == *s->fail_after) {
        co_return moat::make_error(errc::backend_failure, "the test's source failed on purpose");
    }
    if (s->sent == s->chunks) co_return std::string();
    co_return chunk_content(s->sent++, s->chunk_bytes);
}

moat::byte_source make_source(std::shared_ptr<source_state> s) {
    return [s] { return next_chunk(s); };
}

asio::awaitable<moat::result<std::string>> read_whole(moat::file_read_stream& stream) {
    std::string all;
    for (;;) {
        auto next = co_await stream.async_next();
        if (!next) co_return next.error();
        if (next->empty()) co_return all;
        all += *next;
    }
}

}  // namespace

TEST_CASE_TEMPLATE("streamed files write atomically, create parents on request and read back whole",
                   Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const auto box = t.create();
    const std::string home = Kind::home;
    auto whole = std::make_shared<source_state>();
    whole->chunks = 48;
    whole->chunk_bytes = 64 * 1024;
    std::string expected;
    for (std::size_t i = 0; i < whole->chunks; ++i)
        expected += chunk_content(i, whole->chunk_bytes);
    moat::file_write_target deep;
    deep.path = home + "/deep/er/file.bin";
    deep.create_parents = true;
    const auto wrote = t.run(t.b->async_write_file_stream(box.id, deep, make_source(whole)));
    REQUIRE_MESSAGE(wrote.has_value(), wrote.error().detail);
    REQUIRE_MESSAGE(wrote->outcome.has_value(), wrote->outcome.error().detail);
    auto reading = t.run(t.b->async_read_file_stream(box.id, deep.path));
    REQUIRE_MESSAGE(reading.has_value(), reading.error().detail);
    CHECK(reading->stat().size == expected.size());
    const auto content = t.run(read_whole(*reading));
    REQUIRE_MESSAGE(content.has_value(), content.error().detail);
    CHECK(content->size() == expected.size());
    CHECK(*content == expected);

    // Without create_parents a missing directory is file_not_found.
    moat::file_write_target orphan;
    orphan.path = home + "/nowhere/file.bin";
    auto one = std::make_shared<source_state>();
    one->chunks = 1;
    one->chunk_bytes = 10;
    const auto no_parent = t.run(t.b->async_write_file_stream(box.id, orphan, make_source(one)));
    REQUIRE(no_parent.has_value());
    REQUIRE(!no_parent->outcome.has_value());
    CHECK_MESSAGE(is(no_parent->outcome.error(), errc::file_not_found),
                  no_parent->outcome.error().detail);

    // A source that fails midway, or a file past its cap, leaves the target as it was.
    const std::vector<moat::file_write> old = {{home + "/atomic.txt", "old", 0644}};
    REQUIRE(t.run(t.b->async_write_files(box.id, old)).has_value());
    moat::file_write_target atomic;
    atomic.path = home + "/atomic.txt";
    auto failing = std::make_shared<source_state>();
    failing->chunks = 10;
    failing->chunk_bytes = 64 * 1024;
    failing->fail_after = 3;
    const auto failed = t.run(t.b->async_write_file_stream(box.id, atomic, make_source(failing)));
    REQUIRE(failed.has_value());
    REQUIRE(!failed->outcome.has_value());
    CHECK(failed->outcome.error().detail.find("atomic.txt") != std::string::npos);
    atomic.max_bytes = 1000;
    auto oversized = std::make_shared<source_state>();
    oversized->chunks = 2;
    oversized->chunk_bytes = 1000;
    const auto capped = t.run(t.b->async_write_file_stream(box.id, atomic, make_source(oversized)));
    REQUIRE(capped.has_value());
    REQUIRE(!capped->outcome.has_value());
    CHECK_MESSAGE(is(capped->outcome.error(), errc::too_large), capped->outcome.error().detail);
    const auto kept = t.run(t.b->async_read_files(box.id, {atomic.path}));
    REQUIRE(kept.has_value());
    REQUIRE((*kept)[0].content.has_value());
    CHECK(*(*kept)[0].content == "old");
    CHECK(t.sh(box.id, "ls -a \"$HOME\" | grep -v -x -e . -e .. -e atomic.txt -e deep | wc -l")
              .out.text() == "0\n");

    const auto missing = t.run(t.b->async_read_file_stream(box.id, home + "/nope"));
    REQUIRE(!missing.has_value());
    CHECK(is(missing.error(), errc::file_not_found));
    t.destroy(box.id);
}

TEST_CASE_TEMPLATE(
    "file metadata is written with a file, read back through a symlink and replaced "
    "by the next write",
    Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const auto box = t.create();
    const std::string home = Kind::home;
    const auto write = [&](const std::string& path, moat::file_metadata metadata,
                           std::uint32_t mode) {
        moat::file_write_target target;
        target.path = path;
        target.mode = mode;
        target.metadata = std::move(metadata);
        auto one = std::make_shared<source_state>();
        one->chunks = 1;
        one->chunk_bytes = 10;
        auto r = t.run(t.b->async_write_file_stream(box.id, target, make_source(one)));
        REQUIRE_MESSAGE(r.has_value(), r.error().detail);
        return r->outcome;
    };
    const auto read = [&](std::vector<std::string> paths) {
        auto r = t.run(t.b->async_read_metadata(box.id, std::move(paths)));
        REQUIRE_MESSAGE(r.has_value(), r.error().detail);
        return std::move(*r);
    };
    const auto written = write(home + "/m.txt", {{"Owner", "ada"}, {"x", "a b&c=d"}}, 0600);
    REQUIRE_MESSAGE(written.has_value(), written.error().detail);
    const moat::file_metadata expected{{"owner", "ada"}, {"x", "a b&c=d"}};
    // Inside, the attributes are where E2B's envd puts them.
    const auto inside = t.sh(box.id,
                             "python3 -I -S -c 'import os; p=os.path.expanduser(\"~/m.txt\"); "
                             "print(sorted(os.listxattr(p)), os.getxattr(p, \"user.e2b.x\"))'; "
                             "stat -c %a \"$HOME/m.txt\"; ln -s m.txt \"$HOME/m.link\"");
    CHECK(inside.out.text() == "['user.e2b.owner', 'user.e2b.x'] b'a b&c=d'\n600\n");
    auto got = read({home + "/m.txt", home + "/m.link", home + "/absent"});
    REQUIRE(got.size() == 3);
    REQUIRE_MESSAGE(got[0].metadata.has_value(), got[0].metadata.error().detail);
    CHECK(*got[0].metadata == expected);
    REQUIRE_MESSAGE(got[1].metadata.has_value(), got[1].metadata.error().detail);
    CHECK(*got[1].metadata == expected);
    REQUIRE(!got[2].metadata.has_value());
    CHECK(is(got[2].metadata.error(), errc::file_not_found));

    const auto replaced = write(home + "/m.txt", {{"new", "1"}}, 0644);
    REQUIRE_MESSAGE(replaced.has_value(), replaced.error().detail);
    got = read({home + "/m.txt"});
    REQUIRE(got[0].metadata.has_value());
    CHECK(*got[0].metadata == moat::file_metadata{{"new", "1"}});

    // A key that breaks the rules fails the write and keeps the file as it was.
    const auto refused = write(home + "/m.txt", {{"bad key", "1"}}, 0644);
    REQUIRE(!refused.has_value());
    CHECK_MESSAGE(is(refused.error(), errc::invalid_argument), refused.error().detail);
    got = read({home + "/m.txt"});
    REQUIRE(got[0].metadata.has_value());
    CHECK(*got[0].metadata == moat::file_metadata{{"new", "1"}});
    CHECK(t.sh(box.id, "ls -a \"$HOME\" | grep -c moat-upload").out.text() == "0\n");
    t.destroy(box.id);
}

// ---- cancellation ---------------------------------------------------------------------------

namespace {

struct store_exec {
    std::optional<moat::result<moat::exec_result>>* outcome;
    void operator()(std::exception_ptr e, moat::result<moat::exec_result> r) const {
        if (e) {
            std::string what = "the exec coroutine threw";
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& x) {
                what += std::string(": ") + x.what();
            } catch (...) {
            }
            // An exception escaping a backend operation breaks its contract: never cancelled.
            *outcome = moat::make_error(errc::backend_failure, what);
        } else {
            *outcome = std::move(r);
        }
    }
};

// The exec, noting when it began: the cancellation points count from there (the event loop may
// run other handlers first, and a cancellation that reaches co_spawn before its coroutine began
// makes co_spawn itself throw, before the backend is called).
asio::awaitable<moat::result<moat::exec_result>> exec_noting_start(bool* began, moat::backend& b,
                                                                   std::string id,
                                                                   moat::exec_request request) {
    *began = true;
    co_return co_await b.async_exec(std::move(id), std::move(request));
}

asio::awaitable<moat::result<moat::exec_result>> exec_within(moat::backend& b, std::string id,
                                                             moat::exec_request request,
                                                             std::chrono::milliseconds limit) {
    auto operation = b.async_exec(std::move(id), std::move(request));
    co_return co_await moat::with_timeout(std::move(operation), moat::deadline::after(limit));
}

asio::awaitable<moat::result<std::string>> first_chunk_then_drop(moat::backend& b, std::string id,
                                                                 moat::exec_request request) {
    auto stream = co_await b.async_exec_stream(std::move(id), std::move(request));
    if (!stream) co_return stream.error();
    auto next = co_await stream->async_next();
    if (!next) co_return next.error();
    auto* chunk = std::get_if<moat::output_chunk>(&*next);
    if (chunk == nullptr) co_return moat::make_error(errc::backend_failure, "ended early");
    co_return chunk->data;  // the stream is dropped here, before the command's end
}

}  // namespace

TEST_CASE_TEMPLATE(
    "cancelling or timing out an exec at many points kills it and leaves no process on the host",
    Kind, MOAT_CONFORMANCE_KINDS) {
    MOAT_REQUIRE_NAMESPACES();
    conformance<Kind> t;
    const auto box = t.create();
    // Terminal cancellation after k turns of the event loop once the exec began: as the request
    // leaves, while the command starts, once it runs. Each point has its own marker, so a leftover
    // names its point.
    int points_running = 0;
    for (int k : {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256}) {
        const std::string marker = "sleep " + std::to_string(7000 + k);
        moat::exec_request request = moat::test::shell("echo started; " + marker + "; echo never");
        asio::cancellation_signal cancel;
        std::optional<moat::result<moat::exec_result>> outcome;
        bool began = false;
        asio::co_spawn(t.io, exec_noting_start(&began, *t.b, box.id, request),
                       asio::bind_cancellation_slot(cancel.slot(), store_exec{&outcome}));
        const auto start_limit = std::chrono::steady_clock::now() + 30s;
        while (!began && std::chrono::steady_clock::now() < start_limit) t.io.run_one_for(100ms);
        REQUIRE(began);
        for (int i = 0; i < k && !outcome; ++i) t.io.run_one_for(100ms);
        const bool was_running = !t.host_processes(box.id, marker).empty();
        cancel.emit(asio::cancellation_type::terminal);
        const auto limit = std::chrono::steady_clock::now() + 30s;
        while (!outcome && std::chrono::steady_clock::now() < limit) t.io.run_one_for(10ms);
        REQUIRE_MESSAGE(outcome.has_value(), "point " << k << ": no outcome within 30 s");
        REQUIRE_MESSAGE(!outcome->has_value(), "point " << k << ": the exec finished");
        CHECK_MESSAGE(is(outcome->error(), errc::cancelled),
                      "point " << k << ": " << outcome->error().detail);
        t.check_nothing_left(box.id, marker, "point " + std::to_string(k));
        if (was_running && ++points_running >= 3) break;
    }
    CHECK(points_running > 0);  // the later points cancelled a command that had started

    // Deadlines, from before the start to well into the run.
    for (auto limit : {0ms, 5ms, 50ms, 300ms, 1000ms}) {
        const std::string marker = "sleep " + std::to_string(8000 + limit.count());
        const auto r = t.run(exec_within(*t.b, box.id, moat::test::shell(marker), limit));
        REQUIRE_MESSAGE(!r.has_value(), limit.count() << " ms: the exec finished");
        CHECK_MESSAGE(is(r.error(), errc::deadline_exceeded), limit.count()
                                                                  << " ms: " << r.error().detail);
        t.check_nothing_left(box.id, marker, std::to_string(limit.count()) + " ms deadline");
    }

    // A stream dropped before its end kills its command.
    const auto first =
        t.run(first_chunk_then_drop(*t.b, box.id, moat::test::shell("echo started; sleep 8999")));
    REQUIRE_MESSAGE(first.has_value(), first.error().detail);
    CHECK(*first == "started\n");
    t.check_nothing_left(box.id, "sleep 8999", "a dropped stream", false);

    CHECK(t.sh(box.id, "echo still-usable").out.text() == "still-usable\n");
    const pid_t init = t.pid1(box.id);
    t.destroy(box.id);
    CHECK(moat::test::is_gone(init));
}
