// The local backend when something around it goes wrong: threads racing on process-wide state, a
// helper that cannot be reaped or is lost, a host set up wrongly, and what is logged when a
// sandbox ends. Each fault is a real one (a real tracer, a real unsearchable directory, a real
// unprivileged user); the host is inspected from the host.
#include <doctest/doctest.h>

#include <moat/local_backend.hpp>
#include <moat/log.hpp>

#include "support/async_wait.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"
#include "support/moat_cli.hpp"

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using moat::test::local_fixture;
using moat::test::parent_of;
using namespace std::chrono_literals;

namespace {

// Records what moat logs while it is alive; the sink is process-wide.
class captured_log {
  public:
    captured_log() {
        moat::set_log_sink([this](const moat::log_record& r) {
            const std::lock_guard lock(mutex_);
            records_.push_back({r.level, std::string(r.component), std::string(r.message),
                                std::string(r.sandbox_id)});
        });
    }
    ~captured_log() { moat::set_log_sink({}); }
    captured_log(const captured_log&) = delete;
    captured_log& operator=(const captured_log&) = delete;

    struct entry {
        moat::log_level level;
        std::string component, message, sandbox_id;
    };

    // Warnings and errors about `sandbox_id`, one per line.
    std::string warnings_about(const std::string& sandbox_id) const {
        const std::lock_guard lock(mutex_);
        std::string out;
        for (const auto& e : records_) {
            if (e.sandbox_id != sandbox_id || e.level < moat::log_level::warning) continue;
            out += e.component + ": " + e.message + "\n";
        }
        return out;
    }

    bool contains(const std::string& needle) const {
        const std::lock_guard lock(mutex_);
        return std::any_of(records_.begin(), records_.end(), [&](const entry& e) {
            return e.message.find(needle) != std::string::npos;
        });
    }

  private:
    mutable std::mutex mutex_;
    std::vector<entry> records_;
};

std::string temporary_dir() {
    char name[] = "/tmp/moat-faults-test-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    return name;
}

std::size_t lines(const std::string& text) {
    return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

using moat::test::cli_outcome;
using moat::test::moat_cli;

// One thread's share of the dumpable test: a backend of its own, one sandbox, many file
// operations (each switches the thread's filesystem identity and back).
struct file_worker {
    std::string failure;
    int operations = 0;

    void run(int count) {
        local_fixture f;
        auto made = f.run(f.local->async_create({}));
        if (!made) {
            failure = "create: " + made.error().to_string();
            return;
        }
        std::vector<moat::file_write> files(1);
        files[0].path = "/workspace/f";
        files[0].content = "x";
        for (int i = 0; i < count && failure.empty(); ++i) {
            auto written = f.run(f.local->async_write_files(made->id, files));
            auto stat = f.run(f.local->async_stat(made->id, "/workspace/f"));
            if (!written || !stat) {
                failure = "file operation failed";
                break;
            }
            operations += 2;
        }
        auto destroyed = f.run(f.local->async_destroy(made->id));
        if (!destroyed && failure.empty()) failure = "destroy: " + destroyed.error().to_string();
    }
};

}  // namespace

TEST_CASE("file operations on two threads at once leave the process dumpable") {
    MOAT_REQUIRE_NAMESPACES();
    // A change of filesystem uid resets the (process-wide) dumpable flag; each file operation
    // puts it back. Two threads must not leave it reset.
    REQUIRE(::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0);
    file_worker first, second;
    std::thread a([&] { first.run(400); });
    std::thread b([&] { second.run(400); });
    a.join();
    b.join();
    CHECK_MESSAGE(first.failure.empty(), first.failure);
    CHECK_MESSAGE(second.failure.empty(), second.failure);
    CHECK(first.operations == 800);
    CHECK(second.operations == 800);
    CHECK(::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1);
}

namespace {

// Kills a survivor's pid 1 at the end of a test that failed before destroying it (the janitor
// removes its record later), so a failure leaves no process running to its TTL.
struct survivor_guard {
    pid_t pid;
    ~survivor_guard() {
        if (moat::test::is_running(pid)) ::kill(pid, SIGKILL);
    }
};

moat::sandbox_spec survivor_spec() {
    moat::sandbox_spec spec;
    spec.survive_owner = true;
    spec.ttl = 10min;
    spec.labels["test"] = "faults";
    return spec;
}

struct destroy_outcome {
    bool is_done = false;
    moat::result<void> result;
};

asio::awaitable<void> destroy_into(moat::backend& local, std::string id, destroy_outcome& out) {
    out.result = co_await local.async_destroy(std::move(id));
    out.is_done = true;
}

asio::awaitable<bool> both_done(asio::io_context& io, const destroy_outcome& a,
                                const destroy_outcome& b) {
    asio::steady_timer timer(io);
    for (int i = 0; i < 3000 && !(a.is_done && b.is_done); ++i) {
        timer.expires_after(10ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
    co_return a.is_done&& b.is_done;
}

}  // namespace

TEST_CASE("two concurrent destroys of an attached sandbox share one wait and both succeed") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    const auto box = creator.create(survivor_spec());
    const pid_t init = *box.host_pid;
    const survivor_guard guard{init};
    creator.shut_down();
    REQUIRE(moat::test::is_running(init));

    local_fixture other;
    REQUIRE(other.run(other.local->async_attach(box.id)));
    destroy_outcome first, second;
    other.tasks.spawn(destroy_into(*other.local, box.id, first));
    other.tasks.spawn(destroy_into(*other.local, box.id, second));
    REQUIRE(other.run(both_done(other.io, first, second)));
    CHECK_MESSAGE(first.result, (first.result ? "" : first.result.error().to_string()));
    CHECK_MESSAGE(second.result, (second.result ? "" : second.result.error().to_string()));
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(init); }));
    // Done: a third destroy finds nothing.
    auto again = other.run(other.local->async_destroy(box.id));
    REQUIRE_FALSE(again);
    CHECK(again.error().code == moat::errc::sandbox_not_found);
}

