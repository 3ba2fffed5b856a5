// The sandbox handle and the runtime on the real local backend: FIFO order, deadlines and
// cancellation (queued and running), quarantine from real faults, admission control. Absence is
// checked from the host, never through the backend under test.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>

#include "support/async_wait.hpp"
#include "support/fault_injecting_backend.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <signal.h>
#include <unistd.h>
#include <csignal>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

using moat::test::local_fixture;
using moat::test::shell;
using moat::test::until;
using namespace std::chrono_literals;

namespace {

// A command that waits until /workspace/go exists (created from outside the handle's queue).
const std::string wait_for_go = "while [ ! -e /workspace/go ]; do sleep 0.01; done";

struct exec_outcome {
    std::optional<moat::result<moat::exec_result>> value;
};

asio::awaitable<void> exec_into(std::shared_ptr<moat::sandbox> box, moat::exec_request request,
                                moat::deadline limit, std::shared_ptr<exec_outcome> out) {
    out->value = co_await box->async_exec(std::move(request), limit);
}

// Starts an exec beside the test's coroutine; returns its task id (f.tasks.cancel(id) cancels it).
std::uint64_t start_exec(local_fixture& f, const std::shared_ptr<moat::sandbox>& box,
                         const std::string& command, std::shared_ptr<exec_outcome> out,
                         moat::deadline limit = {}) {
    return f.tasks.spawn(exec_into(box, shell(command), limit, std::move(out)));
}

// Releases every wait_for_go command by writing the file through the backend directly.
void release_go(local_fixture& f, const std::string& id) {
    std::vector<moat::file_write> files(1);
    files[0].path = "/workspace/go";
    auto written = f.run(f.local->async_write_files(id, files));
    REQUIRE(written);
    REQUIRE(written->front().outcome);
}

bool file_exists(local_fixture& f, const std::string& id, const std::string& path) {
    auto st = f.run(f.local->async_stat(id, path));
    return st.has_value();
}

std::shared_ptr<moat::sandbox> create_handle(local_fixture& f, moat::runtime& rt,
                                             moat::sandbox_spec spec = {}) {
    auto box = f.run(rt.async_create(std::move(spec)));
    if (!box) FAIL("create failed: " << box.error().to_string());
    return *box;
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture, "operations on one sandbox run one at a time in arrival order") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    constexpr int count = 100;
    std::vector<std::shared_ptr<exec_outcome>> outcomes;
    for (int i = 0; i < count; ++i) {
        outcomes.push_back(std::make_shared<exec_outcome>());
        std::string command = "echo " + std::to_string(i) + " >> /workspace/order";
        if (i == 0) command += "; " + wait_for_go;
        start_exec(*this, box, command, outcomes.back());
    }
    // All 100 are submitted before the first completes: one runs, 99 wait.
    REQUIRE(run(until([&] { return box->queued() == count - 1; })));
    CHECK(box->state() == moat::handle_state::busy);
    CHECK_FALSE(outcomes.front()->value.has_value());
    release_go(*this, box->id());
    REQUIRE(run(until([&] {
        for (const auto& o : outcomes)
            if (!o->value) return false;
        return true;
    })));
    for (const auto& o : outcomes) {
        REQUIRE(*o->value);
        CHECK((*o->value)->exit_code == 0);
    }
    std::string expected;
    for (int i = 0; i < count; ++i) expected += std::to_string(i) + "\n";
    auto read = run(box->async_read_files({"/workspace/order"}));
    REQUIRE(read);
    REQUIRE(read->front().content);
    CHECK(*read->front().content == expected);
    CHECK(box->state() == moat::handle_state::ready);
    REQUIRE(run(box->async_destroy()));
    CHECK(box->state() == moat::handle_state::destroyed);
}

