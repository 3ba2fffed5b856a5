// Concurrency under load, with real sandboxes: two backends driven by two threads at once, the
// log sink replaced from a third thread while both log, 200 coroutines sharing one executor, and
// one backend on a strand of an io_context that two threads run.
// Built as its own executable (moat_concurrency_tests, ctest label "concurrency") so that the
// tsan preset runs exactly these under ThreadSanitizer; the dev and asan presets run them too.
//
// Every wait is bounded (a watchdog per thread, run_async's on the main thread); nothing here
// asserts on time.
#include <moat/local_backend.hpp>
#include <moat/log.hpp>
#include <moat/runtime.hpp>
#include <moat/task_group.hpp>

#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>

#include <sys/resource.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

// What one sandbox's life came to; written on its backend's thread, read after that thread ended.
struct sandbox_outcome {
    bool is_done = false;
    std::string failure;  // empty when create, exec and destroy all did what they should
};

// Labels this process's sandboxes: list() sees every sandbox on the host, other runs' included.
std::string run_label() {
    return "concurrency-" + std::to_string(::getpid());
}

// Creates a sandbox, runs `echo <number>` in it, checks the output and destroys the sandbox.
asio::awaitable<void> one_sandbox(moat::backend& sandboxes, int number, sandbox_outcome& outcome) {
    moat::sandbox_spec spec;
    spec.labels["test"] = run_label();
    auto box = co_await sandboxes.async_create(spec);
    if (!box) {
        outcome.failure = "create: " + box.error().to_string();
        outcome.is_done = true;
        co_return;
    }
    const std::string id = box->id;
    const std::string expected = std::to_string(number) + "\n";
    moat::exec_request request;
    request.argv = {"echo", std::to_string(number)};
    request.wall_limit = 60s;
    auto ran = co_await sandboxes.async_exec(id, request);
    auto destroyed = co_await sandboxes.async_destroy(id);
    if (!ran) {
        outcome.failure = "exec: " + ran.error().to_string();
    } else if (ran->exit_code != 0 || ran->out.text() != expected) {
        outcome.failure = "exec exited " + std::to_string(ran->exit_code) + " and printed '" +
                          ran->out.text() + "', expected '" + expected + "'";
    } else if (!destroyed) {
        outcome.failure = "destroy: " + destroyed.error().to_string();
    }
    outcome.is_done = true;
}

// Runs one sandbox per outcome, all at once, and returns when every one has ended.
asio::awaitable<void> run_sandboxes(moat::backend& sandboxes,
                                    std::vector<sandbox_outcome>& outcomes) {
    auto executor = co_await asio::this_coro::executor;
    moat::task_group group(executor, "concurrency test");
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
        group.spawn(one_sandbox(sandboxes, static_cast<int>(i), outcomes[i]));
    }
    co_await group.async_wait_all();
}

// One thread's share of a test: a backend on an io_context of its own, run by that thread.
struct thread_run {
    explicit thread_run(std::size_t sandboxes) : outcomes(sandboxes) {}
    std::vector<sandbox_outcome> outcomes;
    bool is_finished = false;  // every sandbox ended before the watchdog
    std::exception_ptr failure;
    std::atomic<bool> has_ended{false};  // the thread is about to return
};

struct record_completion {
    thread_run* run;
    bool* is_complete;
    void operator()(std::exception_ptr failure) const {
        run->failure = failure;
        *is_complete = true;
    }
};

// The thread body. Bounded: past the watchdog it gives up, and destroying the backend ends
// whatever is left.
void run_on_this_thread(thread_run& run, std::chrono::seconds watchdog) {
    {
        asio::io_context io;
        auto sandboxes = moat::make_local_backend(io.get_executor());
        bool is_complete = false;
        asio::co_spawn(io, run_sandboxes(*sandboxes, run.outcomes),
                       record_completion{&run, &is_complete});
        const auto limit = std::chrono::steady_clock::now() + watchdog;
        while (!is_complete && std::chrono::steady_clock::now() < limit) {
            io.run_one_for(100ms);
            if (io.stopped()) io.restart();
        }
        run.is_finished = is_complete;
        sandboxes.reset();
        io.restart();
        io.run_for(2s);  // lets the backend's own tasks see their cancellation
    }
    run.has_ended.store(true, std::memory_order_release);
}

