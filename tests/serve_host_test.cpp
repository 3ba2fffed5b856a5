// `moat serve` run in this process (serve::async_run_serve, as the CLI runs it) over the real local
// backend, for what a `moat serve` process started by a test cannot show: a destroy that fails or
// is held (tests/support/fault_injecting_backend.hpp wraps the real backend for that), and a state
// directory that is refused before anything listens. Clients are moat's HTTP client on loopback.
#include <moat/log.hpp>

#include "core/async_event.hpp"
#include "http/client.hpp"
#include "serve/serve_host.hpp"
#include "support/async_wait.hpp"
#include "support/fault_injecting_backend.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using moat::test::local_fixture;
namespace http = moat::http;
namespace serve = moat::serve;

constexpr std::string_view api_key = "e2b_0123456789abcdef0123456789abcdef01234567";

// A fresh directory for one test, 0700, removed at the end.
struct scratch_dir {
    scratch_dir() {
        std::string pattern =
            (std::filesystem::temp_directory_path() / "moat-serve-host-XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        path = pattern;
    }
    ~scratch_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string path;
};

// One in-process serve: what it announced and reported, and how it ended.
struct serve_run {
    std::string api_url;
    std::string envd_url;
    std::vector<std::string> reported;
    std::optional<int> exit_code;
    std::exception_ptr failure;
    asio::cancellation_signal stop;

