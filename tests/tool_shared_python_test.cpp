// The session's Python interpreter as a resident of the sandbox: two workers (two local backends,
// two runtimes, two managers, two tool sessions) attached to one survive_owner sandbox reach the
// same interpreter, whichever of them serves the turn, and it outlives the worker that started it.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/session_store.hpp>
#include <moat/tools.hpp>

#include "support/async_wait.hpp"
#include "support/local_fixture.hpp"

#include <memory>
#include <optional>
#include <string>
#include <thread>

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

moat::manager_options shared_options(const std::string& label,
                                     std::chrono::milliseconds idle_timeout) {
    moat::manager_options o;
    o.spec.survive_owner = true;
    o.spec.ttl = 10min;
    o.spec.labels["test"] = label;
    o.idle_timeout = idle_timeout;
    return o;
}

// One worker: its own backend (and helper), runtime, manager and tool session for the key
// "conversation", over the store the workers share.
struct worker {
    explicit worker(std::shared_ptr<moat::session_store> store,
                    const std::string& label = "shared-python",
                    std::chrono::milliseconds idle_timeout = 10min) {
        rt = std::make_unique<moat::runtime>(*fixture.local);
        manager = std::make_unique<moat::session_manager>(*rt, shared_options(label, idle_timeout),
                                                          std::move(store));
        tools = std::make_unique<moat::tool_session>(*manager, "conversation");
    }
    ~worker() { leave(); }

    // Goes away without ending the conversation (the process of a worker exiting): the manager
    // lets go of the sandbox, the backend detaches from it.
    void leave() {
        if (!manager) return;
        tools.reset();
        manager.reset();
        rt.reset();
        fixture.shut_down();
    }

    moat::tool_result python(const std::string& code,
                             std::optional<std::chrono::milliseconds> timeout = {}) {
        auto r = fixture.run(tools->async_run_python(code, timeout));
        REQUIRE_MESSAGE(r, (r ? std::string() : r.error().to_string()));
        return *r;
    }

    local_fixture fixture;
    std::unique_ptr<moat::runtime> rt;
    std::unique_ptr<moat::session_manager> manager;
    std::unique_ptr<moat::tool_session> tools;
};

}  // namespace

TEST_CASE(
    "two workers on one sandbox alternate run_python and read each other's variables, the "
    "numbering runs on across them, and the interpreter outlives the worker that started it") {
    MOAT_REQUIRE_NAMESPACES();
    auto store = moat::make_memory_session_store();
    worker a(store);
    auto set = a.python("x = 41\nimport os\nos.getpid()");
    REQUIRE(set.status == moat::tool_status::ok);
    const std::string pid = set.stdout_text;
    const auto box = a.tools->current_sandbox();
    REQUIRE(box);

    worker b(store);
    auto read = b.python("x += 1\nprint(x)");
    CHECK(read.status == moat::tool_status::ok);
    CHECK(read.stdout_text == "42\n");
    CHECK(read.notices.empty());
    CHECK(b.tools->current_sandbox()->id == box->id);

    auto back = a.python("y = 'from a'\nprint(x)");
    CHECK(back.stdout_text == "42\n");
    auto other = b.python("print(y)\nimport os\nos.getpid()");
    CHECK(other.stdout_text == "from a\n" + pid);

    // The worker whose cell started the interpreter goes away: its connection to the sandbox
    // closes and its processes end, the interpreter does not.
    a.leave();
    auto after = b.python("print(x, y)");
    CHECK(after.status == moat::tool_status::ok);
    CHECK(after.stdout_text == "42 from a\n");
    CHECK(after.notices.empty());
    auto cells = b.fixture.run(b.tools->async_run_shell("ls .cells"));
    REQUIRE(cells);
    CHECK(cells->stdout_text.find("001.py\n002.py\n003.py\n004.py\n005.py\n") != std::string::npos);
    REQUIRE(b.fixture.run(b.tools->async_end()));
    (void)b.fixture.run(b.manager->async_shutdown());
}