void check_outcomes(const std::vector<sandbox_outcome>& outcomes) {
    std::size_t succeeded = 0;
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
        INFO("sandbox " << i);
        CHECK(outcomes[i].is_done);
        CHECK(outcomes[i].failure == "");
        if (outcomes[i].is_done && outcomes[i].failure.empty()) ++succeeded;
    }
    CHECK(succeeded == outcomes.size());
}

void check_run(const thread_run& run) {
    CHECK_MESSAGE(run.is_finished, "watchdog: the thread's sandboxes did not all end in time");
    if (run.failure) {
        CHECK_NOTHROW(std::rethrow_exception(run.failure));
    }
    check_outcomes(run.outcomes);
}

// 200 live sandboxes hold over 600 descriptors in this process (3 each, plus pipes while a
// command runs): more than a 1024 soft limit leaves once the suite's own are counted. Embedders
// raise the limit the same way (docs/embedding.md).
void raise_descriptor_limit() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &limit);
    }
}

struct strand_completion {
    std::exception_ptr* failure;
    std::atomic<bool>* is_complete;
    void operator()(std::exception_ptr e) const {
        *failure = e;
        is_complete->store(true, std::memory_order_release);
    }
};

// Runs `io` on this thread until `is_complete` or the watchdog.
void run_until(asio::io_context& io, const std::atomic<bool>& is_complete,
               std::chrono::seconds watchdog) {
    const auto limit = std::chrono::steady_clock::now() + watchdog;
    while (!is_complete.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < limit) {
        io.run_one_for(100ms);
    }
}

constexpr std::size_t sandboxes_per_thread = 20;
constexpr auto thread_watchdog = 240s;

struct counting_sink {
    std::atomic<std::size_t>* records;
    std::atomic<std::size_t>* malformed;
    void operator()(const moat::log_record& record) const {
        // Copying the text reads every byte the views point at (ASan and TSan watch the reads).
        const std::string line = std::string(record.component) + ": " + std::string(record.message);
        if (record.component.empty() || record.message.empty() || line.size() < 4) {
            malformed->fetch_add(1, std::memory_order_relaxed);
        }
        records->fetch_add(1, std::memory_order_relaxed);
    }
};

}  // namespace

TEST_CASE("two local backends on two threads each run 20 sandboxes at once") {
    MOAT_REQUIRE_NAMESPACES();
    raise_descriptor_limit();
    thread_run first(sandboxes_per_thread);
    thread_run second(sandboxes_per_thread);
    std::thread a(run_on_this_thread, std::ref(first), thread_watchdog);
    std::thread b(run_on_this_thread, std::ref(second), thread_watchdog);
    a.join();
    b.join();
    check_run(first);
    check_run(second);
}

TEST_CASE("the log sink is replaced from another thread while two backends log") {
    MOAT_REQUIRE_NAMESPACES();
    raise_descriptor_limit();
    // Two sinks, swapped back and forth: at every moment one of them is installed, so every
    // record (at least "created" and "destroyed" for each sandbox) reaches one of the counters.
    std::atomic<std::size_t> first_records{0}, second_records{0}, malformed{0};
    const moat::log_sink first_sink = counting_sink{&first_records, &malformed};
    const moat::log_sink second_sink = counting_sink{&second_records, &malformed};
    moat::set_log_sink(first_sink);

    thread_run first(sandboxes_per_thread);
    thread_run second(sandboxes_per_thread);
    std::thread a(run_on_this_thread, std::ref(first), thread_watchdog);
    std::thread b(run_on_this_thread, std::ref(second), thread_watchdog);
    std::size_t swaps = 0;
    while (!first.has_ended.load(std::memory_order_acquire) ||
           !second.has_ended.load(std::memory_order_acquire)) {
        moat::set_log_sink(swaps % 2 == 0 ? second_sink : first_sink);
        ++swaps;
        std::this_thread::sleep_for(200us);
    }
    a.join();
    b.join();
    moat::set_log_sink({});

    check_run(first);
    check_run(second);
    CHECK(swaps > 1);
    CHECK(malformed.load() == 0);
    // Two threads, and a "created" and a "destroyed" record per sandbox.
    CHECK(first_records.load() + second_records.load() >= 2 * 2 * sandboxes_per_thread);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "200 coroutines on one executor each create, exec and destroy a sandbox" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    raise_descriptor_limit();
    std::vector<sandbox_outcome> outcomes(200);
    run(run_sandboxes(*local, outcomes), 300s);
    check_outcomes(outcomes);

    moat::label_filter ours;
    ours["test"] = run_label();
    auto left = run(local->async_list(ours));
    REQUIRE(left);
    CHECK(left->empty());
}