    std::string reports() const {
        std::string all;
        for (const auto& line : reported) all += line + "\n";
        return all;
    }
};

asio::awaitable<void> run_serve(moat::backend* sandboxes, serve::serve_options options,
                                serve_run* run) {
    serve::serve_hooks hooks;
    hooks.announce = [run](std::string_view line) {
        if (line.starts_with("api ")) run->api_url = std::string(line.substr(4));
        if (line.starts_with("envd ")) run->envd_url = std::string(line.substr(5));
    };
    hooks.report = [run](std::string_view line) { run->reported.emplace_back(line); };
    hooks.stop_grace = 2s;
    run->exit_code =
        co_await serve::async_run_serve(*sandboxes, std::move(options), std::move(hooks));
}

struct note_end {
    serve_run* run;
    void operator()(std::exception_ptr e) const {
        run->failure = e;
        if (!run->exit_code) run->exit_code = -1;
    }
};

serve::serve_options options_for(const std::string& state_dir) {
    serve::serve_options o;
    o.api_listen = {asio::ip::make_address("127.0.0.1"), 0};
    o.envd_listen = {asio::ip::make_address("127.0.0.1"), 0};
    o.api_key = std::string(api_key);
    o.state_dir = state_dir;
    o.destroy_on_exit = true;
    return o;
}

// Starts serve on the fixture's io_context and waits until it listens or has ended.
void start(local_fixture& f, moat::backend& sandboxes, serve::serve_options options,
           serve_run& run) {
    asio::co_spawn(f.io, run_serve(&sandboxes, std::move(options), &run),
                   asio::bind_cancellation_slot(run.stop.slot(), note_end{&run}));
    const bool settled = f.run(moat::test::until(
        [&run] { return run.exit_code || (!run.api_url.empty() && !run.envd_url.empty()); }, 60s));
    REQUIRE_MESSAGE(settled, "serve neither listened nor ended: " << run.reports());
}

// Stops a serve that listens (SIGTERM's path: terminal cancellation) and waits for its end.
void stop(local_fixture& f, serve_run& run) {
    if (!run.exit_code) run.stop.emit(asio::cancellation_type::terminal);
    REQUIRE(f.run(moat::test::until([&run] { return run.exit_code.has_value(); }, 60s)));
    if (run.failure) std::rethrow_exception(run.failure);
}

// Stops the serve when a failed check leaves the test early, before the fixture's backend goes
// (with --destroy-on-exit its sandboxes go with it).
struct stop_on_exit {
    local_fixture& f;
    serve_run& run;
    moat::test::fault_injecting_backend* faulty = nullptr;  // its held destroys are let go
    ~stop_on_exit() {
        if (run.exit_code) return;
        if (faulty != nullptr && faulty->destroy_gate) faulty->destroy_gate->set();
        run.stop.emit(asio::cancellation_type::terminal);
        const auto limit = std::chrono::steady_clock::now() + 60s;
        while (!run.exit_code && std::chrono::steady_clock::now() < limit) {
            f.io.run_one_for(100ms);
            if (f.io.stopped()) f.io.restart();
        }
    }
};

struct reply {
    int status = -1;
    std::string body;
};

asio::awaitable<reply> call(http::client* client, std::string method, std::string url,
                            std::string body) {
    http::request r;
    r.method = std::move(method);
    r.url = std::move(url);
    r.headers.add("X-API-Key", std::string(api_key));
    if (!body.empty()) r.headers.add("Content-Type", "application/json");
    r.body = std::move(body);
    r.limit = moat::deadline::after(60s);
    auto fetched = co_await client->async_fetch(std::move(r), 1 << 20);
    reply out;
    if (!fetched) {
        out.body = fetched.error().to_string();
        co_return out;
    }
    out.status = fetched->status();
    out.body = std::move(fetched->body);
    co_return out;
}

asio::awaitable<void> call_into(http::client* client, std::string method, std::string url,
                                std::optional<reply>* out) {
    std::string empty;
    *out = co_await call(client, std::move(method), std::move(url), std::move(empty));
}

// A string field of a 201 Sandbox body ("sandboxID", "envdAccessToken").
std::string field_of(const std::string& body, const std::string& name) {
    const std::string key = "\"" + name + "\":\"";
    const auto at = body.find(key);
    if (at == std::string::npos) return {};
    const auto start = at + key.size();
    return body.substr(start, body.find('"', start) - start);
}

// GET /health on envd for a sandbox, with its token: the status.
asio::awaitable<int> envd_health(http::client* client, std::string envd_url, std::string id,
                                 std::string token) {
    http::request r;
    r.method = "GET";
    r.url = envd_url + "/health";
    r.headers.add("E2b-Sandbox-Id", id);
    r.headers.add("X-Access-Token", token);
    r.limit = moat::deadline::after(60s);
    auto fetched = co_await client->async_fetch(std::move(r), 1 << 20);
    if (!fetched) co_return -1;
    co_return fetched->status();
}

// Every log line whose message contains `needle`, while it lives.
struct log_watch {
    explicit log_watch(std::string needle) : needle_(std::move(needle)) {
        moat::set_log_sink([this](const moat::log_record& r) {
            if (r.message.find(needle_) != std::string_view::npos) ++seen;
        });
    }
    ~log_watch() { moat::set_log_sink({}); }
    log_watch(const log_watch&) = delete;
    log_watch& operator=(const log_watch&) = delete;
    std::size_t seen = 0;

