#include "cli/bench/e2b_bench.hpp"

#include <moat/e2b_backend.hpp>
#include <moat/runtime.hpp>
#include <moat/task_group.hpp>

#include "cli/arguments.hpp"
#include "cli/bench/helper_process.hpp"
#include "cli/bench/iteration.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/cli_runtime.hpp"
#include "core/json_writer.hpp"

#include <simdjson.h>

#include <asio/this_coro.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef MOAT_E2B_BENCH_SCRIPT
#define MOAT_E2B_BENCH_SCRIPT ""
#endif
#ifndef MOAT_E2B_SDK_DIR
#define MOAT_E2B_SDK_DIR ""
#endif

namespace moat::cli {
namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::size_t warmup_commands = 5;
constexpr auto serve_start_budget = std::chrono::seconds(30);
constexpr auto serve_stop_budget = std::chrono::seconds(60);
constexpr auto node_budget = std::chrono::seconds(300);

double ms_since(clock_type::time_point t) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

struct e2b_bench_options {
    std::size_t n = 200;
    std::size_t concurrency = 4;
    std::size_t lifecycle_n = 20;
    std::string command = "echo hello";
    std::string json_path;
    std::string sdk_dir;
    std::string script;
    std::string node = "node";
};

// One side of part (a): CPU of the client during the measured commands, their wall time and
// latencies.
struct command_side {
    explicit command_side(const char* name) : latency{name, {}, 0} {}
    latency_samples latency;
    double cpu_user_ms = 0;
    double cpu_system_ms = 0;
    double cpu_thread_ms = 0;  // C++ only: RUSAGE_THREAD of the executor's thread
    double wall_ms = 0;
    std::string why;  // the first failure
    bool has_run = false;

    double cpu_per_command_ms() const {
        return latency.ms.empty() ? 0.0 : (cpu_user_ms + cpu_system_ms) / latency.ms.size();
    }
    double throughput() const { return wall_ms > 0 ? latency.ms.size() * 1000.0 / wall_ms : 0.0; }
};

struct e2b_bench_results {
    command_side cpp{"cpp_command"};
    command_side sdk{"sdk_command"};
    std::string sdk_version;
    latency_samples e2b_create{"e2b_create", {}, 0};
    latency_samples e2b_create_exec{"e2b_create_exec", {}, 0};
    latency_samples local_create{"local_create", {}, 0};
    latency_samples local_create_exec{"local_create_exec", {}, 0};
    std::string lifecycle_why;
    int serve_code = -1;
    std::string why;  // serve or setup failures
};

// The `moat serve` child.
struct serve_child {
    pid_t pid = -1;
    std::string api_url;
    std::string envd_url;
    std::string api_key;
    std::string stderr_path;
};

std::string read_whole(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// Waits for `pid` until `budget` passes; its exit code (128 + signal), or -1 (then SIGKILLed).
int wait_child(pid_t pid, std::chrono::seconds budget) {
    const auto limit = clock_type::now() + budget;
    for (;;) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) == pid) {
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        if (clock_type::now() >= limit) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
}

// fork + exec with stdout and stderr into files; -1 if fork failed.
pid_t spawn_to_files(const std::vector<std::string>& argv, const std::string& out_path,
                     const std::string& err_path) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    const int null_in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (null_in < 0 || out < 0 || err < 0 || ::dup2(null_in, 0) < 0 || ::dup2(out, 1) < 0 ||
        ::dup2(err, 2) < 0) {
        ::_exit(127);
    }
    ::execvp(args[0], args.data());
    ::_exit(127);
}

// Starts this binary's `serve` and waits for its two listener lines; "" or why it failed.
std::string start_serve(const std::string& dir, serve_child& s) {
    s.api_key = random_api_key();
    const std::string key_file = dir + "/api-key";
    {
        std::ofstream out(key_file);
        out << s.api_key << "\n";
    }
    ::chmod(key_file.c_str(), 0600);
    const std::string out_path = dir + "/serve.out";
    s.stderr_path = dir + "/serve.err";
    std::error_code ec;
    const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) return "cannot find this binary (/proc/self/exe)";
    s.pid = spawn_to_files(
        {self, "serve", "--listen", "127.0.0.1:0", "--envd-listen", "127.0.0.1:0", "--api-key-file",
         key_file, "--state-dir", dir + "/state", "--destroy-on-exit"},
        out_path, s.stderr_path);
    if (s.pid < 0) return "fork failed";
    const auto limit = clock_type::now() + serve_start_budget;
    while (clock_type::now() < limit) {
        std::istringstream lines(read_whole(out_path));
        std::string line;
        while (std::getline(lines, line)) {
            if (line.rfind("api ", 0) == 0) s.api_url = line.substr(4);
            if (line.rfind("envd ", 0) == 0) s.envd_url = line.substr(5);
        }
        if (!s.api_url.empty() && !s.envd_url.empty()) return "";
        int status = 0;
        if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
            s.pid = -1;
            return "moat serve exited before listening: " + read_whole(s.stderr_path);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(s.pid, SIGKILL);
    ::waitpid(s.pid, nullptr, 0);
    s.pid = -1;
    return "moat serve printed no listeners within 30 s";
}

