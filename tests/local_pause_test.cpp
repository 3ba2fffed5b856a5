// Pause and resume of local sandboxes (backend::async_pause, sandbox::async_pause): the commands'
// cgroup frozen in place, their processes and memory kept, the TTL standing still and the paused
// lifetime counting instead, and what other operations do meanwhile (handle_options::on_paused).
#include <doctest/doctest.h>

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>

#include "support/async_wait.hpp"
#include "support/local_fixture.hpp"

#include <chrono>
#include <string>

using moat::test::local_fixture;
using moat::test::shell;
using namespace std::chrono_literals;

namespace {

// A Python process holding a value made when it started (with its pid in it, so a restarted one
// would differ), answering each line written to /tmp/ask by writing the value to /tmp/answer.
constexpr const char* keeper = R"(python3 -c '
import os
value = "kept-%d" % os.getpid()
os.mkfifo("/tmp/ask")
while True:
    with open("/tmp/ask") as f:
        f.read()
    with open("/tmp/answer.new", "w") as f:
        f.write(value)
    os.rename("/tmp/answer.new", "/tmp/answer")
' > /dev/null 2>&1)";

constexpr const char* ask =
    "rm -f /tmp/answer; until [ -p /tmp/ask ]; do sleep 0.05; done; echo > /tmp/ask; "
    "until [ -f /tmp/answer ]; do sleep 0.05; done; cat /tmp/answer";

moat::exec_request resident(const std::string& command, std::chrono::milliseconds wall) {
    auto request = shell(command);
    request.resident = true;
    request.wall_limit = wall;
    return request;
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "pause then resume keeps a running background process and a Python variable, "
                  "and a paused sandbox uses no CPU") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    moat::sandbox_spec spec;
    spec.ttl = 120s;
    auto created = run(rt.async_create(spec));
    REQUIRE_MESSAGE(created, created.error().to_string());
    auto box = *created;

    auto python = run(box->async_spawn(resident(keeper, 600s)));
    REQUIRE_MESSAGE(python, python.error().to_string());
    auto busy = run(box->async_spawn(resident("while :; do :; done", 600s)));
    REQUIRE(busy);
    // A wall limit counts running time only: 2.5 s, of which the pause below takes none.
    auto limited = run(box->async_spawn(resident("sleep 100", 2500ms)));
    REQUIRE(limited);
    auto before = run(box->async_exec(shell(ask)));
    REQUIRE(before);
    REQUIRE(before->exit_code == 0);
    const std::string value = before->out.text();
    REQUIRE(value.starts_with("kept-"));

    auto paused = run(box->async_pause());
    REQUIRE_MESSAGE(paused, paused.error().to_string());
    CHECK(paused->state == moat::sandbox_state::paused);
    CHECK(run(box->async_pause()));  // idempotent
    CHECK(local->is_paused(box->id()));
    auto inspected = run(local->async_inspect(box->id()));
    REQUIRE(inspected);
    CHECK(inspected->state == moat::sandbox_state::paused);
    // The TTL stands still: it resumes with what was left, and the paused lifetime (24 h by
    // default) is the sandbox's end meanwhile.
    CHECK(inspected->ttl_left > 100s);
    CHECK(inspected->expires_at - std::chrono::system_clock::now() > 23h);
    auto listed = run(local->async_list({}));
    REQUIRE(listed);
    bool listed_paused = false;
    for (const auto& info : *listed) {
        listed_paused =
            listed_paused || (info.id == box->id() && info.state == moat::sandbox_state::paused);
    }
    CHECK(listed_paused);