  private:
    std::string needle_;
};

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a create that fails on the server's side tells the client its code, and the "
                  "log its detail, which may name host paths") {
    MOAT_REQUIRE_NAMESPACES();
    moat::test::fault_injecting_backend faulty(*local);
    scratch_dir state;
    serve_run served;
    http::client client(io.get_executor());
    stop_on_exit stopper{*this, served, &faulty};
    start(*this, faulty, options_for(state.path), served);
    REQUIRE_MESSAGE(!served.exit_code, served.reports());
    const std::string host_path = "/run/moat/serve-state/records/sb-1234.json";
    faulty.fail_next_create = moat::make_error(
        moat::errc::backend_failure, "cannot open " + host_path + ": Too many open files");
    log_watch logged(host_path);
    const auto refused = run(call(&client, "POST", served.api_url + "/v2/sandboxes",
                                  R"({"templateID":"base","timeout":600})"));
    CHECK(refused.status == 500);
    CHECK_MESSAGE(refused.body.find(host_path) == std::string::npos, refused.body);
    CHECK_MESSAGE(refused.body.find("backend_failure") != std::string::npos, refused.body);
    CHECK_MESSAGE(refused.body.find("the server's log has the detail") != std::string::npos,
                  refused.body);
    CHECK(logged.seen == 1);
    // The next create, which the backend serves, succeeds.
    const auto created = run(call(&client, "POST", served.api_url + "/v2/sandboxes",
                                  R"({"templateID":"base","timeout":600})"));
    CHECK_MESSAGE(created.status == 201, created.body);
    stop(*this, served);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a sandbox whose destroy failed stays listed and counted, a retried DELETE "
                  "destroys it, and concurrent DELETEs join one destroy") {
    MOAT_REQUIRE_NAMESPACES();
    moat::test::fault_injecting_backend faulty(*local);
    scratch_dir state;
    auto options = options_for(state.path);
    options.max_sandboxes = 1;
    serve_run served;
    http::client client(io.get_executor());
    std::optional<reply> first;  // the concurrent DELETEs' answers
    std::optional<reply> second;
    stop_on_exit stopper{*this, served, &faulty};
    start(*this, faulty, options, served);
    REQUIRE_MESSAGE(!served.exit_code, served.reports());
    const auto api = served.api_url;
    const std::string create_body = R"({"templateID":"base","timeout":600})";

    const auto created = run(call(&client, "POST", api + "/v2/sandboxes", create_body));
    REQUIRE_MESSAGE(created.status == 201, created.body);
    const std::string id = field_of(created.body, "sandboxID");
    const std::string token = field_of(created.body, "envdAccessToken");
    REQUIRE_FALSE(id.empty());
    CHECK(run(envd_health(&client, served.envd_url, id, token)) == 204);
    const auto inspected = run(local->async_inspect(id));
    REQUIRE(inspected);
    REQUIRE(inspected->host_pid);
    const pid_t init = *inspected->host_pid;
    const std::string one = api + "/sandboxes/" + id;

    // The destroy fails: 5xx naming it, and the sandbox, still running, is still this server's.
    faulty.failing_destroys = 1;
    const auto failed = run(call(&client, "DELETE", one, ""));
    CHECK(failed.status == 500);
    CHECK_MESSAGE(failed.body.find("not confirmed") != std::string::npos, failed.body);
    CHECK_MESSAGE(failed.body.find(id) != std::string::npos, failed.body);
    CHECK(moat::test::is_running(init));
    CHECK(run(call(&client, "GET", one, "")).status == 200);
    const auto listed = run(call(&client, "GET", api + "/v2/sandboxes", ""));
    CHECK(listed.status == 200);
    CHECK_MESSAGE(listed.body.find(id) != std::string::npos, listed.body);
    const auto over_cap = run(call(&client, "POST", api + "/v2/sandboxes", create_body));
    CHECK_MESSAGE(over_cap.status == 429, over_cap.body);
    // For envd it is gone once its destroy started (its streams ended then): 502, as E2B's proxy.
    CHECK(run(envd_health(&client, served.envd_url, id, token)) == 502);

    // Two DELETEs while the destroy is held join it: one destroy, one outcome (here a failure).
    auto gate = std::make_shared<moat::async_event>(io.get_executor());
    faulty.destroy_gate = gate;
    faulty.failing_destroys = 1;
    faulty.destroys = 0;
    {
        log_watch joins("joins the destroy");
        tasks.spawn(call_into(&client, "DELETE", one, &first));
        REQUIRE(run(moat::test::until([&] { return faulty.destroys == 1; })));
        // Listed while it is being destroyed.
        CHECK(run(call(&client, "GET", one, "")).status == 200);
        tasks.spawn(call_into(&client, "DELETE", one, &second));
        REQUIRE(run(moat::test::until([&] { return joins.seen == 1; })));
        gate->set();
        REQUIRE(run(moat::test::until([&] { return first && second; })));
        CHECK(first->status == 500);
        CHECK(second->status == 500);
        CHECK(second->body == first->body);
        CHECK(faulty.destroys == 1);
    }
    CHECK(moat::test::is_running(init));
    CHECK(run(call(&client, "GET", one, "")).status == 200);

    // The retry destroys it, confirmed; then it is gone for every route.
    faulty.destroy_gate.reset();
    const auto retried = run(call(&client, "DELETE", one, ""));
    CHECK_MESSAGE(retried.status == 204, retried.body);
    CHECK_FALSE(moat::test::is_running(init));
    CHECK(run(call(&client, "GET", one, "")).status == 404);
    CHECK(run(call(&client, "DELETE", one, "")).status == 404);
    const auto listed_after = run(call(&client, "GET", api + "/v2/sandboxes", ""));
    CHECK(listed_after.body.find(id) == std::string::npos);
    const auto room = run(call(&client, "POST", api + "/v2/sandboxes", create_body));
    CHECK_MESSAGE(room.status == 201, room.body);

    stop(*this, served);
    CHECK(served.exit_code == 0);
}