TEST_CASE(
    "a cell past its limit on one worker restarts the shared interpreter, and both workers are "
    "told once") {
    MOAT_REQUIRE_NAMESPACES();
    auto store = moat::make_memory_session_store();
    worker a(store);
    REQUIRE(a.python("x = 1").status == moat::tool_status::ok);
    worker b(store);
    REQUIRE(b.python("print(x)").stdout_text == "1\n");

    auto slow = a.python(ignores_interrupts, 1s);
    CHECK(slow.status == moat::tool_status::timeout);
    CHECK(has_notice(slow, "interpreter restarted"));

    auto lost = b.python("print(x)");
    CHECK(lost.status == moat::tool_status::error);
    CHECK(lost.error_type == "NameError");
    CHECK(has_notice(lost, "interpreter restarted"));
    CHECK_FALSE(has_notice(b.python("x = 2"), "interpreter restarted"));

    // The worker that saw the timeout was told with it: not again.
    auto again = a.python("print(x)");
    CHECK(again.stdout_text == "2\n");
    CHECK_FALSE(has_notice(again, "interpreter restarted"));
    REQUIRE(a.fixture.run(a.tools->async_end()));
    (void)a.fixture.run(a.manager->async_shutdown());
}

TEST_CASE(
    "a worker's cell waits for another worker's cell, bounded, then says busy and never runs") {
    MOAT_REQUIRE_NAMESPACES();
    auto store = moat::make_memory_session_store();
    worker a(store);
    REQUIRE(a.python("import os, time").status == moat::tool_status::ok);
    worker b(store);
    // A's cell holds the interpreter until the test lets it go (a file B writes).
    // (On its own thread, which drives A's io_context; checked on this one.)
    std::optional<moat::result<moat::tool_result>> held;
    std::thread holder([&] {
        held =
            a.fixture.run(a.tools->async_run_python("open('started', 'w').close()\n"
                                                    "for _ in range(6000):\n"
                                                    "    if os.path.exists('release'):\n"
                                                    "        break\n"
                                                    "    time.sleep(0.01)\n"
                                                    "print('released')",
                                                    90s));
    });
    bool started = false;
    for (int i = 0; i < 600 && !started; ++i) {
        auto probe = b.fixture.run(b.tools->async_read_file("started"));
        started = probe && probe->status == moat::tool_status::ok;
        if (!started) std::this_thread::sleep_for(10ms);
    }
    CHECK(started);
    auto busy = b.python("print('never')", 1s);
    CHECK(busy.status == moat::tool_status::error);
    CHECK(busy.error_code == "busy");
    CHECK(busy.stdout_text.empty());
    // A cell too big for the connection's buffers is cut short when the wait ends: busy too.
    auto big = b.python(std::string(4 << 20, '#') + "\nopen('big-ran', 'w').close()", 1s);
    CHECK(big.status == moat::tool_status::error);
    CHECK(big.error_code == "busy");
    REQUIRE(b.fixture.run(b.tools->async_write_file("release", "")));
    holder.join();
    REQUIRE(held);
    REQUIRE(*held);
    CHECK((*held)->stdout_text == "released\n");
    auto after = b.python("print('ran')");
    CHECK(after.stdout_text == "ran\n");
    CHECK(after.notices.empty());
    // The cell that did not get the turn never ran, not even once the turn was free: three cells.
    auto cells = b.fixture.run(b.tools->async_run_shell("ls .cells"));
    REQUIRE(cells);
    CHECK(cells->stdout_text == "001.py\n002.py\n003.py\n");
    auto listed = b.fixture.run(b.tools->async_run_shell("ls"));
    REQUIRE(listed);
    CHECK(listed->stdout_text.find("big-ran") == std::string::npos);
    REQUIRE(b.fixture.run(b.tools->async_end()));
    (void)b.fixture.run(b.manager->async_shutdown());
}

