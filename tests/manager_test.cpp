// The session manager on the real local backend: single flight, rebuilds, per-call cleanup, idle
// and lifetime limits with reasons, heartbeats, the pool, shutdown with work in flight, the keys
// a shared store refuses. (Several workers sharing a store: shared_sessions_test.cpp.)
#include <doctest/doctest.h>

#include <moat/session_manager.hpp>

#include "support/async_wait.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

using moat::test::local_fixture;
using moat::test::pause;
using moat::test::shell;
using moat::test::until;
using namespace std::chrono_literals;

namespace {

// Records every manager event.
struct event_log {
    std::vector<moat::manager_event> events;
    std::size_t count(moat::manager_event::kind k) const {
        std::size_t n = 0;
        for (const auto& e : events) n += e.what == k ? 1 : 0;
        return n;
    }
    std::optional<moat::end_reason> end_of(const std::string& id) const {
        for (const auto& e : events)
            if (e.what == moat::manager_event::kind::ended && e.sandbox_id == id) return e.reason;
        return std::nullopt;
    }
};

moat::manager_options logged(event_log& log) {
    moat::manager_options o;
    o.spec.labels["test"] = "manager";
    o.on_event = [&log](const moat::manager_event& e) { log.events.push_back(e); };
    return o;
}

using lease_slot = std::optional<moat::result<moat::session_lease>>;

asio::awaitable<void> acquire_into(moat::session_manager& m, std::string key,
                                   std::shared_ptr<lease_slot> out) {
    *out = co_await m.async_acquire(std::move(key));
}

using exec_slot = std::optional<moat::result<moat::exec_result>>;

asio::awaitable<void> exec_into(std::shared_ptr<moat::sandbox> box, std::string command,
                                exec_slot& out) {
    out = co_await box->async_exec(shell(command));
}

asio::awaitable<void> run_once_into(moat::session_manager& m, std::string command, exec_slot& out) {
    out = co_await m.async_run_once(shell(command));
}

asio::awaitable<moat::result<void>> seed_nothing() {
    co_return moat::result<void>{};
}

template <class Slots>
bool all_done(const Slots& slots) {
    for (const auto& s : slots)
        if (!s->has_value()) return false;
    return true;
}

}  // namespace

TEST_CASE_FIXTURE(
    local_fixture,
    "one key under 100 concurrent acquirers creates one sandbox, and 100 keys run in parallel" *
        moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    event_log log;
    moat::session_manager manager(rt, logged(log));
    std::vector<std::shared_ptr<lease_slot>> same;
    for (int i = 0; i < 100; ++i) {
        same.push_back(std::make_shared<lease_slot>());
        tasks.spawn(acquire_into(manager, "conversation-1", same.back()));
    }
    REQUIRE(run(until([&] { return all_done(same); })));
    std::set<std::string> ids;
    for (const auto& s : same) {
        REQUIRE(**s);
        ids.insert((**s)->box->id());
        CHECK_FALSE((**s)->rebuilt);
    }
    CHECK(ids.size() == 1);
    CHECK(log.count(moat::manager_event::kind::created) == 1);

    std::vector<std::shared_ptr<lease_slot>> distinct;
    for (int i = 0; i < 100; ++i) {
        distinct.push_back(std::make_shared<lease_slot>());
        tasks.spawn(acquire_into(manager, "key-" + std::to_string(i), distinct.back()));
    }
    REQUIRE(run(until([&] { return all_done(distinct); }, 120s)));
    ids.clear();
    for (const auto& s : distinct) {
        REQUIRE(**s);
        ids.insert((**s)->box->id());
    }
    CHECK(ids.size() == 100);
    // Distinct keys did not wait for each other: creates overlapped up to the admission limit.
    CHECK(rt.stats().peak_creates_in_flight > 1);
    CHECK(manager.sessions() == 101);
    same.clear();
    distinct.clear();
    const auto report = run(manager.async_shutdown());
    CHECK(report.left.empty());
    CHECK(report.destroyed == 101);
}

TEST_CASE_FIXTURE(
    local_fixture,
    "a session whose sandbox was destroyed behind the manager's back is rebuilt and reseeded") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    event_log log;
    auto options = logged(log);
    auto seeds = std::make_shared<std::vector<bool>>();
    options.seed = [seeds](std::shared_ptr<moat::sandbox>, bool rebuilt) {
        seeds->push_back(rebuilt);
        return seed_nothing();
    };
    moat::session_manager manager(rt, options);
    auto first = run(manager.async_acquire("thread-7"));
    REQUIRE(first);
    CHECK_FALSE(first->rebuilt);
    const std::string old_id = first->box->id();
    REQUIRE(run(first->box->async_exec(shell("echo state > /workspace/state"))));
    first = moat::result<moat::session_lease>(moat::make_error(moat::errc::cancelled, "dropped"));

    {
        local_fixture other;
        REQUIRE(other.run(other.local->async_destroy(old_id)));
    }
    auto second = run(manager.async_acquire("thread-7"));
    REQUIRE(second);
    CHECK(second->rebuilt);
    CHECK(second->box->id() != old_id);
    REQUIRE(seeds->size() == 2);
    CHECK_FALSE((*seeds)[0]);
    CHECK((*seeds)[1]);
    CHECK(log.count(moat::manager_event::kind::rebuilt) == 1);
    CHECK(log.end_of(old_id) == moat::end_reason::error);
    auto state = run(second->box->async_exec(shell("cat /workspace/state")));
    REQUIRE(state);
    CHECK(state->exit_code != 0);  // the earlier state is gone, and the flag said so
    // The same key now reuses the new sandbox without rebuilding.
    auto third = run(manager.async_acquire("thread-7"));
    REQUIRE(third);
    CHECK_FALSE(third->rebuilt);
    CHECK(third->box->id() == second->box->id());
    run(manager.async_shutdown());
}