TEST_CASE_FIXTURE(local_fixture, "a deadline that passes while queued fails without running") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    auto blocker = std::make_shared<exec_outcome>();
    start_exec(*this, box, wait_for_go, blocker);
    REQUIRE(run(until([&] { return box->state() == moat::handle_state::busy; })));

    auto late = std::make_shared<exec_outcome>();
    start_exec(*this, box, "touch /workspace/late-ran", late, moat::deadline::after(300ms));
    auto cancelled = std::make_shared<exec_outcome>();
    const auto cancelled_task = start_exec(*this, box, "touch /workspace/cancelled-ran", cancelled);
    REQUIRE(run(until([&] { return box->queued() == 2; })));
    tasks.cancel(cancelled_task);

    REQUIRE(run(until([&] { return late->value && cancelled->value; })));
    REQUIRE_FALSE(*late->value);
    CHECK(late->value->error().code == moat::errc::deadline_exceeded);
    CHECK(late->value->error().detail.find("queued") != std::string::npos);
    REQUIRE_FALSE(*cancelled->value);
    CHECK(cancelled->value->error().code == moat::errc::cancelled);
    CHECK(box->queued() == 0);
    CHECK_FALSE(blocker->value.has_value());

    release_go(*this, box->id());
    REQUIRE(run(until([&] { return blocker->value.has_value(); })));
    CHECK(*blocker->value);
    CHECK_FALSE(file_exists(*this, box->id(), "/workspace/late-ran"));
    CHECK_FALSE(file_exists(*this, box->id(), "/workspace/cancelled-ran"));
    CHECK(box->state() == moat::handle_state::ready);
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "cancelling a running exec kills its process, and the sandbox stays ready") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    const pid_t init = *box->info().host_pid;
    auto out = std::make_shared<exec_outcome>();
    const auto task = start_exec(*this, box, "sleep 100", out);
    pid_t sleeper = -1;
    REQUIRE(run(until([&] {
        sleeper = moat::test::find_descendant(init, "sleep 100");
        return sleeper > 0;
    })));
    CHECK(moat::test::is_running(sleeper));
    tasks.cancel(task);
    REQUIRE(run(until([&] { return out->value.has_value(); })));
    REQUIRE_FALSE(*out->value);
    CHECK(out->value->error().code == moat::errc::cancelled);
    CHECK_FALSE(moat::test::is_running(sleeper));
    CHECK(box->state() == moat::handle_state::ready);
    CHECK_FALSE(box->quarantine_cause());
    auto again = run(box->async_exec(shell("echo still here")));
    REQUIRE(again);
    CHECK(again->out.text() == "still here\n");
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "a deadline on a running exec kills it and reports deadline_exceeded") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    const pid_t init = *box->info().host_pid;
    auto r = run(box->async_exec(shell("sleep 100"), moat::deadline::after(500ms)));
    REQUIRE_FALSE(r);
    CHECK(r.error().code == moat::errc::deadline_exceeded);
    // Killed: gone from the host once the kernel has finished it (SIGKILL is asynchronous).
    CHECK(run(until([&] { return moat::test::find_descendant(init, "sleep 100") < 0; })));
    CHECK(box->state() == moat::handle_state::ready);
    REQUIRE(run(box->async_exec(shell("true"))));
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture, "a sandbox destroyed underneath its handle quarantines it") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    const pid_t init = *box->info().host_pid;
    {
        local_fixture other;
        REQUIRE(other.run(other.local->async_destroy(box->id())));
    }
    auto r = run(box->async_exec(shell("true")));
    REQUIRE_FALSE(r);
    CHECK(r.error().code == moat::errc::sandbox_unavailable);
    REQUIRE(box->quarantine_cause());
    // The handle destroys what is left and confirms it; later operations fail at once.
    REQUIRE(run(until([&] { return box->state() == moat::handle_state::destroyed; })));
    CHECK_FALSE(moat::test::is_running(init));
    auto later = run(box->async_stat("/workspace"));
    REQUIRE_FALSE(later);
    CHECK(later.error().code == moat::errc::sandbox_unavailable);
    CHECK(later.error().detail.find("quarantined") != std::string::npos);
    CHECK(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "the helper dying quarantines every handle and each is destroyed") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto first = create_handle(*this, rt);
    auto second = create_handle(*this, rt);
    const pid_t helper = moat::test::find_descendant(::getpid(), "helper --state-dir");
    REQUIRE(helper > 0);
    REQUIRE(::kill(helper, SIGKILL) == 0);
    // SIGKILL lands asynchronously, and the sandboxes' agents die only as the helper exits (their
    // parent-death signal): an exec sent before that reaches a live agent and succeeds. Wait for
    // both, so that what is tested is the handles' answer to the death, not the race.
    REQUIRE(moat::test::eventually([&] { return !moat::test::is_running(helper); }));
    for (const auto& box : {first, second})
        REQUIRE(
            moat::test::eventually([&] { return !moat::test::is_running(*box->info().host_pid); }));
    for (const auto& box : {first, second}) {
        auto r = run(box->async_exec(shell("true")));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == moat::errc::sandbox_unavailable);
        REQUIRE(run(until([&] { return box->state() == moat::handle_state::destroyed; })));
        CHECK(
            moat::test::eventually([&] { return !moat::test::is_running(*box->info().host_pid); }));
    }
    CHECK(rt.stats().live_sandboxes == 0);
    // A new helper serves the next create.
    auto third = create_handle(*this, rt);
    REQUIRE(run(third->async_exec(shell("true"))));
    REQUIRE(run(third->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture, "dropping the last reference to a handle destroys its sandbox") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    const pid_t init = *box->info().host_pid;
    box.reset();
    REQUIRE(run(until([&] { return !moat::test::is_running(init); })));
    REQUIRE(run(until([&] { return rt.stats().live_sandboxes == 0; })));
}