TEST_CASE(
    "on the local backend a cell reaches the shared interpreter without starting a process: one "
    "spawn (the supervisor) for many cells from two workers") {
    MOAT_REQUIRE_NAMESPACES();
    auto store = moat::make_memory_session_store();
    worker a(store);
    worker b(store);
    for (int i = 0; i < 5; ++i) {
        CHECK(a.python("n = " + std::to_string(i)).status == moat::tool_status::ok);
        CHECK(b.python("print(n)").stdout_text == std::to_string(i) + "\n");
    }
    const auto spawns = [](const worker& w) {
        const auto m = w.rt->metrics();
        const auto found = m.operations.find("spawn");
        return found == m.operations.end() ? std::uint64_t{0} : found->second;
    };
    const auto connects = [](const worker& w) {
        const auto m = w.rt->metrics();
        const auto found = m.operations.find("connect_unix");
        return found == m.operations.end() ? std::uint64_t{0} : found->second;
    };
    CHECK(spawns(a) + spawns(b) == 1);
    CHECK(connects(a) >= 5);
    CHECK(connects(b) >= 5);
    REQUIRE(a.fixture.run(a.tools->async_end()));
    (void)a.fixture.run(a.manager->async_shutdown());
}

TEST_CASE(
    "a rebuild reaches the model once across two workers, whether the sandbox was destroyed "
    "behind their backs or the session idled out and came back") {
    MOAT_REQUIRE_NAMESPACES();
    auto store = moat::make_memory_session_store();
    const std::string label = "shared-python-rebuild";
    worker a(store, label, 3s);
    worker b(store, label, 3s);
    REQUIRE(a.python("x = 1").status == moat::tool_status::ok);
    REQUIRE(b.python("print(x)").stdout_text == "1\n");
    const auto first = a.tools->current_sandbox();
    REQUIRE(first);

    // Destroyed behind both workers' backs: whichever serves the next turn rebuilds and tells
    // the model; the other worker's next turn is on the same new sandbox and says nothing.
    REQUIRE(a.fixture.run(a.fixture.local->async_destroy(first->id)));
    auto told = a.python("print('x' in globals())");
    CHECK(told.stdout_text == "False\n");
    CHECK(has_notice(told, "rebuilt"));
    auto quiet = b.python("print('x' in globals())");
    CHECK(quiet.stdout_text == "False\n");
    CHECK_FALSE(has_notice(quiet, "rebuilt"));
    const auto second = b.tools->current_sandbox();
    REQUIRE(second);
    CHECK(second->id != first->id);
    CHECK(a.tools->current_sandbox()->id == second->id);

    // Idle: both managers see no use for 3 s, one of them ends the session. The conversation
    // comes back on b: told once, there; a's next turn is quiet.
    REQUIRE(b.python("y = 2").status == moat::tool_status::ok);
    auto ended = [&](worker& w) {
        auto listed = w.fixture.run(w.fixture.local->async_list({{"test", label}}));
        REQUIRE(listed);
        for (const auto& info : *listed)
            if (info.state == moat::sandbox_state::running) return false;
        return true;
    };
    bool idled_out = false;
    for (int round = 0; round < 40 && !idled_out; ++round) {
        a.fixture.run(moat::test::pause(250ms));
        b.fixture.run(moat::test::pause(250ms));
        idled_out = ended(a);
    }
    REQUIRE(idled_out);
    auto back = b.python("print('y' in globals())");
    CHECK(back.stdout_text == "False\n");
    CHECK(has_notice(back, "rebuilt"));
    auto after = a.python("print('y' in globals())");
    CHECK(after.stdout_text == "False\n");
    CHECK_FALSE(has_notice(after, "rebuilt"));
    CHECK(a.tools->current_sandbox()->id == b.tools->current_sandbox()->id);
    CHECK(a.tools->current_sandbox()->id != second->id);
    REQUIRE(a.fixture.run(a.tools->async_end()));
    (void)a.fixture.run(a.manager->async_shutdown());
}