struct cpu_times {
    double user_ms = 0, system_ms = 0, thread_ms = 0;
};

double to_ms(const timeval& t) {
    return t.tv_sec * 1000.0 + t.tv_usec / 1000.0;
}

cpu_times cpu_now() {
    cpu_times c;
    rusage self{};
    rusage thread{};
    ::getrusage(RUSAGE_SELF, &self);
    ::getrusage(RUSAGE_THREAD, &thread);
    c.user_ms = to_ms(self.ru_utime);
    c.system_ms = to_ms(self.ru_stime);
    c.thread_ms = to_ms(thread.ru_utime) + to_ms(thread.ru_stime);
    return c;
}

struct command_run {
    sandbox* box = nullptr;
    std::string command;
    std::size_t count = 0;
    std::size_t next = 0;
    latency_samples* latency = nullptr;
    std::string* why = nullptr;
};

asio::awaitable<void> command_worker(command_run* run) {
    while (run->next < run->count) {
        ++run->next;
        // The process the SDK's commands.run() starts, so the server does the same work for both.
        exec_request request;
        request.argv = {"/bin/bash", "-l", "-c", run->command};
        const auto start = clock_type::now();
        auto ran = co_await run->box->async_exec(std::move(request));
        const double ms = ms_since(start);
        if (ran && ran->exit_code == 0) {
            run->latency->ms.push_back(ms);
            continue;
        }
        ++run->latency->failures;
        if (run->why->empty()) {
            if (ran) {
                *run->why = "exit code " + std::to_string(ran->exit_code);
            } else {
                *run->why = ran.error().to_string();
            }
        }
    }
}

// `count` commands `concurrency` at a time in `box`.
asio::awaitable<void> run_commands(sandbox* box, std::string command, std::size_t count,
                                   std::size_t concurrency, latency_samples* latency,
                                   std::string* why) {
    command_run run{box, std::move(command), count, 0, latency, why};
    task_group workers(co_await asio::this_coro::executor, "bench e2b commands");
    for (std::size_t w = 0; w < concurrency; ++w) workers.spawn(command_worker(&run));
    co_await workers.async_wait_all();
}

// Part (a), C++ side: one sandbox through the e2b backend, warm-up, then the measured commands.
asio::awaitable<void> cpp_commands(runtime& remote, e2b_bench_options o, command_side* side) {
    sandbox_spec spec;
    spec.labels["bench"] = "moat-bench-e2b";
    auto created = co_await remote.async_create(spec);
    if (!created) {
        side->why = "create: " + created.error().to_string();
        co_return;
    }
    auto box = std::move(*created);
    latency_samples warmup{"warmup", {}, 0};
    std::string warmup_why;
    co_await run_commands(box.get(), o.command, warmup_commands, 1, &warmup, &warmup_why);
    const cpu_times before = cpu_now();
    const auto start = clock_type::now();
    co_await run_commands(box.get(), o.command, o.n, o.concurrency, &side->latency, &side->why);
    side->wall_ms = ms_since(start);
    const cpu_times after = cpu_now();
    side->cpu_user_ms = after.user_ms - before.user_ms;
    side->cpu_system_ms = after.system_ms - before.system_ms;
    side->cpu_thread_ms = after.thread_ms - before.thread_ms;
    side->has_run = true;
    auto destroyed = co_await box->async_destroy();
    if (!destroyed && side->why.empty()) side->why = "destroy: " + destroyed.error().to_string();
}