namespace {

asio::awaitable<void> create_into(
    moat::runtime& rt, moat::sandbox_spec spec,
    std::shared_ptr<std::optional<moat::result<std::shared_ptr<moat::sandbox>>>> out) {
    *out = co_await rt.async_create(std::move(spec));
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "admission caps creates in flight and live sandboxes" * moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime_options options;
    options.admission.max_concurrent_creates = 4;
    options.admission.create_burst = 1000;
    options.admission.creates_per_second = 1e6;
    moat::runtime rt(*local, options);
    constexpr int burst = 200;
    using created_slot = std::optional<moat::result<std::shared_ptr<moat::sandbox>>>;
    std::vector<std::shared_ptr<created_slot>> made;
    for (int i = 0; i < burst; ++i) {
        made.push_back(std::make_shared<created_slot>());
        moat::sandbox_spec spec;
        spec.labels["test"] = "admission";
        tasks.spawn(create_into(rt, spec, made.back()));
    }
    REQUIRE(run(until(
        [&] {
            for (const auto& m : made)
                if (!m->has_value()) return false;
            return true;
        },
        120s)));
    std::vector<std::shared_ptr<moat::sandbox>> boxes;
    for (const auto& m : made) {
        REQUIRE(**m);
        boxes.push_back(***m);
    }
    CHECK(rt.stats().peak_creates_in_flight == 4);
    CHECK(rt.stats().live_sandboxes == burst);

    // Distinct sandboxes still run in parallel: four sleeps are alive at once.
    std::vector<std::shared_ptr<exec_outcome>> sleeps;
    for (int i = 0; i < 4; ++i) {
        sleeps.push_back(std::make_shared<exec_outcome>());
        start_exec(*this, boxes[i], "sleep 3", sleeps.back());
    }
    REQUIRE(run(until([&] {
        int alive = 0;
        for (int i = 0; i < 4; ++i)
            if (moat::test::find_descendant(*boxes[i]->info().host_pid, "sleep 3") > 0) ++alive;
        return alive == 4;
    })));
    REQUIRE(run(until([&] {
        for (const auto& s : sleeps)
            if (!s->value) return false;
        return true;
    })));
    for (auto& box : boxes) REQUIRE(run(box->async_destroy()));
    CHECK(rt.stats().live_sandboxes == 0);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a create over max_live_sandboxes waits for room, then fails by name") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime_options options;
    options.admission.max_live_sandboxes = 2;
    moat::runtime rt(*local, options);
    auto first = create_handle(*this, rt);
    auto second = create_handle(*this, rt);
    auto refused = run(rt.async_create({}, moat::deadline::after(200ms)));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == moat::errc::limit_exceeded);
    CHECK(refused.error().detail.find("max_live_sandboxes") != std::string::npos);
    CHECK(rt.stats().refused == 1);
    REQUIRE(run(first->async_destroy()));
    auto third = create_handle(*this, rt);
    REQUIRE(run(second->async_destroy()));
    REQUIRE(run(third->async_destroy()));
}

