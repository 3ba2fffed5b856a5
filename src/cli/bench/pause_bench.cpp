#include "cli/bench/pause_bench.hpp"

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>

#include "cli/arguments.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/cli_runtime.hpp"
#include "core/json_writer.hpp"

#include <chrono>
#include <cstdio>
#include <string>

namespace moat::cli {
namespace {

using namespace std::chrono_literals;

struct pause_bench_options {
    std::size_t n = 200;
    std::string json_path;
};

struct pause_samples {
    latency_samples pause{"pause", {}, 0};
    latency_samples resume{"resume", {}, 0};
};

// Times one call into `into`; false if it failed.
asio::awaitable<bool> timed(asio::awaitable<result<sandbox_info>> call, latency_samples& into) {
    const auto start = std::chrono::steady_clock::now();
    auto done = co_await std::move(call);
    if (!done) {
        ++into.failures;
        co_return false;
    }
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    into.ms.push_back(took.count());
    co_return true;
}

exec_request resident(std::string shell) {
    exec_request r;
    r.shell = std::move(shell);
    r.resident = true;
    r.wall_limit = 60min;
    return r;
}

asio::awaitable<int> run_bench(backend& b, const pause_bench_options& o, pause_samples& r) {
    runtime sandboxes(b);
    sandbox_spec spec;
    spec.labels["moat.cli"] = "bench-pause";
    auto created = co_await sandboxes.async_create(spec);
    if (!created) co_return report_error("bench pause", created.error());
    auto box = std::move(*created);
    auto holder = co_await box->async_spawn(resident(
        "exec python3 -c 'import time\nb = bytearray(64 << 20)\nwhile True: time.sleep(1)'"));
    auto busy = co_await box->async_spawn(resident("while :; do :; done"));
    int code = 0;
    if (!holder || !busy)
        code = report_error("bench pause", holder ? busy.error() : holder.error());
    for (std::size_t i = 0; code == 0 && i < o.n; ++i) {
        auto pause = box->async_pause();
        const bool paused = co_await timed(std::move(pause), r.pause);
        auto resume = box->async_resume();
        const bool resumed = co_await timed(std::move(resume), r.resume);
        if (!paused || !resumed) code = 1;
    }
    if (code == 0) {
        exec_request check;
        check.shell = "kill -0 " + std::to_string(holder->pid());
        auto alive = co_await box->async_exec(std::move(check));
        if (!alive || alive->exit_code != 0) {
            code = report_error("bench pause", make_error(errc::backend_failure,
                                                          "the Python process did not survive"));
        }
    } else {
        std::fprintf(stderr, "moat bench pause: a pause or resume failed (see the table)\n");
    }
    holder = make_error(errc::cancelled, "done");
    busy = make_error(errc::cancelled, "done");
    auto destroyed = co_await box->async_destroy();
    if (!destroyed && code == 0) code = report_error("bench pause", destroyed.error());
    co_return code;
}

}  // namespace

int bench_pause(int argc, char** argv) {
    pause_bench_options o;
    parse_flags(argc, argv,
                {count_flag("--n", o.n, 1, 100'000), string_flag("--json", o.json_path)});
    pause_samples r;
    const int code = run_with_backend([&o, &r](backend& b) { return run_bench(b, o, r); });
    std::string text = "moat bench pause: " + std::to_string(o.n) +
                       " pauses and resumes of a sandbox running a busy loop and a Python "
                       "process holding 64 MiB\n";
    text += summary_header();
    text += summary_line(r.pause);
    text += summary_line(r.resume);
    const bool written = publish_report("bench pause", text, o.json_path, [&](json_writer& w) {
        for (const auto* s : {&r.pause, &r.resume}) {
            w.key(s->name);
            write_summary(w, *s);
        }
    });
    if (!written && code == 0) return 1;
    return code;
}

}  // namespace moat::cli