TEST_CASE_FIXTURE(
    local_fixture,
    "a per-call sandbox is destroyed after success, error, cancellation and deadline" *
        moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    event_log log;
    moat::session_manager manager(rt, logged(log));
    const auto none_left = [&] {
        auto listed = run(local->async_list({{"moat.policy", "call"}, {"test", "manager"}}));
        REQUIRE(listed);
        return listed->empty();
    };

    auto ok = run(manager.async_run_once(shell("echo once")));
    REQUIRE(ok);
    CHECK(ok->out.text() == "once\n");
    CHECK(none_left());

    std::vector<moat::file_write> bad(1);
    bad[0].path = "/no/such/dir/input.txt";
    bad[0].content = "x";
    auto failed = run(manager.async_run_once(shell("true"), bad));
    REQUIRE_FALSE(failed);
    CHECK(failed.error().code == moat::errc::file_not_found);
    CHECK(none_left());

    auto timed = run(manager.async_run_once(shell("sleep 100"), {}, moat::deadline::after(300ms)));
    REQUIRE_FALSE(timed);
    CHECK(timed.error().code == moat::errc::deadline_exceeded);
    CHECK(none_left());

    exec_slot cancelled;
    const auto task = tasks.spawn(run_once_into(manager, "sleep 100", cancelled));
    REQUIRE(run(until([&] { return log.count(moat::manager_event::kind::created) == 4; })));
    run(pause(200ms));
    tasks.cancel(task);
    REQUIRE(run(until([&] { return cancelled.has_value(); })));
    REQUIRE_FALSE(*cancelled);
    CHECK(cancelled->error().code == moat::errc::cancelled);
    CHECK(none_left());
    CHECK(log.count(moat::manager_event::kind::ended) == 4);
}

TEST_CASE_FIXTURE(local_fixture,
                  "idle sessions and sessions past their lifetime end with their reason") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    event_log log;
    auto options = logged(log);
    options.idle_timeout = 300ms;
    options.max_lifetime = 1500ms;
    moat::session_manager manager(rt, options);

    auto idle = run(manager.async_acquire("idle"));
    REQUIRE(idle);
    const std::string idle_id = idle->box->id();
    const pid_t idle_pid = *idle->box->info().host_pid;
    idle = moat::result<moat::session_lease>(moat::make_error(moat::errc::cancelled, "dropped"));

    auto busy = run(manager.async_acquire("busy"));  // held: never idle, but it ages
    REQUIRE(busy);
    const std::string busy_id = busy->box->id();

    REQUIRE(run(until([&] { return log.end_of(idle_id).has_value(); })));
    CHECK(log.end_of(idle_id) == moat::end_reason::idle_timeout);
    CHECK_FALSE(moat::test::is_running(idle_pid));
    REQUIRE(run(until([&] { return log.end_of(busy_id).has_value(); })));
    CHECK(log.end_of(busy_id) == moat::end_reason::max_lifetime);
    auto after = run(busy->box->async_exec(shell("true")));
    REQUIRE_FALSE(after);
    CHECK(after.error().code == moat::errc::sandbox_unavailable);
    run(manager.async_shutdown());
}

TEST_CASE_FIXTURE(local_fixture, "a held session's TTL is extended by the heartbeat") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    event_log log;
    auto options = logged(log);
    options.spec.ttl = 1s;
    options.heartbeat_interval = 200ms;
    moat::session_manager manager(rt, options);
    auto lease = run(manager.async_acquire("long task"));
    REQUIRE(lease);
    // Three times the TTL later the sandbox still runs: every heartbeat moved its end.
    run(pause(3s));
    auto alive = run(lease->box->async_exec(shell("echo alive")));
    REQUIRE(alive);
    CHECK(alive->out.text() == "alive\n");
    run(manager.async_shutdown());
}