TEST_CASE_FIXTURE(
    local_fixture,
    "a stop that is never confirmed quarantines the sandbox, which is then destroyed") {
    MOAT_REQUIRE_NAMESPACES();
    moat::test::fault_injecting_backend faulty(*local);
    faulty.lose_kills = true;
    moat::runtime_options options;
    options.handle.kill_grace = 300ms;
    moat::runtime rt(faulty, options);
    for (const bool by_deadline : {true, false}) {
        CAPTURE(by_deadline);
        auto box = create_handle(*this, rt);
        const pid_t init = *box->info().host_pid;
        auto out = std::make_shared<exec_outcome>();
        std::uint64_t task = 0;
        if (by_deadline) {
            start_exec(*this, box, "sleep 100", out, moat::deadline::after(300ms));
        } else {
            task = start_exec(*this, box, "sleep 100", out);
        }
        pid_t sleeper = -1;
        REQUIRE(run(until([&] {
            sleeper = moat::test::find_descendant(init, "sleep 100");
            return sleeper > 0;
        })));
        if (!by_deadline) tasks.cancel(task);
        REQUIRE(run(until([&] { return out->value.has_value(); })));
        REQUIRE_FALSE(*out->value);
        CHECK(out->value->error().code ==
              (by_deadline ? moat::errc::deadline_exceeded : moat::errc::cancelled));
        REQUIRE(box->quarantine_cause());
        CHECK(box->quarantine_cause()->detail.find("did not stop") != std::string::npos);
        // The handle's own destroy ends what the lost kill could not.
        REQUIRE(run(until([&] { return box->state() == moat::handle_state::destroyed; })));
        CHECK_FALSE(moat::test::is_running(sleeper));
        CHECK_FALSE(moat::test::is_running(init));
    }
}

TEST_CASE_FIXTURE(local_fixture,
                  "a protocol violation or backend failure mid-operation quarantines") {
    MOAT_REQUIRE_NAMESPACES();
    moat::test::fault_injecting_backend faulty(*local);
    moat::runtime rt(faulty);
    for (const auto code : {moat::errc::protocol_error, moat::errc::backend_failure}) {
        auto box = create_handle(*this, rt);
        const pid_t init = *box->info().host_pid;
        faulty.fail_next_exec = moat::make_error(code, "injected");
        auto r = run(box->async_exec(shell("true")));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == code);
        REQUIRE(box->quarantine_cause());
        CHECK(box->quarantine_cause()->code == code);
        auto later = run(box->async_exec(shell("true")));
        REQUIRE_FALSE(later);
        CHECK(later.error().code == moat::errc::sandbox_unavailable);
        CHECK(later.error().detail.find("injected") != std::string::npos);
        REQUIRE(run(until([&] { return box->state() == moat::handle_state::destroyed; })));
        CHECK_FALSE(moat::test::is_running(init));
    }
    // Output caps and failing programs never quarantine.
    auto box = create_handle(*this, rt);
    auto big = shell("head -c 3000000 /dev/zero; exit 3");
    auto r = run(box->async_exec(big));
    REQUIRE(r);
    CHECK(r->exit_code == 3);
    CHECK(r->out.is_truncated());
    CHECK(box->state() == moat::handle_state::ready);
    REQUIRE(run(box->async_destroy()));
}

namespace {

asio::awaitable<moat::result<std::string>> drain(moat::process& p, int& exit_code, int& signal) {
    std::string out;
    for (;;) {
        auto next = co_await p.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<moat::output_chunk>(&*next)) {
            out += chunk->data;
            continue;
        }
        exit_code = std::get<moat::exec_result>(*next).exit_code;
        signal = std::get<moat::exec_result>(*next).signal;
        co_return out;
    }
}

