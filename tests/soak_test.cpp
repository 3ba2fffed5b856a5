// A soak of mixed operations through the handle, the runtime and the session manager on the real
// local backend: creates, execs (failing, flooding, past their wall limit), streams read in part
// or in full, files, caller cancellations at random points, deadlines, destroys and dropped
// handles, sessions acquired, used and ended, per-call sandboxes. Several workers run at once on
// one executor for a bounded time (MOAT_SOAK_SECONDS, default 45; MOAT_SOAK_SEED replays a run).
//
// Afterwards everything is accounted for, from the host: this process's open descriptors, the
// helper's sandbox processes, the sandboxes' cgroup directories, state records, admission's
// creates in flight and live sandboxes, queued turns, in-flight session keys. All must be back
// to their starting values, no exception may have escaped the API, and no sandbox may have been
// quarantined (every stop is confirmed within its grace).
//
// Dev build only (its own executable, label "soak"): it is long, and the sanitizer builds run
// the same code paths in the focused tests.
#include <doctest/doctest.h>

#include <moat/local_backend.hpp>
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>

#include "core/cancellation.hpp"
#include "support/async_test.hpp"
#include "support/async_wait.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <dirent.h>
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

using moat::test::shell;
using namespace std::chrono_literals;

namespace {

std::size_t open_descriptors() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
        ++n;
    return n;
}

long environment_number(const char* name, long fallback) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return fallback;
    return std::strtol(text, nullptr, 10);
}

struct soak {
    explicit soak(asio::io_context& io, const std::string& state_dir, std::uint32_t seed)
        : local(make_backend(io, state_dir)),
          rt(*local, options_for_runtime(ids)),
          manager(rt, options_for_manager()),
          random(seed) {}

    static std::unique_ptr<moat::backend> make_backend(asio::io_context& io,
                                                       const std::string& state_dir) {
        moat::local_options options;
        options.state_dir = state_dir;
        return moat::make_local_backend(io.get_executor(), options);
    }
    // Every sandbox the runtime creates (the manager's included) is accounted for at the end.
    static moat::runtime_options options_for_runtime(std::set<std::string>& ids) {
        moat::runtime_options o;
        o.on_operation = [&ids](const moat::operation_event& e) {
            if (e.operation == "create" && !e.error) ids.insert(e.sandbox_id);
        };
        return o;
    }
    static moat::manager_options options_for_manager() {
        moat::manager_options o;
        o.spec.labels["test"] = "soak";
        o.spec.limits.pids = 64;
        o.idle_timeout = 2s;  // sessions also end by idling out during the soak
        return o;
    }

    std::set<std::string> ids;  // every sandbox the soak made
    std::unique_ptr<moat::backend> local;
    moat::runtime rt;
    moat::session_manager manager;
    std::mt19937 random;
    std::vector<std::shared_ptr<moat::sandbox>> shared;  // long-lived handles the workers share
    std::map<std::string, std::size_t> outcomes;         // "exec:ok", "exec:cancelled", ...
    std::vector<std::string> escaped;                    // exceptions that left the API

    int pick(int below) { return std::uniform_int_distribution<int>(0, below - 1)(random); }
    std::chrono::microseconds some_delay(int max_us) {
        return std::chrono::microseconds(std::uniform_int_distribution<int>(0, max_us)(random));
    }
    template <class T>
    void count(const char* what, const moat::result<T>& r) {
        std::string key = what;
        key +=
            r ? ":ok"
              : std::string(":") + moat::to_string(static_cast<moat::errc>(r.error().code.value()));
        ++outcomes[key];
        if (!r && (r.error().code == moat::errc::backend_failure ||
                   r.error().code == moat::errc::protocol_error)) {
            failures.push_back(std::string(what) + ": " + r.error().to_string());
        }
    }
    std::vector<std::string> failures;  // backend failures, with their detail, for the log
};

moat::sandbox_spec soak_spec() {
    moat::sandbox_spec spec;
    spec.labels["test"] = "soak";
    spec.limits.pids = 64;
    return spec;
}

// Awaits `operation`; an exception that escapes it is recorded (and is a failure of the soak).
template <class T>
asio::awaitable<std::optional<T>> caught(soak& s, asio::awaitable<T> operation, const char* label) {
    // Cancelled before it started (Asio throws at this frame's own co_await then, before moat is
    // entered): the caller's business, not an exception from moat. Nothing suspends between this
    // check and the co_await, so whatever is caught below came out of moat's API.
    if (moat::is_cancelled(co_await asio::this_coro::cancellation_state)) {
        ++s.outcomes["cancelled_before_start"];
        co_return std::nullopt;
    }
    std::string what;
    try {
        co_return co_await std::move(operation);
    } catch (const std::exception& e) {
        what = e.what();
    } catch (...) {
        what = "a non-standard exception";
    }
    s.escaped.push_back(std::string(label) + ": " + what);
    co_return std::nullopt;
}