TEST_CASE_FIXTURE(local_fixture,
                  "serve refuses a state directory another user owns or others may write, "
                  "naming the problem, and makes its own private") {
    struct refusal {
        uid_t owner;
        mode_t mode;
        std::string named;
    };
    const uid_t me = ::geteuid();
    const uid_t other = me == 65534 ? 65533 : 65534;
    for (const auto& [owner, mode, named] : std::vector<refusal>{
             {other, 0700, "owned by uid " + std::to_string(other)},
             {me, 0777, "writable by others"},
             {me, 0770, "writable by its group"},
             {me, 01733, "writable by others"},
         }) {
        CAPTURE(owner);
        CAPTURE(mode);
        scratch_dir parent;
        const std::string dir = parent.path + "/state";
        REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
        REQUIRE(::chmod(dir.c_str(), mode) == 0);
        REQUIRE(::chown(dir.c_str(), owner, static_cast<gid_t>(-1)) == 0);
        serve_run served;
        stop_on_exit stopper{*this, served};
        start(*this, *local, options_for(dir), served);
        CHECK(served.api_url.empty());
        CHECK(served.exit_code == 3);
        const auto said = served.reports();
        CHECK_MESSAGE(said.find(named) != std::string::npos, said);
        CHECK_MESSAGE(said.find(dir) != std::string::npos, said);
        // Refused as found: not "fixed", nothing written into it.
        struct stat st {};
        REQUIRE(::stat(dir.c_str(), &st) == 0);
        CHECK((st.st_mode & 07777) == mode);
        CHECK(st.st_uid == owner);
        CHECK(std::filesystem::is_empty(dir));
    }
    // Its own, readable by others but writable by no one else: taken, and made private.
    scratch_dir parent;
    const std::string dir = parent.path + "/state";
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    REQUIRE(::chmod(dir.c_str(), 0755) == 0);
    serve_run served;
    stop_on_exit stopper{*this, served};
    start(*this, *local, options_for(dir), served);
    CHECK_MESSAGE(!served.api_url.empty(), served.reports());
    stop(*this, served);
    CHECK(served.exit_code == 0);
    struct stat st {};
    REQUIRE(::stat(dir.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0700);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a create whose denyOut names a range the sandbox would reach is a 400 naming "
                  "it") {
    scratch_dir state;
    auto options = options_for(state.path);
    options.network.mode = moat::network_mode::all;  // any public host, by name
    serve_run served;
    http::client client(io.get_executor());
    stop_on_exit stopper{*this, served};
    start(*this, *local, options, served);
    REQUIRE_MESSAGE(!served.exit_code, served.reports());
    const auto refused = run(call(&client, "POST", served.api_url + "/v2/sandboxes",
                                  R"({"templateID":"base","network":{"denyOut":)"
                                  R"(["10.0.0.0/8","203.0.114.0/24"]}})"));
    CHECK(refused.status == 400);
    CHECK_MESSAGE(refused.body.find("203.0.114.0/24") != std::string::npos, refused.body);
    CHECK_MESSAGE(refused.body.find("10.0.0.0/8") == std::string::npos, refused.body);
    const auto listed = run(call(&client, "GET", served.api_url + "/v2/sandboxes", ""));
    CHECK(listed.body == "[]");
    stop(*this, served);
    CHECK(served.exit_code == 0);
}