// Part (b): create + first exec of /bin/true + destroy, one on each backend.
asio::awaitable<void> lifecycle_once(runtime& sandboxes, latency_samples* create,
                                     latency_samples* create_exec, std::string* why) {
    sandbox_spec spec;
    spec.labels["bench"] = "moat-bench-e2b";
    const auto start = clock_type::now();
    auto created = co_await sandboxes.async_create(spec);
    const double create_ms = ms_since(start);
    if (!created) {
        ++create->failures;
        ++create_exec->failures;
        if (why->empty()) *why = "create: " + created.error().to_string();
        co_return;
    }
    auto box = std::move(*created);
    exec_request request;
    request.argv = {"/bin/true"};
    auto ran = co_await box->async_exec(std::move(request));
    const double create_exec_ms = ms_since(start);
    create->ms.push_back(create_ms);
    if (ran && ran->exit_code == 0) {
        create_exec->ms.push_back(create_exec_ms);
    } else {
        ++create_exec->failures;
        if (why->empty()) {
            if (ran) {
                *why = "first exec: exit code " + std::to_string(ran->exit_code);
            } else {
                *why = "first exec: " + ran.error().to_string();
            }
        }
    }
    auto destroyed = co_await box->async_destroy();
    if (!destroyed && why->empty()) *why = "destroy: " + destroyed.error().to_string();
}

asio::awaitable<int> run_cpp_side(backend& local, e2b_bench_options o, serve_child serve,
                                  e2b_bench_results* r) {
    const auto executor = co_await asio::this_coro::executor;
    e2b_config config;
    config.api_url = serve.api_url;
    config.sandbox_url = serve.envd_url;
    config.api_key = serve.api_key;
    auto e2b = make_e2b_backend(executor, config);
    {
        runtime remote(*e2b, bench_runtime_options(o.lifecycle_n + 2, o.concurrency));
        co_await cpp_commands(remote, o, &r->cpp);
        runtime library(local, bench_runtime_options(o.lifecycle_n + 2, 1));
        // One warm-up each, then interleaved, alternating which goes first.
        latency_samples scratch_a{"warmup", {}, 0};
        latency_samples scratch_b{"warmup", {}, 0};
        std::string scratch_why;
        co_await lifecycle_once(remote, &scratch_a, &scratch_b, &scratch_why);
        co_await lifecycle_once(library, &scratch_a, &scratch_b, &scratch_why);
        for (std::size_t i = 0; i < o.lifecycle_n; ++i) {
            if (i % 2 == 0) {
                co_await lifecycle_once(remote, &r->e2b_create, &r->e2b_create_exec,
                                        &r->lifecycle_why);
                co_await lifecycle_once(library, &r->local_create, &r->local_create_exec,
                                        &r->lifecycle_why);
            } else {
                co_await lifecycle_once(library, &r->local_create, &r->local_create_exec,
                                        &r->lifecycle_why);
                co_await lifecycle_once(remote, &r->e2b_create, &r->e2b_create_exec,
                                        &r->lifecycle_why);
            }
        }
    }
    co_return 0;
}

// Part (a), SDK side: node e2b_bench.mjs against the same serve; its JSON line parsed.
void run_sdk_side(const e2b_bench_options& o, const serve_child& serve, const std::string& dir,
                  e2b_bench_results* r) {
    command_side& side = r->sdk;
    if (o.script.empty() || !std::filesystem::exists(o.script)) {
        side.why = "the SDK script e2b_bench.mjs was not found (pass --sdk-script)";
        return;
    }
    ::setenv("E2B_API_URL", serve.api_url.c_str(), 1);
    ::setenv("E2B_SANDBOX_URL", serve.envd_url.c_str(), 1);
    ::setenv("E2B_API_KEY", serve.api_key.c_str(), 1);
    const std::string out_path = dir + "/sdk.out";
    const std::string err_path = dir + "/sdk.err";
    const pid_t pid =
        spawn_to_files({o.node, o.script, "--sdk-dir", o.sdk_dir, "--n", std::to_string(o.n),
                        "--concurrency", std::to_string(o.concurrency), "--warmup",
                        std::to_string(warmup_commands), "--command", o.command},
                       out_path, err_path);
    ::unsetenv("E2B_API_KEY");
    if (pid < 0) {
        side.why = "fork failed";
        return;
    }
    const int code = wait_child(pid, node_budget);
    std::string text = read_whole(out_path);
    if (code != 0) {
        // One line: node's first error line (its stack trace and source excerpt dropped).
        std::istringstream lines(read_whole(err_path));
        std::string line;
        std::string err;
        while (std::getline(lines, line)) {
            const bool is_error_line =
                !line.empty() && line[0] != ' ' && line.find("Error: ") != std::string::npos;
            if (err.empty() || is_error_line) err = line;
            if (is_error_line) break;
        }
        if (err.size() > 200) err.resize(200);
        side.why = "node exited " + std::to_string(code) + ": " + err;
        return;
    }
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    const simdjson::padded_string padded(text);
    double user_us = 0, system_us = 0, wall_ms = 0;
    std::int64_t failures = 0;
    simdjson::dom::array latencies;
    if (parser.parse(padded).get(doc) != simdjson::SUCCESS ||
        doc["cpu_user_us"].get_double().get(user_us) != simdjson::SUCCESS ||
        doc["cpu_system_us"].get_double().get(system_us) != simdjson::SUCCESS ||
        doc["wall_ms"].get_double().get(wall_ms) != simdjson::SUCCESS ||
        doc["failures"].get_int64().get(failures) != simdjson::SUCCESS ||
        doc["latencies_ms"].get_array().get(latencies) != simdjson::SUCCESS) {
        side.why = "node printed no result line";
        return;
    }
    side.cpu_user_ms = user_us / 1000.0;
    side.cpu_system_ms = system_us / 1000.0;
    side.wall_ms = wall_ms;
    side.latency.failures = static_cast<std::size_t>(failures);
    for (auto v : latencies) {
        double ms = 0;
        if (v.get_double().get(ms) == simdjson::SUCCESS) side.latency.ms.push_back(ms);
    }
    std::string_view first_failure;
    if (doc["first_failure"].get_string().get(first_failure) == simdjson::SUCCESS)
        side.why = std::string(first_failure);
    std::string_view version;
    if (doc["sdk_version"].get_string().get(version) == simdjson::SUCCESS)
        r->sdk_version = std::string(version);
    side.has_run = true;
}