asio::awaitable<void> sleep_for(std::chrono::microseconds d) {
    asio::steady_timer timer(co_await asio::this_coro::executor, d);
    std::error_code ignored;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
}

// Runs `operation`, cancelled by the caller (Asio's || operator) after `delay` unless it is done.
template <class T>
asio::awaitable<std::optional<T>> cancelled_after(soak& s, asio::awaitable<T> operation,
                                                  std::chrono::microseconds delay,
                                                  const char* label) {
    using namespace asio::experimental::awaitable_operators;
    auto guarded = caught(s, std::move(operation), label);
    auto timer = sleep_for(delay);
    auto raced = co_await (std::move(guarded) || std::move(timer));
    if (raced.index() == 0) co_return std::get<0>(std::move(raced));
    co_return std::nullopt;  // the timer won: the operation was cancelled and has completed
}

const char* const commands[] = {
    "true",
    "echo hello; echo oops >&2",
    "exit 3",
    "sleep 0.02",
    "head -c 3000000 /dev/zero",  // past the capture: truncated, not an error
    "for i in 1 2 3; do sleep 0.01 & done; wait",
    "cat /proc/self/status >/dev/null",
};

asio::awaitable<void> exec_on_shared(soak& s) {
    auto box = s.shared[static_cast<std::size_t>(s.pick(static_cast<int>(s.shared.size())))];
    auto request = shell(commands[s.pick(static_cast<int>(std::size(commands)))]);
    const int how = s.pick(4);
    if (how == 0) {
        request = shell("sleep 5");
        request.wall_limit = std::chrono::milliseconds(20 + s.pick(80));  // data: timed_out
    }
    if (how == 1) {
        auto limit = moat::deadline::after(std::chrono::milliseconds(1 + s.pick(40)));
        auto exec = box->async_exec(shell("sleep 0.03"), limit);
        auto r = co_await caught(s, std::move(exec), "exec");
        if (r) s.count("exec_deadline", *r);
        co_return;
    }
    if (how == 2) {
        auto exec = box->async_exec(shell("sleep 0.05"));
        auto r =
            co_await cancelled_after(s, std::move(exec), s.some_delay(30000), "exec (cancelled)");
        if (r)
            s.count("exec_cancel", *r);
        else
            ++s.outcomes["exec_cancel:cancelled_by_caller"];
        co_return;
    }
    auto exec = box->async_exec(std::move(request));
    auto r = co_await caught(s, std::move(exec), "exec");
    if (r) s.count("exec", *r);
}

asio::awaitable<moat::result<std::size_t>> read_some(moat::exec_stream stream, int chunks) {
    std::size_t pulled = 0;
    for (int i = 0; chunks < 0 || i < chunks; ++i) {
        // A cancellation that arrived after the last pull returned would throw at this frame's
        // next co_await (Asio 1.22), before moat is entered: stop here, as a consumer must.
        if (moat::is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_return moat::make_error(moat::errc::cancelled, "the reader was cancelled");
        }
        auto next = co_await stream.async_next();
        if (!next) co_return std::move(next).error();
        ++pulled;
        if (std::holds_alternative<moat::exec_result>(*next)) break;
    }
    co_return pulled;  // dropping the stream here kills what still runs
}

asio::awaitable<void> stream_on_shared(soak& s) {
    auto box = s.shared[static_cast<std::size_t>(s.pick(static_cast<int>(s.shared.size())))];
    auto starting =
        box->async_exec_stream(shell("for i in 1 2 3 4 5; do echo $i; sleep 0.01; done"));
    auto started = co_await caught(s, std::move(starting), "starting");
    if (!started) co_return;
    s.count("stream_start", *started);
    if (!*started) co_return;
    const int chunks = s.pick(3) == 0 ? -1 : s.pick(4);
    auto reading = read_some(std::move(**started), chunks);
    if (s.pick(3) == 0) {
        auto r = co_await cancelled_after(s, std::move(reading), s.some_delay(40000),
                                          "reading (cancelled)");
        if (r) s.count("stream_cancel", *r);
        co_return;
    }
    auto r = co_await caught(s, std::move(reading), "reading");
    if (r) s.count("stream", *r);
}