asio::awaitable<moat::result<void>> talk(moat::process& p, std::string text) {
    auto written = co_await p.async_write_stdin(std::move(text));
    if (!written) co_return written;
    co_return co_await p.async_close_stdin();
}

}  // namespace

TEST_CASE_FIXTURE(
    local_fixture,
    "a spawned process runs beside queued operations, with working stdin, output and signals") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    const pid_t init = *box->info().host_pid;
    moat::exec_request cat;
    cat.argv = {"cat"};
    auto spawned = run(box->async_spawn(cat));
    REQUIRE(spawned);
    CHECK(spawned->pid() > 1);
    CHECK(moat::test::find_descendant(init, "cat") > 0);
    // It does not hold the queue.
    auto quick = run(box->async_exec(shell("echo beside")));
    REQUIRE(quick);
    CHECK(quick->out.text() == "beside\n");
    REQUIRE(run(talk(*spawned, "hello through stdin\n")));
    int code = -1, signal = -1;
    auto out = run(drain(*spawned, code, signal));
    REQUIRE(out);
    CHECK(*out == "hello through stdin\n");
    CHECK(code == 0);

    moat::exec_request sleeper;
    sleeper.argv = {"sleep", "100"};
    auto second = run(box->async_spawn(sleeper));
    REQUIRE(second);
    REQUIRE(run(second->async_signal(SIGTERM)));
    out = run(drain(*second, code, signal));
    REQUIRE(out);
    CHECK(signal == SIGTERM);

    // Destroying the sandbox kills what it still runs.
    auto third = run(box->async_spawn(sleeper));
    REQUIRE(third);
    pid_t host_sleeper = -1;
    REQUIRE(run(until([&] {
        host_sleeper = moat::test::find_descendant(init, "sleep 100");
        return host_sleeper > 0;
    })));
    REQUIRE(run(box->async_destroy()));
    CHECK_FALSE(moat::test::is_running(host_sleeper));
}

namespace {

asio::awaitable<moat::result<std::string>> read_stream(moat::exec_stream stream) {
    std::string out;
    for (;;) {
        auto next = co_await stream.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<moat::output_chunk>(&*next)) {
            out += chunk->data;
            continue;
        }
        co_return out;
    }
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a stream holds its sandbox's turn until it ends, under its deadline") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    const pid_t init = *box->info().host_pid;
    auto stream = run(box->async_exec_stream(shell("echo a; " + wait_for_go + "; echo b")));
    REQUIRE(stream);
    auto queued = std::make_shared<exec_outcome>();
    start_exec(*this, box, "echo after", queued);
    REQUIRE(run(until([&] { return box->queued() == 1; })));
    release_go(*this, box->id());
    auto text = run(read_stream(std::move(*stream)));
    REQUIRE(text);
    CHECK(*text == "a\nb\n");
    REQUIRE(run(until([&] { return queued->value.has_value(); })));
    REQUIRE(*queued->value);
    CHECK((*queued->value)->out.text() == "after\n");

    // Past the stream's deadline the next pull stops the program.
    auto slow = run(box->async_exec_stream(shell("sleep 100"), moat::deadline::after(300ms)));
    REQUIRE(slow);
    auto stopped = run(read_stream(std::move(*slow)));
    REQUIRE_FALSE(stopped);
    CHECK(stopped.error().code == moat::errc::deadline_exceeded);
    CHECK(run(until([&] { return moat::test::find_descendant(init, "sleep 100") < 0; })));
    CHECK(box->state() == moat::handle_state::ready);

    // Dropping a stream kills its program and frees the turn.
    auto dropped = run(box->async_exec_stream(shell("sleep 100")));
    REQUIRE(dropped);
    REQUIRE(run(until([&] { return moat::test::find_descendant(init, "sleep 100") > 0; })));
    *dropped = moat::exec_stream();
    CHECK(box->state() == moat::handle_state::ready);
    REQUIRE(run(box->async_exec(shell("true"))));
    REQUIRE(run(until([&] { return moat::test::find_descendant(init, "sleep 100") < 0; })));
    REQUIRE(run(box->async_destroy()));
}