TEST_CASE("a backend on a strand of an io_context that two threads run serves 20 sandboxes") {
    MOAT_REQUIRE_NAMESPACES();
    raise_descriptor_limit();
    asio::io_context io;
    auto work = asio::make_work_guard(io);
    const auto strand = asio::make_strand(io);
    auto sandboxes = moat::make_local_backend(strand);
    std::vector<sandbox_outcome> outcomes(sandboxes_per_thread);
    std::exception_ptr failure;
    std::atomic<bool> is_complete{false};
    // The callers' coroutines run on the backend's strand too.
    asio::co_spawn(strand, run_sandboxes(*sandboxes, outcomes),
                   strand_completion{&failure, &is_complete});
    std::thread a(run_until, std::ref(io), std::cref(is_complete), thread_watchdog);
    std::thread b(run_until, std::ref(io), std::cref(is_complete), thread_watchdog);
    a.join();
    b.join();
    // No thread runs the context now: the backend can be destroyed here.
    sandboxes.reset();
    work.reset();
    io.restart();
    io.run_for(2s);

    CHECK_MESSAGE(is_complete.load(), "watchdog: the sandboxes did not all end in time");
    if (failure) {
        CHECK_NOTHROW(std::rethrow_exception(failure));
    }
    check_outcomes(outcomes);
}

namespace {

// One sandbox's life through a handle: create, a command and a file round trip, destroy.
asio::awaitable<void> one_handle(moat::runtime& rt, int number, sandbox_outcome& outcome) {
    moat::sandbox_spec spec;
    spec.labels["test"] = run_label();
    auto created = co_await rt.async_create(spec);
    if (!created) {
        outcome.failure = "create: " + created.error().to_string();
        outcome.is_done = true;
        co_return;
    }
    auto box = std::move(*created);
    moat::exec_request request;
    request.shell = "echo " + std::to_string(number);
    auto ran = co_await box->async_exec(request);
    std::vector<moat::file_write> files(1);
    files[0].path = "/workspace/n";
    files[0].content = std::to_string(number);
    auto written = co_await box->async_write_files(files);
    std::vector<std::string> paths{"/workspace/n"};
    auto read = co_await box->async_read_files(paths);
    auto destroyed = co_await box->async_destroy();
    if (!ran || ran->out.text() != std::to_string(number) + "\n") {
        outcome.failure = "exec: " + (ran ? ran->out.text() : ran.error().to_string());
    } else if (!written || !written->front().outcome) {
        outcome.failure = "write_files failed";
    } else if (!read || !read->front().content ||
               *read->front().content != std::to_string(number)) {
        outcome.failure = "read_files failed";
    } else if (!destroyed) {
        outcome.failure = "destroy: " + destroyed.error().to_string();
    }
    outcome.is_done = true;
}

asio::awaitable<void> run_handles(moat::runtime& rt, std::vector<sandbox_outcome>& outcomes) {
    moat::task_group group(co_await asio::this_coro::executor, "handles");
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
        group.spawn(one_handle(rt, static_cast<int>(i), outcomes[i]));
    }
    co_await group.async_wait_all();
}

}  // namespace

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "1000 sandboxes with concurrent operations through handles on one thread" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    raise_descriptor_limit();
    moat::runtime rt(*local);
    std::vector<sandbox_outcome> outcomes(1000);
    run(run_handles(rt, outcomes), 600s);
    check_outcomes(outcomes);
    CHECK(rt.stats().live_sandboxes == 0);
    CHECK(rt.stats().refused == 0);
    moat::label_filter ours;
    ours["test"] = run_label();
    auto left = run(local->async_list(ours));
    REQUIRE(left);
    CHECK(left->empty());
}