TEST_CASE_FIXTURE(local_fixture, "the pool hands each warm sandbox out once and refills") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    event_log log;
    auto options = logged(log);
    options.pool_size = 3;
    moat::session_manager manager(rt, options);
    REQUIRE(run(until([&] { return manager.warm() == 3; })));
    std::set<std::string> seen;
    for (int i = 0; i < 10; ++i) {
        auto box = run(manager.async_take_warm());
        REQUIRE(box);
        CHECK(seen.insert((*box)->id()).second);
        // A marker left by an earlier tenant would show here.
        auto fresh = run(
            (*box)->async_exec(shell("test ! -e /workspace/marker && touch /workspace/marker")));
        REQUIRE(fresh);
        CHECK(fresh->exit_code == 0);
        REQUIRE(run((*box)->async_destroy()));
    }
    REQUIRE(run(until([&] { return manager.warm() == 3; })));
    CHECK(log.count(moat::manager_event::kind::pool_refilled) >= 10);
    const auto report = run(manager.async_shutdown());
    CHECK(report.left.empty());
    CHECK(manager.warm() == 0);
}

TEST_CASE_FIXTURE(local_fixture,
                  "shutdown with work in flight destroys everything and says what is left" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    event_log log;
    moat::session_manager manager(rt, logged(log));
    auto lease = run(manager.async_acquire("working"));
    REQUIRE(lease);
    const pid_t session_pid = *lease->box->info().host_pid;
    exec_slot in_session;
    tasks.spawn(exec_into(lease->box, "sleep 100", in_session));
    exec_slot one_shot;
    tasks.spawn(run_once_into(manager, "sleep 100", one_shot));
    REQUIRE(run(until([&] { return moat::test::find_descendant(session_pid, "sleep 100") > 0; })));
    REQUIRE(run(until([&] { return log.count(moat::manager_event::kind::created) == 2; })));
    run(pause(200ms));

    const auto report = run(manager.async_shutdown(5s));
    CHECK(report.left.empty());
    CHECK(report.destroyed == 2);
    REQUIRE(run(until([&] { return in_session.has_value() && one_shot.has_value(); })));
    CHECK_FALSE(*in_session);
    CHECK_FALSE(*one_shot);
    CHECK_FALSE(moat::test::is_running(session_pid));
    auto refused = run(manager.async_acquire("late"));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == moat::errc::shutting_down);
}

TEST_CASE_FIXTURE(local_fixture,
                  "with a shared store, a session key that cannot be a label is refused") {
    char name[] = "/tmp/moat-manager-test-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    moat::host_store_options store_options;
    store_options.directory = name;
    moat::runtime rt(*local);
    event_log log;
    moat::session_manager manager(rt, logged(log),
                                  moat::make_host_session_store(io.get_executor(), store_options));
    auto refused = run(manager.async_acquire("line\nbreak"));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == moat::errc::invalid_argument);
    auto too_long = run(manager.async_acquire(std::string(201, 'k')));
    REQUIRE_FALSE(too_long);
    CHECK(too_long.error().code == moat::errc::invalid_argument);
    CHECK(log.count(moat::manager_event::kind::created) == 0);
    run(manager.async_shutdown());
    ::rmdir(name);
}

TEST_CASE_FIXTURE(local_fixture,
                  "pause_when_idle pauses an idle session, an acquire resumes it as it was, and "
                  "past max_paused the one paused longest ago ends") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    event_log log;
    auto options = logged(log);
    options.idle_timeout = 300ms;
    options.pause_when_idle = true;
    options.max_paused = 1;
    moat::session_manager manager(rt, options);

    auto first = run(manager.async_acquire("first"));
    REQUIRE(first);
    const std::string first_id = first->box->id();
    CHECK_FALSE(first->resumed);
    // A background process holding a value in memory, and a file.
    moat::exec_request keeper = shell("echo 41 > /tmp/n; exec sleep 1000");
    keeper.resident = true;
    keeper.wall_limit = 600s;
    auto sleeper = run(first->box->async_spawn(std::move(keeper)));
    REQUIRE(sleeper);
    const int sleeper_pid = sleeper->pid();
    first.value().reset();
    REQUIRE(run(until([&] { return local->is_paused(first_id); }, 10s)));
    auto seen = run(local->async_inspect(first_id));
    REQUIRE(seen);
    CHECK(seen->state == moat::sandbox_state::paused);

    auto again = run(manager.async_acquire("first"));
    REQUIRE(again);
    CHECK(again->box->id() == first_id);
    CHECK(again->resumed);
    CHECK_FALSE(again->rebuilt);
    CHECK_FALSE(local->is_paused(first_id));
    auto same =
        run(again->box->async_exec(shell("cat /tmp/n && kill -0 " + std::to_string(sleeper_pid))));
    REQUIRE(same);
    CHECK(same->exit_code == 0);
    CHECK(same->out.text() == "41\n");
    again.value().reset();
    REQUIRE(run(until([&] { return local->is_paused(first_id); }, 10s)));

    // A second paused session is one too many: the one paused longest ago ends.
    auto second = run(manager.async_acquire("second"));
    REQUIRE(second);
    const std::string second_id = second->box->id();
    second.value().reset();
    REQUIRE(run(until([&] { return log.end_of(first_id).has_value(); }, 10s)));
    CHECK(log.end_of(first_id) == moat::end_reason::idle_timeout);
    REQUIRE(run(until([&] { return local->is_paused(second_id); }, 10s)));
    CHECK_FALSE(log.end_of(second_id).has_value());
    run(manager.async_shutdown());
}