std::string format(const char* f, double a) {
    char text[64];
    std::snprintf(text, sizeof text, f, a);
    return text;
}

std::string ratio(double a, double b) {
    if (a <= 0 || b <= 0) return "n/a";
    return format("%.2fx", a / b);
}

double ratio_value(double a, double b) {
    return a > 0 && b > 0 ? a / b : 0.0;
}

std::string side_line(const char* name, const command_side& s) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "%-22s cpu/command %.3f ms (user %.1f ms, system %.1f ms in all), %.1f "
                  "commands/s, p50 %.2f ms, p99 %.2f ms, %zu ok, %zu failed\n",
                  name, s.cpu_per_command_ms(), s.cpu_user_ms, s.cpu_system_ms, s.throughput(),
                  s.latency.percentile(0.5), s.latency.percentile(0.99), s.latency.ms.size(),
                  s.latency.failures);
    return line;
}

void write_side(json_writer& w, const char* name, const command_side& s) {
    w.key(name).begin_object();
    w.key("ran").value(s.has_run);
    w.key("cpu_user_ms").value(s.cpu_user_ms);
    w.key("cpu_system_ms").value(s.cpu_system_ms);
    if (s.cpu_thread_ms > 0) w.key("cpu_thread_ms").value(s.cpu_thread_ms);
    w.key("cpu_per_command_ms").value(s.cpu_per_command_ms());
    w.key("commands_per_s").value(s.throughput());
    w.key("wall_ms").value(s.wall_ms);
    w.key("latency");
    write_summary(w, s.latency);
    if (!s.why.empty()) w.key("first_failure").value(s.why);
    w.end_object();
}

}  // namespace