TEST_CASE("destroying the backend gives up on a helper that cannot be reaped, and says so") {
    MOAT_REQUIRE_NAMESPACES();
    captured_log log;
    auto f = std::make_unique<local_fixture>();
    const auto box = f->create();
    const pid_t helper = parent_of(*box.host_pid);
    REQUIRE(helper > 0);
    REQUIRE(moat::test::command_line(helper).find("helper --state-dir") != std::string::npos);
    std::vector<std::string> cgroups;
    for (const char* controller : {"memory", "pids", "cpu"}) {
        cgroups.push_back(moat::test::cgroup_dir(*box.host_pid, controller));
    }

    // A tracer that never waits: the helper's exit is then visible only to it, so the backend's
    // waitid for its own child would block for as long as the tracer lives.
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t tracer = ::fork();
    REQUIRE(tracer >= 0);
    if (tracer == 0) {
        ::close(ready[0]);
        const char ok = ::ptrace(PTRACE_SEIZE, helper, nullptr, nullptr) == 0 ? 'y' : 'n';
        (void)::write(ready[1], &ok, 1);
        for (;;) ::pause();
    }
    ::close(ready[1]);
    char ok = 0;
    REQUIRE(::read(ready[0], &ok, 1) == 1);
    ::close(ready[0]);
    REQUIRE(ok == 'y');

    std::atomic<bool> destroyed{false};
    std::thread destroyer([&] {
        f.reset();
        destroyed = true;
    });
    const bool bounded = moat::test::eventually([&] { return destroyed.load(); }, 60s);
    ::kill(tracer, SIGKILL);  // releases the helper's exit to its parent
    ::waitpid(tracer, nullptr, 0);
    destroyer.join();
    CHECK_MESSAGE(bounded, "~local_backend was still waiting for the helper after 60 s");
    CHECK(log.contains("was not reaped"));
    // The helper's exit, released by the tracer's end, is ours to collect now.
    CHECK(moat::test::eventually([&] { return ::waitpid(helper, nullptr, WNOHANG) == helper; }));
    // The helper was killed before it could remove its sandbox's cgroups (the janitor's job).
    for (const auto& dir : cgroups) {
        if (dir.empty()) continue;
        (void)moat::test::eventually([&] { return ::rmdir(dir.c_str()) == 0 || errno == ENOENT; },
                                     2s);
    }
}

TEST_CASE("losing the helper leaves attached sandboxes usable and ends only the helper's own") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture creator;
    const auto survivor = creator.create(survivor_spec());
    const survivor_guard guard{*survivor.host_pid};
    creator.shut_down();

    local_fixture other;
    REQUIRE(other.run(other.local->async_attach(survivor.id)));
    const auto own = other.create();
    const pid_t helper = parent_of(*own.host_pid);
    REQUIRE(helper > 0);
    REQUIRE(moat::test::command_line(helper).find("helper --state-dir") != std::string::npos);
    REQUIRE(::kill(helper, SIGKILL) == 0);
    REQUIRE(moat::test::eventually([&] {
        auto r = other.run(other.local->async_exec(own.id, moat::test::shell("true")));
        return !r && r.error().code == moat::errc::sandbox_unavailable;
    }));

    auto ran = other.run(other.local->async_exec(survivor.id, moat::test::shell("echo alive")));
    REQUIRE_MESSAGE(ran, (ran ? "" : ran.error().to_string()));
    CHECK(ran->out.text() == "alive\n");
    auto inspected = other.run(other.local->async_inspect(survivor.id));
    REQUIRE(inspected);
    CHECK(inspected->state == moat::sandbox_state::running);
    CHECK(other.run(other.local->async_destroy(survivor.id)));
    CHECK(moat::test::eventually([&] { return !moat::test::is_running(*survivor.host_pid); }));
    (void)other.run(other.local->async_destroy(own.id));
}

