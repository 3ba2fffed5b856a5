// Nothing may wedge: a cancellation or an exception at any point around a queue turn, an
// admission slot or a session key gives it back, and no exception escapes the public API.
// The cancellations are delivered at exact points through the runtime's own event hooks (called
// synchronously when an operation finishes, i.e. just after the next turn or slot was granted and
// before its waiter resumed), and at sampled delays around those points.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>

#include "core/cancellation.hpp"
#include "support/async_wait.hpp"
#include "support/fault_injecting_backend.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <signal.h>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

using moat::test::local_fixture;
using moat::test::shell;
using moat::test::until;
using namespace std::chrono_literals;

namespace {

// What a side coroutine ended with: a value, or the exception that escaped moat's API.
template <class T>
struct outcome_slot {
    std::optional<T> value;
    std::string escaped;  // what() of an exception that escaped; "" if none
    bool done() const { return value.has_value() || !escaped.empty(); }
};

template <class T>
asio::awaitable<void> capture(asio::awaitable<T> operation, std::shared_ptr<outcome_slot<T>> out) {
    // Cancelled before it started: Asio would throw at this frame's own co_await, before moat is
    // entered. Nothing suspends between this check and the co_await below, so what that catches
    // came out of moat's API.
    if (moat::is_cancelled(co_await asio::this_coro::cancellation_state)) {
        out->value.emplace(moat::make_error(moat::errc::cancelled, "cancelled before it started"));
        co_return;
    }
    try {
        out->value.emplace(co_await std::move(operation));
    } catch (const std::exception& e) {
        out->escaped = std::string("exception: ") + e.what();
    } catch (...) {
        out->escaped = "a non-standard exception";
    }
}

using exec_slot = outcome_slot<moat::result<moat::exec_result>>;
using create_slot = outcome_slot<moat::result<std::shared_ptr<moat::sandbox>>>;
using lease_slot = outcome_slot<moat::result<moat::session_lease>>;

std::shared_ptr<moat::sandbox> create_handle(local_fixture& f, moat::runtime& rt) {
    auto box = f.run(rt.async_create(moat::sandbox_spec{}));
    if (!box) FAIL("create failed: " << box.error().to_string());
    return *box;
}

std::uint64_t start_exec(local_fixture& f, const std::shared_ptr<moat::sandbox>& box,
                         const std::string& command, std::shared_ptr<exec_slot> out,
                         moat::deadline limit = {}) {
    auto operation = box->async_exec(shell(command), limit);
    return f.tasks.spawn(capture(std::move(operation), std::move(out)));
}

asio::awaitable<void> cancel_after(moat::task_group& group, std::uint64_t id,
                                   std::chrono::microseconds delay) {
    asio::steady_timer timer(co_await asio::this_coro::executor, delay);
    co_await timer.async_wait(asio::use_awaitable);
    group.cancel(id);
}

// A turn or a slot that leaked shows as the next operation never running: give it a deadline
// so that a wedge fails the test instead of hanging it.
moat::result<moat::exec_result> next_exec(local_fixture& f, moat::sandbox& box) {
    return f.run(box.async_exec(shell("echo next"), moat::deadline::after(20s)));
}

// Runtime options whose on_operation hook runs `hook` once (then clears it) when an operation
// named `operation` finishes, successfully if `only_success`. Operations report synchronously
// as they end, after the next queue turn or admission slot was granted and before its waiter
// resumed: the exact point where a cancellation used to wedge.
moat::runtime_options hook_after(const char* operation, std::function<void()>& hook,
                                 bool only_success = false) {
    moat::runtime_options options;
    options.on_operation = [operation, &hook, only_success](const moat::operation_event& e) {
        if (e.operation != operation || !hook) return;
        if (only_success && e.error) return;
        std::exchange(hook, nullptr)();
    };
    return options;
}

}  // namespace