int bench_e2b(int argc, char** argv) {
    e2b_bench_options o;
    o.sdk_dir = MOAT_E2B_SDK_DIR;
    o.script = MOAT_E2B_BENCH_SCRIPT;
    if (const char* dir = std::getenv("MOAT_E2B_SDK_DIR"); dir != nullptr && *dir != 0) {
        o.sdk_dir = dir;
    }
    parse_flags(
        argc, argv,
        {count_flag("--n", o.n, 1, 100'000), count_flag("--concurrency", o.concurrency, 1, 64),
         count_flag("--lifecycle-n", o.lifecycle_n, 0, 10'000), string_flag("--command", o.command),
         string_flag("--json", o.json_path), string_flag("--sdk-dir", o.sdk_dir),
         string_flag("--sdk-script", o.script), string_flag("--node", o.node)});
    scratch_directory scratch("moat-bench-e2b");
    const std::string dir = scratch.path();
    if (dir.empty()) {
        return report_error(
            "bench e2b",
            make_error(errc::backend_failure, "cannot make a temporary directory under /tmp"));
    }
    e2b_bench_results r;
    serve_child serve;
    // serve is started before any thread or io_context of this process exists (fork).
    r.why = start_serve(dir, serve);
    int code = 0;
    if (r.why.empty()) {
        code = run_with_backend(
            [&o, &serve, &r](backend& local) { return run_cpp_side(local, o, serve, &r); });
        run_sdk_side(o, serve, dir, &r);
        ::kill(serve.pid, SIGTERM);
        r.serve_code = wait_child(serve.pid, serve_stop_budget);
        if (r.serve_code != 0) {
            std::string err = read_whole(serve.stderr_path);
            if (err.size() > 300) err.resize(300);
            r.why = "moat serve exited " + std::to_string(r.serve_code) + ": " + err;
        }
    }
    if (code != 0) return code;

    std::string out;
    char line[320];
    std::snprintf(line, sizeof line,
                  "moat bench e2b: one moat serve (127.0.0.1, a child process); (a) %zu commands "
                  "('%s'), %zu at a time, in one sandbox per client, after %zu warm-up commands\n",
                  o.n, o.command.c_str(), o.concurrency, warmup_commands);
    out += line;
    out += side_line("C++ e2b backend", r.cpp);
    const std::string sdk_name = "e2b JS SDK " + r.sdk_version;
    out += side_line(sdk_name.c_str(), r.sdk);
    out +=
        "SDK / C++ client CPU per command: " +
        ratio(r.sdk.cpu_per_command_ms(), r.cpp.cpu_per_command_ms()) +
        " (target: >= 3x); C++ / SDK throughput: " + ratio(r.cpp.throughput(), r.sdk.throughput()) +
        "\n";
    if (!r.cpp.why.empty()) out += "C++ first failure: " + r.cpp.why + "\n";
    if (!r.sdk.why.empty()) out += "SDK first failure: " + r.sdk.why + "\n";
    std::snprintf(line, sizeof line,
                  "(b) %zu create + first exec (/bin/true) + destroy per backend, interleaved\n",
                  o.lifecycle_n);
    out += line;
    out += summary_header();
    for (const latency_samples* s :
         {&r.e2b_create, &r.local_create, &r.e2b_create_exec, &r.local_create_exec}) {
        out += summary_line(*s);
    }
    out += "e2b / local create: p50 " +
           ratio(r.e2b_create.percentile(0.5), r.local_create.percentile(0.5)) + ", p99 " +
           ratio(r.e2b_create.percentile(0.99), r.local_create.percentile(0.99)) + "\n";
    out += "e2b / local create + first exec: p50 " +
           ratio(r.e2b_create_exec.percentile(0.5), r.local_create_exec.percentile(0.5)) +
           ", p99 " +
           ratio(r.e2b_create_exec.percentile(0.99), r.local_create_exec.percentile(0.99)) + "\n";
    if (!r.lifecycle_why.empty()) out += "(b) first failure: " + r.lifecycle_why + "\n";
    if (!r.why.empty()) out += "failure: " + r.why + "\n";
    const bool published = publish_report("bench e2b", out, o.json_path, [&](json_writer& w) {
        w.key("n").value(static_cast<std::uint64_t>(o.n));
        w.key("concurrency").value(static_cast<std::uint64_t>(o.concurrency));
        w.key("command").value(o.command);
        write_side(w, "cpp", r.cpp);
        write_side(w, "sdk", r.sdk);
        w.key("sdk_version").value(r.sdk_version);
        w.key("sdk_over_cpp_cpu_per_command")
            .value(ratio_value(r.sdk.cpu_per_command_ms(), r.cpp.cpu_per_command_ms()));
        w.key("cpp_over_sdk_throughput").value(ratio_value(r.cpp.throughput(), r.sdk.throughput()));
        w.key("lifecycle_n").value(static_cast<std::uint64_t>(o.lifecycle_n));
        for (const latency_samples* s :
             {&r.e2b_create, &r.local_create, &r.e2b_create_exec, &r.local_create_exec}) {
            w.key(s->name);
            write_summary(w, *s);
        }
        w.key("e2b_over_local_create_p50")
            .value(ratio_value(r.e2b_create.percentile(0.5), r.local_create.percentile(0.5)));
        w.key("e2b_over_local_create_first_exec_p50")
            .value(ratio_value(r.e2b_create_exec.percentile(0.5),
                               r.local_create_exec.percentile(0.5)));
        w.key("serve_exit_code").value(r.serve_code);
    });
    const bool ok = published && r.why.empty() && r.cpp.has_run && r.sdk.has_run &&
                    r.cpp.latency.failures == 0 && r.sdk.latency.failures == 0 &&
                    r.e2b_create_exec.failures == 0 && r.local_create_exec.failures == 0 &&
                    r.lifecycle_why.empty() && r.cpp.why.empty() && r.sdk.why.empty();
    return ok ? 0 : exit_failure;
}

}  // namespace moat::cli