    // No CPU while paused, although the busy loop was running.
    auto first = run(box->async_usage());
    REQUIRE(first);
    run(moat::test::pause(3s));
    auto second = run(box->async_usage());
    REQUIRE(second);
    CHECK(*second->cpu_time_us - *first->cpu_time_us < 50'000);

    auto resumed = run(box->async_resume());
    REQUIRE_MESSAGE(resumed, resumed.error().to_string());
    CHECK(resumed->state == moat::sandbox_state::running);
    CHECK_FALSE(local->is_paused(box->id()));
    CHECK(resumed->expires_at - std::chrono::system_clock::now() > 100s);

    // Everything as it was: the same Python process answers with its value, the busy loop and
    // the wall-limited sleep (2.5 s of running time, 3 s paused) run on.
    auto after = run(box->async_exec(shell(ask)));
    REQUIRE(after);
    CHECK(after->out.text() == value);
    auto alive = run(box->async_exec(shell("kill -0 " + std::to_string(busy->pid()) +
                                           " && kill -0 " + std::to_string(limited->pid()))));
    REQUIRE(alive);
    CHECK(alive->exit_code == 0);
    auto third = run(box->async_usage());
    REQUIRE(third);
    run(moat::test::pause(1s));
    auto fourth = run(box->async_usage());
    REQUIRE(fourth);
    // The loop runs again (a loaded 2-core machine gives it well under a whole CPU).
    CHECK(*fourth->cpu_time_us - *third->cpu_time_us > 100'000);
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "a paused sandbox's TTL does not run out, and its paused lifetime ends it") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    moat::sandbox_spec spec;
    spec.ttl = 2s;
    auto created = run(rt.async_create(spec));
    REQUIRE_MESSAGE(created, created.error().to_string());
    auto box = *created;
    REQUIRE(run(box->async_pause()));
    run(moat::test::pause(3s));  // past the TTL (and the helper's backstop grace)
    auto inspected = run(local->async_inspect(box->id()));
    REQUIRE(inspected);
    CHECK(inspected->state == moat::sandbox_state::paused);
    auto resumed = run(box->async_resume());
    REQUIRE_MESSAGE(resumed, resumed.error().to_string());
    const auto left = resumed->expires_at - std::chrono::system_clock::now();
    CHECK(left > 1s);
    CHECK(left <= 2s);
    auto ran = run(box->async_exec(shell("echo on")));
    REQUIRE(ran);
    CHECK(ran->out.text() == "on\n");
    REQUIRE(run(box->async_destroy()));

    spec.ttl = 120s;
    spec.paused_lifetime = 1500ms;
    auto short_lived = run(rt.async_create(spec));
    REQUIRE(short_lived);
    auto spawned = run((*short_lived)->async_spawn(resident("sleep 1000", 600s)));
    REQUIRE(spawned);
    REQUIRE(run((*short_lived)->async_pause()));
    const std::string id = (*short_lived)->id();
    bool ended = false;
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (!ended && std::chrono::steady_clock::now() < give_up) {
        run(moat::test::pause(100ms));
        auto now = run(local->async_inspect(id));
        ended = !now || now->state == moat::sandbox_state::exited;
    }
    CHECK(ended);
}

TEST_CASE_FIXTURE(local_fixture,
                  "operations on a paused sandbox resume it first, or fail, as the handle's "
                  "options say") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime_options strict;
    strict.handle.on_paused = moat::paused_policy::fail;
    moat::runtime failing(*local, strict);
    moat::sandbox_spec spec;
    spec.ttl = 60s;
    auto created = run(failing.async_create(spec));
    REQUIRE_MESSAGE(created, created.error().to_string());
    auto box = *created;
    REQUIRE(run(box->async_pause()));
    auto refused = run(box->async_exec(shell("echo no")));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == moat::errc::sandbox_paused);
    CHECK(refused.error().code == moat::condition::caller_error);
    CHECK(refused.error().detail.find("paused") != std::string::npos);
    CHECK(box->state() == moat::handle_state::ready);  // not a quarantine
    CHECK(local->is_paused(box->id()));
    CHECK(run(box->async_usage()));  // a reading leaves it paused
    CHECK(local->is_paused(box->id()));
    REQUIRE(run(box->async_resume()));

    // The default: the operation resumes it first, also when someone else paused it (here the
    // backend directly, as another process would).
    moat::runtime resuming(*local);
    auto other = run(resuming.async_create(spec));
    REQUIRE(other);
    REQUIRE(run(local->async_pause((*other)->id())));
    auto ran = run((*other)->async_exec(shell("echo yes")));
    REQUIRE_MESSAGE(ran, ran.error().to_string());
    CHECK(ran->out.text() == "yes\n");
    CHECK_FALSE(local->is_paused((*other)->id()));
    auto inspected = run(local->async_inspect((*other)->id()));
    REQUIRE(inspected);
    CHECK(inspected->state == moat::sandbox_state::running);
    REQUIRE(run((*other)->async_destroy()));
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture, "destroying a paused sandbox ends it and its frozen processes") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto created = run(rt.async_create(moat::sandbox_spec{}));
    REQUIRE_MESSAGE(created, created.error().to_string());
    const std::shared_ptr<moat::sandbox> box = *created;
    REQUIRE(run(box->async_spawn(resident("sleep 1000", 600s))));
    REQUIRE(run(box->async_pause()));
    // A process frozen by the v1 freezer dies of SIGKILL only once thawed: the destroy must not
    // wait for it in vain.
    auto destroyed = run(box->async_destroy());
    REQUIRE_MESSAGE(destroyed, destroyed.error().to_string());
    auto gone = run(local->async_inspect(box->id()));
    CHECK((!gone || gone->state == moat::sandbox_state::exited));
}