TEST_CASE_FIXTURE(
    local_fixture,
    "an operation cancelled just as its turn is granted leaves the queue to the next") {
    MOAT_REQUIRE_NAMESPACES();
    std::function<void()> on_first_done;
    auto options = hook_after("exec", on_first_done);
    moat::runtime rt(*local, options);
    auto box = create_handle(*this, rt);
    for (int round = 0; round < 5; ++round) {
        CAPTURE(round);
        auto first = std::make_shared<exec_slot>();
        auto second = std::make_shared<exec_slot>();
        start_exec(*this, box, "sleep 0.05", first);
        const auto second_task = start_exec(*this, box, "touch /workspace/second", second);
        REQUIRE(run(until([&] { return box->queued() == 1; })));
        on_first_done = [&] { tasks.cancel(second_task); };
        REQUIRE(run(until([&] { return first->done() && second->done(); })));
        CHECK(first->escaped.empty());
        CHECK(second->escaped.empty());
        auto next = next_exec(*this, *box);
        REQUIRE_MESSAGE(next, next.error().to_string());
        CHECK(next->out.text() == "next\n");
        CHECK(box->queued() == 0);
        CHECK(box->state() == moat::handle_state::ready);
    }
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "queued operations cancelled at any point around their grant never wedge") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    for (int step = 0; step < 40; ++step) {
        CAPTURE(step);
        auto first = std::make_shared<exec_slot>();
        auto second = std::make_shared<exec_slot>();
        auto third = std::make_shared<exec_slot>();
        start_exec(*this, box, "true", first);
        const auto second_task = start_exec(*this, box, "true", second);
        const auto third_task = start_exec(*this, box, "true", third);
        tasks.spawn(cancel_after(tasks, second_task, std::chrono::microseconds(step * 50)));
        tasks.spawn(cancel_after(tasks, third_task, std::chrono::microseconds(step * 75)));
        REQUIRE(run(until([&] { return first->done() && second->done() && third->done(); })));
        CHECK(first->escaped.empty());
        CHECK(second->escaped.empty());
        CHECK(third->escaped.empty());
        auto next = next_exec(*this, *box);
        REQUIRE_MESSAGE(next, next.error().to_string());
        CHECK(box->queued() == 0);
    }
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "a stream cancelled just as its turn is granted leaves the queue to the next") {
    MOAT_REQUIRE_NAMESPACES();
    std::function<void()> on_first_done;
    auto options = hook_after("exec", on_first_done);
    moat::runtime rt(*local, options);
    auto box = create_handle(*this, rt);
    auto first = std::make_shared<exec_slot>();
    start_exec(*this, box, "sleep 0.05", first);
    using stream_slot = outcome_slot<moat::result<moat::exec_stream>>;
    auto stream = std::make_shared<stream_slot>();
    auto starting = box->async_exec_stream(shell("echo streamed"));
    const auto stream_task = tasks.spawn(capture(std::move(starting), stream));
    REQUIRE(run(until([&] { return box->queued() == 1; })));
    on_first_done = [&] { tasks.cancel(stream_task); };
    REQUIRE(run(until([&] { return first->done() && stream->done(); })));
    CHECK(stream->escaped.empty());
    stream.reset();  // a stream that did start is dropped here, which frees its turn
    auto next = next_exec(*this, *box);
    REQUIRE_MESSAGE(next, next.error().to_string());
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "a stream cancelled just as its command started kills it and says cancelled") {
    MOAT_REQUIRE_NAMESPACES();
    // `moat run -- sleep 1000` and Ctrl-C as the sleep started: the cancellation used to be
    // consumed by the handle's wait, and the stream ran on to its wall limit.
    moat::test::fault_injecting_backend hooked(*local);
    moat::runtime rt(hooked);
    auto box = create_handle(*this, rt);
    const pid_t init = *box->info().host_pid;
    using stream_slot = outcome_slot<moat::result<moat::exec_stream>>;
    for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        auto stream = std::make_shared<stream_slot>();
        auto starting = box->async_exec_stream(shell("sleep 4545"));
        const auto task = tasks.spawn(capture(std::move(starting), stream));
        hooked.on_stream_started = [&, task] { tasks.cancel(task); };
        REQUIRE(run(until([&] { return stream->done(); })));
        CHECK_MESSAGE(stream->escaped.empty(), stream->escaped);
        REQUIRE(stream->value);
        REQUIRE_FALSE(*stream->value);
        CHECK(stream->value->error().code == moat::errc::cancelled);
        CHECK(run(until([&] { return moat::test::find_descendant(init, "sleep 4545") < 0; })));
        auto next = next_exec(*this, *box);
        REQUIRE_MESSAGE(next, next.error().to_string());
        CHECK(box->state() == moat::handle_state::ready);
    }
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "a create cancelled just as admission lets it in gives its slot back") {
    MOAT_REQUIRE_NAMESPACES();
    std::function<void()> on_first_created;
    auto options = hook_after("create", on_first_created);
    options.admission.max_concurrent_creates = 1;
    moat::runtime rt(*local, options);
    create_handle(*this, rt).reset();  // the helper is warm
    for (int round = 0; round < 5; ++round) {
        CAPTURE(round);
        auto first = std::make_shared<create_slot>();
        auto second = std::make_shared<create_slot>();
        auto creating = rt.async_create(moat::sandbox_spec{});
        tasks.spawn(capture(std::move(creating), first));
        auto waiting = rt.async_create(moat::sandbox_spec{});
        const auto second_task = tasks.spawn(capture(std::move(waiting), second));
        // The first create finishing admits the second; the cancellation lands in between.
        on_first_created = [&] { tasks.cancel(second_task); };
        REQUIRE(run(until([&] { return first->done() && second->done(); })));
        CHECK(first->escaped.empty());
        CHECK(second->escaped.empty());
        for (auto* slot : {first.get(), second.get()}) {
            if (slot->value && *slot->value) REQUIRE(run((**slot->value)->async_destroy()));
        }
        REQUIRE(run(until([&] { return rt.stats().creates_in_flight == 0; })));
    }
    CHECK(rt.stats().creates_in_flight == 0);
    // Every slot is free: max_concurrent_creates creates still go through.
    auto after = run(rt.async_create(moat::sandbox_spec{}, moat::deadline::after(20s)));
    REQUIRE_MESSAGE(after, after.error().to_string());
    REQUIRE(run((*after)->async_destroy()));
    CHECK(rt.stats().live_sandboxes == 0);
}