namespace {

// Cancels task `id` of `group` after `delay`.
asio::awaitable<void> cancel_after(moat::task_group& group, std::uint64_t id,
                                   std::chrono::microseconds delay) {
    asio::steady_timer timer(co_await asio::this_coro::executor, delay);
    co_await timer.async_wait(asio::use_awaitable);
    group.cancel(id);
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture, "a create cancelled at any point leaves nothing behind") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    create_handle(*this, rt).reset();  // the helper is running and warm
    const pid_t helper = moat::test::find_descendant(::getpid(), "helper --state-dir");
    REQUIRE(helper > 0);
    int cancelled = 0;
    for (int step = 0; step < 40; ++step) {
        CAPTURE(step);
        moat::sandbox_spec spec;
        spec.labels["test"] = "cancelled-create";
        auto out = std::make_shared<std::optional<moat::result<std::shared_ptr<moat::sandbox>>>>();
        const auto create = tasks.spawn(create_into(rt, spec, out));
        tasks.spawn(cancel_after(tasks, create, std::chrono::microseconds(step * 100)));
        REQUIRE(run(until([&] { return out->has_value(); })));
        if (**out) {
            REQUIRE(run((***out)->async_destroy()));
        } else {
            CHECK((*out)->error().code == moat::errc::cancelled);
            ++cancelled;
        }
        // Whatever the timing: no sandbox process under the helper, no record.
        REQUIRE(run(until([&] { return moat::test::descendants(helper).empty(); })));
        auto listed = run(local->async_list({{"test", "cancelled-create"}}));
        REQUIRE(listed);
        CHECK(listed->empty());
    }
    CHECK(cancelled > 0);
    CHECK(rt.stats().live_sandboxes == 0);
}

TEST_CASE_FIXTURE(local_fixture,
                  "the runtime counts operations, times them and reports each as an event") {
    MOAT_REQUIRE_NAMESPACES();
    std::vector<moat::operation_event> events;
    moat::runtime_options options;
    options.on_operation = [&events](const moat::operation_event& e) { events.push_back(e); };
    moat::runtime rt(*local, options);
    auto box = create_handle(*this, rt);
    REQUIRE(run(box->async_exec(shell("true"))));
    REQUIRE(run(box->async_exec(shell("true"))));
    REQUIRE_FALSE(run(box->async_stat("relative/path")));
    REQUIRE(run(box->async_destroy()));

    const auto m = rt.metrics();
    CHECK(m.operations.at("create") == 1);
    CHECK(m.operations.at("exec") == 2);
    CHECK(m.operations.at("stat") == 1);
    CHECK(m.failures.at("stat") == 1);
    CHECK(m.operations.at("destroy") == 1);
    CHECK(m.latency.at("exec").count() == 2);
    CHECK(m.latency.at("exec").quantile_ms(0.5) > 0);
    REQUIRE(events.size() == 5);
    std::set<std::uint64_t> ids;
    for (const auto& e : events) {
        CHECK(e.sandbox_id == box->id());
        ids.insert(e.operation_id);
    }
    CHECK(ids.size() == 5);
    CHECK(events[3].operation == "stat");
    CHECK(events[3].error == moat::errc::invalid_path);

    const std::string text = moat::to_prometheus(m);
    CHECK(text.find("moat_operations_total{operation=\"exec\"} 2\n") != std::string::npos);
    CHECK(text.find("moat_operation_failures_total{operation=\"stat\"} 1\n") != std::string::npos);
    CHECK(text.find("moat_operation_duration_seconds_bucket{operation=\"exec\",le=\"+Inf\"} 2\n") !=
          std::string::npos);
    CHECK(text.find("# TYPE moat_queue_wait_seconds histogram") != std::string::npos);
    CHECK(text.find("moat_live_sandboxes 0\n") != std::string::npos);
}