asio::awaitable<void> files_on_shared(soak& s) {
    auto box = s.shared[static_cast<std::size_t>(s.pick(static_cast<int>(s.shared.size())))];
    std::vector<moat::file_write> files(2);
    files[0].path = "/workspace/soak-" + std::to_string(s.pick(5));
    files[0].content = std::string(static_cast<std::size_t>(s.pick(100000)), 'x');
    files[1].path = s.pick(2) == 0 ? "../escape" : "/workspace/dir/nested";
    auto writing = box->async_write_files(files);
    auto written = co_await caught(s, std::move(writing), "writing");
    if (written) s.count("write_files", *written);
    std::vector<std::string> paths = {files[0].path, "/workspace/missing"};
    auto reading = box->async_read_files(paths);
    auto read = co_await caught(s, std::move(reading), "reading");
    if (read) s.count("read_files", *read);
}

asio::awaitable<void> create_use_destroy(soak& s) {
    auto creating = s.rt.async_create(soak_spec());
    std::optional<moat::result<std::shared_ptr<moat::sandbox>>> made;
    if (s.pick(3) == 0) {
        made = co_await cancelled_after(s, std::move(creating), s.some_delay(8000),
                                        "creating (cancelled)");
    } else {
        made = co_await caught(s, std::move(creating), "creating");
    }
    if (!made) co_return;
    s.count("create", *made);
    if (!*made) co_return;
    auto box = std::move(**made);
    auto exec = box->async_exec(shell("echo fresh"));
    auto ran = co_await caught(s, std::move(exec), "exec");
    if (ran) s.count("exec_fresh", *ran);
    if (s.pick(2) == 0) co_return;  // dropped: the handle destroys it in the background
    auto destroying = box->async_destroy();
    auto destroyed = co_await caught(s, std::move(destroying), "destroying");
    if (destroyed) s.count("destroy", *destroyed);
}

asio::awaitable<void> use_session(soak& s) {
    const std::string key = "conversation-" + std::to_string(s.pick(6));
    auto acquiring = s.manager.async_acquire(key);
    std::optional<moat::result<moat::session_lease>> lease;
    if (s.pick(4) == 0) {
        lease = co_await cancelled_after(s, std::move(acquiring), s.some_delay(10000),
                                         "acquiring (cancelled)");
    } else {
        lease = co_await caught(s, std::move(acquiring), "acquiring");
    }
    if (!lease) co_return;
    s.count("acquire", *lease);
    if (!*lease) co_return;
    auto exec = (*lease)->box->async_exec(shell("echo $RANDOM >> /workspace/turns"));
    auto ran = co_await caught(s, std::move(exec), "exec");
    if (ran) s.count("session_exec", *ran);
    (*lease)->reset();
    if (s.pick(4) == 0) {
        auto ending = s.manager.async_end(key);
        auto ended = co_await caught(s, std::move(ending), "ending");
        if (ended) s.count("end_session", *ended);
    }
}

asio::awaitable<void> run_once(soak& s) {
    std::vector<moat::file_write> inputs(1);
    inputs[0].path = "/workspace/input";
    inputs[0].content = "soak";
    auto running = s.manager.async_run_once(shell("cat /workspace/input"), inputs);
    if (s.pick(3) == 0) {
        auto r = co_await cancelled_after(s, std::move(running), s.some_delay(15000),
                                          "running (cancelled)");
        if (r) s.count("run_once_cancel", *r);
        co_return;
    }
    auto r = co_await caught(s, std::move(running), "running");
    if (r) s.count("run_once", *r);
}

asio::awaitable<void> worker(soak& s, std::chrono::steady_clock::time_point end) {
    while (std::chrono::steady_clock::now() < end) {
        switch (s.pick(10)) {
            case 0:
            case 1:
            case 2:
                co_await exec_on_shared(s);
                break;
            case 3:
                co_await stream_on_shared(s);
                break;
            case 4:
                co_await files_on_shared(s);
                break;
            case 5:
            case 6:
                co_await create_use_destroy(s);
                break;
            case 7:
            case 8:
                co_await use_session(s);
                break;
            default:
                co_await run_once(s);
                break;
        }
    }
}

asio::awaitable<void> run_workers(soak& s, int count, std::chrono::seconds length) {
    const auto end = std::chrono::steady_clock::now() + length;
    moat::task_group workers(co_await asio::this_coro::executor, "soak workers");
    for (int i = 0; i < count; ++i) workers.spawn(worker(s, end));
    co_await workers.async_wait_all();
}

// The number of entries of `dir` named by one of `ids`.
std::size_t entries_named(const std::string& dir, const std::set<std::string>& ids) {
    std::size_t n = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        for (const auto& id : ids) {
            if (name.find(id) != std::string::npos) ++n;
        }
    }
    return n;
}