namespace {

// The create failure a backend reports with `options`, run in a child process that first takes
// `uid` (0: stays root). Returns "<errc name>|<condition is retryable>|<detail>".
std::string create_failure_in_child(const moat::local_options& options, uid_t uid) {
    int out[2];
    REQUIRE(::pipe(out) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(out[0]);
        std::string text = "setup of the child failed";
        if (uid == 0 || (::setgroups(0, nullptr) == 0 && ::setresgid(uid, uid, uid) == 0 &&
                         ::setresuid(uid, uid, uid) == 0)) {
            asio::io_context io;
            auto local = moat::make_local_backend(io.get_executor(), options);
            auto made = moat::test::run_async(io, local->async_create({}), 60s);
            if (made) {
                text = "created " + made->id;
                (void)moat::test::run_async(io, local->async_destroy(made->id), 60s);
            } else {
                const bool retryable = made.error().code == moat::condition::retryable;
                text = std::string(
                           moat::to_string(static_cast<moat::errc>(made.error().code.value()))) +
                       "|" + (retryable ? "retryable" : "final") + "|" + made.error().detail;
            }
            local.reset();
        }
        (void)::write(out[1], text.data(), text.size());
        ::_exit(0);
    }
    ::close(out[1]);
    std::string text;
    char buffer[512];
    ssize_t n;
    while ((n = ::read(out[0], buffer, sizeof buffer)) > 0) text.append(buffer, n);
    ::close(out[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    return text;
}

}  // namespace

namespace {

// `moat run` on a host it cannot use: one line, exit 3, layer_unavailable naming `reason`.
void check_setup_failure(const cli_outcome& o, const std::string& reason) {
    CHECK(o.exit_code == 3);  // exit_failure: moat could not do what was asked
    CHECK_MESSAGE(lines(o.output) == 1, o.output);
    CHECK_MESSAGE(o.output.rfind("moat run: cannot create a sandbox: layer_unavailable: ", 0) == 0,
                  o.output);
    CHECK_MESSAGE(o.output.find(reason) != std::string::npos, o.output);
}

}  // namespace

TEST_CASE("a state directory others cannot search fails create with the helper's reason") {
    MOAT_REQUIRE_NAMESPACES();
    const std::string dir = temporary_dir();  // 0700: sandbox uids cannot pass it
    moat::local_options options;
    options.state_dir = dir + "/state";

    SUBCASE("through the library") {
        asio::io_context io;
        auto local = moat::make_local_backend(io.get_executor(), options);
        auto made = moat::test::run_async(io, local->async_create({}), 60s);
        REQUIRE_FALSE(made);
        const auto& e = made.error();
        CHECK_MESSAGE(e.code == moat::errc::layer_unavailable, e.to_string());
        CHECK_FALSE(e.code == moat::condition::retryable);
        CHECK_MESSAGE(e.detail.find("not searchable by others") != std::string::npos,
                      e.to_string());
        CHECK(e.detail.find(dir) != std::string::npos);
        CHECK(e.detail.find('\n') == std::string::npos);
        // Nothing was recorded for a sandbox that was never asked for.
        CHECK_FALSE(std::filesystem::exists(options.state_dir + "/sandboxes"));
        // The host report still says what is wrong.
        auto report = moat::test::run_async(io, local->async_host_report(), 60s);
        REQUIRE(report);
        CHECK(report->detail.find("not searchable by others") != std::string::npos);
    }
    SUBCASE("through moat run, in a mount namespace whose /run is 0700") {
        const auto o = moat_cli(
            "unshare --mount --propagation private sh -c 'mount -t tmpfs -o mode=0700 tmpfs "
            "/run && exec \"$0\" \"$@\"'",
            "run -- true");
        check_setup_failure(o, "/run is not searchable by others");
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
}

TEST_CASE("a backend that is not root fails create with the helper's reason") {
    MOAT_REQUIRE_NAMESPACES();
    const std::string dir = temporary_dir();
    REQUIRE(::chmod(dir.c_str(), 0777) == 0);

    SUBCASE("through the library") {
        moat::local_options options;
        options.state_dir = dir + "/state";
        const std::string failure = create_failure_in_child(options, 65534);
        CHECK_MESSAGE(failure.rfind("layer_unavailable|final|", 0) == 0, failure);
        CHECK_MESSAGE(failure.find("needs euid 0") != std::string::npos, failure);
        CHECK(failure.find('\n') == std::string::npos);
    }
    SUBCASE("through moat run") {
        // Its default state directory is /tmp/moat-65534.
        const auto o = moat_cli(
            "env -u XDG_RUNTIME_DIR setpriv --reuid=65534 --regid=65534 "
            "--clear-groups",
            "run -- true");
        check_setup_failure(o, "needs euid 0");
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
}

TEST_CASE("a destroyed sandbox logs no warning, and one whose pid 1 died does") {
    MOAT_REQUIRE_NAMESPACES();
    captured_log log;
    local_fixture f;
    const auto normal = f.create();
    CHECK(f.sh(normal.id, "true").exit_code == 0);
    f.destroy(normal.id);
    CHECK_MESSAGE(log.warnings_about(normal.id).empty(), log.warnings_about(normal.id));

    const auto crashed = f.create();
    REQUIRE(::kill(*crashed.host_pid, SIGKILL) == 0);
    CHECK(f.run(moat::test::until([&] { return !log.warnings_about(crashed.id).empty(); })));
    (void)f.run(f.local->async_destroy(crashed.id));
}