TEST_CASE_FIXTURE(local_fixture,
                  "creates cancelled at any point around admission leave no slot in flight") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime_options options;
    options.admission.max_concurrent_creates = 1;
    moat::runtime rt(*local, options);
    create_handle(*this, rt).reset();
    for (int step = 0; step < 40; ++step) {
        CAPTURE(step);
        std::vector<std::shared_ptr<create_slot>> slots;
        for (int i = 0; i < 3; ++i) {
            slots.push_back(std::make_shared<create_slot>());
            auto creating = rt.async_create(moat::sandbox_spec{});
            const auto task = tasks.spawn(capture(std::move(creating), slots.back()));
            if (i > 0) {
                const auto delay = std::chrono::microseconds(step * 100 * i);
                tasks.spawn(cancel_after(tasks, task, delay));
            }
        }
        REQUIRE(run(until([&] {
            for (const auto& s : slots)
                if (!s->done()) return false;
            return true;
        })));
        for (const auto& s : slots) {
            CHECK(s->escaped.empty());
            if (s->value && *s->value) REQUIRE(run((**s->value)->async_destroy()));
        }
        CHECK(rt.stats().creates_in_flight == 0);
    }
    CHECK(rt.stats().live_sandboxes == 0);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a stop the backend confirms within its own grace does not quarantine") {
    MOAT_REQUIRE_NAMESPACES();
    // The kill reaches the real backend 800 ms late (a slow transport), and its agent is stopped
    // for 1.5 s more: the backend confirms the kill within its own 2 s grace, 2.3 s after the
    // caller's cancellation. The handle must wait for the backend's grace, not beside it.
    moat::test::fault_injecting_backend slow(*local);
    slow.stop_delay = 800ms;
    moat::runtime rt(slow);
    auto box = create_handle(*this, rt);
    const pid_t init = *box->info().host_pid;
    auto out = std::make_shared<exec_slot>();
    const auto task = start_exec(*this, box, "sleep 100", out);
    REQUIRE(run(until([&] { return moat::test::find_descendant(init, "sleep 100") > 0; })));
    REQUIRE(::kill(init, SIGSTOP) == 0);
    tasks.cancel(task);
    run(moat::test::pause(2300ms));
    // (Before the fix the handle had already given up at 2 s: quarantined, and pid 1 destroyed.)
    ::kill(init, SIGCONT);
    REQUIRE(run(until([&] { return out->done(); })));
    CHECK(out->escaped.empty());
    REQUIRE(out->value);
    REQUIRE_FALSE(*out->value);
    CHECK(out->value->error().code == moat::errc::cancelled);
    CHECK_MESSAGE(!box->quarantine_cause(), box->quarantine_cause()->to_string());
    CHECK(box->state() == moat::handle_state::ready);
    // Killed: gone from the host once the kernel has finished it (SIGKILL is asynchronous).
    CHECK(run(until([&] { return moat::test::find_descendant(init, "sleep 100") < 0; })));
    auto next = next_exec(*this, *box);
    REQUIRE_MESSAGE(next, next.error().to_string());
    REQUIRE(run(box->async_destroy()));
}