// The helper runs and the template root exists before the baseline is taken.
asio::awaitable<void> warm_up(soak& s) {
    auto made = co_await s.rt.async_create(soak_spec());
    REQUIRE(made);
    auto destroyed = co_await (*made)->async_destroy();
    REQUIRE(destroyed);
}

asio::awaitable<void> make_shared_handles(soak& s) {
    for (int i = 0; i < 3; ++i) {
        auto made = co_await s.rt.async_create(soak_spec());
        REQUIRE(made);
        s.shared.push_back(std::move(*made));
    }
}

// Destroys the shared handles, shuts the manager down, and waits (bounded) for the background
// destroys of dropped handles to finish.
asio::awaitable<void> wind_down(soak& s) {
    for (auto& box : s.shared) {
        auto destroyed = co_await box->async_destroy();
        CHECK(destroyed);
    }
    s.shared.clear();
    const auto report = co_await s.manager.async_shutdown();
    CHECK(report.left.empty());
    auto all_ended = [&s] {
        return s.rt.stats().live_sandboxes == 0 && s.rt.stats().creates_in_flight == 0;
    };
    auto waiting = moat::test::until(all_ended, 30s);
    const bool settled = co_await std::move(waiting);
    CHECK(settled);
}

}  // namespace

TEST_CASE("a soak of mixed operations, cancellations and deadlines leaves nothing behind" *
          moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto seconds = environment_number("MOAT_SOAK_SECONDS", 45);
    const auto seed = static_cast<std::uint32_t>(
        environment_number("MOAT_SOAK_SEED", static_cast<long>(std::random_device{}() >> 1)));
    MESSAGE("soak: " << seconds << " s, seed " << seed << " (MOAT_SOAK_SEED replays it)");
    char state_template[] = "/run/moat-soak-XXXXXX";
    REQUIRE(::mkdtemp(state_template) != nullptr);
    const std::string state_dir = state_template;

    asio::io_context io;
    {
        soak s(io, state_dir, seed);
        // Warm-up: the helper runs, the template root exists. The baseline is taken after it.
        moat::test::run_async(io, warm_up(s));
        const pid_t helper = moat::test::find_descendant(::getpid(), "helper --state-dir");
        REQUIRE(helper > 0);
        std::vector<std::string> cgroup_parents;
        for (const char* controller : {"memory", "pids", "cpu"}) {
            const auto dir = moat::test::cgroup_dir(helper, controller);
            if (!dir.empty()) cgroup_parents.push_back(dir + "/moat");
        }
        const std::size_t descriptors_before = open_descriptors();

        moat::test::run_async(io, make_shared_handles(s));
        const auto length = std::chrono::seconds(seconds);
        moat::test::run_async(io, run_workers(s, 8, length), length + 120s);

        // Every shared handle is still usable, with nothing queued.
        for (const auto& box : s.shared) {
            CHECK(box->queued() == 0);
            CHECK_MESSAGE(!box->quarantine_cause(), box->quarantine_cause()->to_string());
            CHECK(box->state() == moat::handle_state::ready);
        }
        CHECK(s.manager.acquiring() == 0);
        moat::test::run_async(io, wind_down(s));

        std::string summary;
        for (const auto& [what, n] : s.outcomes) summary += " " + what + "=" + std::to_string(n);
        MESSAGE("soak outcomes:" << summary);
        for (const auto& failure : s.failures) MESSAGE("backend failure: " << failure);
        for (const auto& what : s.escaped) FAIL_CHECK("an exception escaped: " << what);
        CHECK(s.outcomes["exec:ok"] > 0);
        CHECK(s.outcomes["acquire:ok"] > 0);
        CHECK(s.outcomes["run_once:ok"] > 0);
        CHECK(s.rt.stats().creates_in_flight == 0);
        CHECK(s.rt.stats().live_sandboxes == 0);
        CHECK(s.manager.acquiring() == 0);
        CHECK(s.manager.sessions() == 0);
        CHECK(s.rt.metrics().quarantines == 0);

        // From the host: no sandbox process under the helper, no cgroup, no record, no
        // descriptor more than before.
        CHECK(moat::test::eventually([&] { return moat::test::descendants(helper).empty(); }, 20s));
        for (const auto& parent : cgroup_parents) {
            CAPTURE(parent);
            CHECK(moat::test::eventually([&] { return entries_named(parent, s.ids) == 0; }, 20s));
        }
        CHECK(entries_named(state_dir + "/sandboxes", s.ids) == 0);
        CHECK(open_descriptors() == descriptors_before);
        MESSAGE("soak: " << s.ids.size() << " sandboxes made and accounted for");
    }
    io.run_for(2s);
    std::error_code ignored;
    std::filesystem::remove_all(state_dir, ignored);
}