namespace {

asio::awaitable<moat::result<void>> throwing_seed(std::shared_ptr<moat::sandbox>, bool) {
    throw std::runtime_error("the seed hook broke");
    co_return moat::result<void>{};
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture, "an exception in a session's seed hook does not wedge its key") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    bool seed_throws = true;
    moat::manager_options options;
    options.spec.labels["test"] = "stuck-seed";
    options.seed = [&seed_throws](std::shared_ptr<moat::sandbox> box, bool rebuilt) {
        if (seed_throws) return throwing_seed(std::move(box), rebuilt);
        return [](std::shared_ptr<moat::sandbox>) -> asio::awaitable<moat::result<void>> {
            co_return moat::result<void>{};
        }(std::move(box));
    };
    moat::session_manager manager(rt, options);
    auto first = std::make_shared<lease_slot>();
    tasks.spawn(capture(manager.async_acquire("conversation-1"), first));
    REQUIRE(run(until([&] { return first->done(); })));
    CHECK_MESSAGE(first->escaped.empty(), first->escaped);
    if (first->value) {
        REQUIRE_FALSE(*first->value);
        CHECK(first->value->error().code == moat::errc::backend_failure);
        CHECK(first->value->error().detail.find("the seed hook broke") != std::string::npos);
    }
    CHECK(manager.acquiring() == 0);
    // The half-made sandbox was destroyed.
    auto listed = run(local->async_list({{"test", "stuck-seed"}}));
    REQUIRE(listed);
    CHECK(listed->empty());

    seed_throws = false;
    auto second = run(manager.async_acquire("conversation-1", moat::deadline::after(20s)));
    REQUIRE_MESSAGE(second, second.error().to_string());
    auto ran = run((*second).box->async_exec(shell("echo ok")));
    REQUIRE(ran);
    second->reset();
    CHECK(second->box == nullptr);
    REQUIRE(run(manager.async_end("conversation-1")));
    auto report = run(manager.async_shutdown());
    CHECK(report.left.empty());
}

TEST_CASE_FIXTURE(local_fixture,
                  "an acquire cancelled just after its create finishes does not wedge its key") {
    MOAT_REQUIRE_NAMESPACES();
    std::function<void()> on_created;
    auto runtime_options = hook_after("create", on_created, true);
    moat::runtime rt(*local, runtime_options);
    moat::manager_options options;
    options.spec.labels["test"] = "stuck-acquire";
    moat::session_manager manager(rt, options);
    for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        auto first = std::make_shared<lease_slot>();
        const auto task = tasks.spawn(capture(manager.async_acquire("conversation-2"), first));
        on_created = [&] { tasks.cancel(task); };
        REQUIRE(run(until([&] { return first->done(); })));
        CHECK_MESSAGE(first->escaped.empty(), first->escaped);
        CHECK(manager.acquiring() == 0);
        auto second = run(manager.async_acquire("conversation-2", moat::deadline::after(20s)));
        REQUIRE_MESSAGE(second, second.error().to_string());
        REQUIRE(run((*second).box->async_exec(shell("true"))));
        second->reset();
        REQUIRE(run(manager.async_end("conversation-2")));
    }
    (void)run(manager.async_shutdown());
    auto listed = run(local->async_list({{"test", "stuck-acquire"}}));
    REQUIRE(listed);
    CHECK(listed->empty());
}

TEST_CASE_FIXTURE(local_fixture,
                  "a run_once cancelled just after its create still destroys its sandbox") {
    MOAT_REQUIRE_NAMESPACES();
    std::function<void()> on_created;
    auto runtime_options = hook_after("create", on_created, true);
    moat::runtime rt(*local, runtime_options);
    moat::manager_options options;
    options.spec.labels["test"] = "stuck-run-once";
    moat::session_manager manager(rt, options);
    for (const bool with_inputs : {false, true}) {
        CAPTURE(with_inputs);
        std::vector<moat::file_write> inputs;
        if (with_inputs) {
            inputs.resize(1);
            inputs[0].path = "/workspace/input";
            inputs[0].content = "data";
        }
        using run_slot = outcome_slot<moat::result<moat::exec_result>>;
        auto out = std::make_shared<run_slot>();
        auto running = manager.async_run_once(shell("cat /workspace/input"), inputs);
        const auto task = tasks.spawn(capture(std::move(running), out));
        on_created = [&] { tasks.cancel(task); };
        REQUIRE(run(until([&] { return out->done(); })));
        CHECK_MESSAGE(out->escaped.empty(), out->escaped);
        auto listed = run(local->async_list({{"test", "stuck-run-once"}}));
        REQUIRE(listed);
        CHECK(listed->empty());
        CHECK(rt.stats().live_sandboxes == 0);
    }
    auto report = run(manager.async_shutdown());
    CHECK(report.left.empty());
}
