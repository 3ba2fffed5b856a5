#include "cli/bench/python_bench.hpp"

#include <moat/local_backend.hpp>
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/session_store.hpp>
#include <moat/tools.hpp>

#include "cli/arguments.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/cli_runtime.hpp"
#include "core/json_writer.hpp"

#include <asio/this_coro.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

namespace moat::cli {
namespace {

using namespace std::chrono_literals;
using bench_clock = std::chrono::steady_clock;

struct python_bench_options {
    std::size_t n = 200;
    std::string json_path;
};

struct python_samples {
    latency_samples private_session{"private", {}, 0};
    latency_samples shared_session{"shared", {}, 0};
    latency_samples exec_true{"exec_true", {}, 0};
};

// One worker of the bench: a runtime, a manager and a tool session for `key`.
struct bench_worker {
    bench_worker(backend& b, const std::string& label, bool shared,
                 std::shared_ptr<session_store> store, const std::string& key) {
        sandboxes = std::make_unique<runtime>(b);
        manager_options o;
        o.spec.labels["moat.cli"] = label;
        o.spec.ttl = 30min;
        o.spec.survive_owner = shared;
        manager = std::make_unique<session_manager>(*sandboxes, o, std::move(store));
        tools = std::make_unique<tool_session>(*manager, key);
    }

    asio::awaitable<void> end() {
        (void)co_await tools->async_end();
        (void)co_await manager->async_shutdown();
    }

    std::unique_ptr<runtime> sandboxes;
    std::unique_ptr<session_manager> manager;
    std::unique_ptr<tool_session> tools;
};

double elapsed_ms(bench_clock::time_point since) {
    return std::chrono::duration<double, std::milli>(bench_clock::now() - since).count();
}

// One run_python("1+1") into `into`: a failure unless its result is the value 2.
asio::awaitable<void> time_cell(tool_session& tools, latency_samples& into) {
    const auto started = bench_clock::now();
    auto ran = co_await tools.async_run_python("1+1");
    const double ms = elapsed_ms(started);
    if (ran && ran->status == tool_status::ok && ran->stdout_text == "2\n") {
        into.ms.push_back(ms);
        co_return;
    }
    if (into.failures++ == 0) {  // the first failure of a series, said once
        const std::string why =
            ran ? ran->message.substr(0, 200) + " [" + ran->stdout_text.substr(0, 100) + "]"
                : ran.error().to_string();
        std::fprintf(stderr, "moat bench python: a %s cell failed: %s\n", into.name.c_str(),
                     why.c_str());
    }
}

asio::awaitable<void> time_exec(sandbox& box, latency_samples& into) {
    exec_request call;
    call.argv = {"true"};
    const auto started = bench_clock::now();
    auto ran = co_await box.async_exec(std::move(call));
    const double ms = elapsed_ms(started);
    if (ran && ran->exit_code == 0) {
        into.ms.push_back(ms);
    } else {
        ++into.failures;
    }
}

// A first cell, which starts the interpreter: an error when it fails.
asio::awaitable<result<void>> warm_up(tool_session& tools) {
    auto ran = co_await tools.async_run_python("1+1");
    if (!ran) co_return std::move(ran).error();
    if (ran->status != tool_status::ok) {
        co_return make_error(errc::backend_failure,
                             "the first cell failed: " + ran->message.substr(0, 200));
    }
    co_return result<void>{};
}

asio::awaitable<int> run_bench(backend& first, const python_bench_options& o, python_samples& r) {
    // The second worker's own backend, as another process of the agent server would have.
    const auto executor = co_await asio::this_coro::executor;  // named first (g++ 12)
    auto second = make_local_backend(executor);
    auto store = make_memory_session_store();
    bench_worker alone(first, "bench-python", false, make_memory_session_store(), "private");
    bench_worker a(first, "bench-python", true, store, "shared");
    bench_worker b(*second, "bench-python", true, store, "shared");
    int code = 0;
    for (auto* w : {&alone, &a, &b}) {
        auto warmed = co_await warm_up(*w->tools);
        if (!warmed && code == 0) code = report_error("bench python", warmed.error());
    }
    std::shared_ptr<sandbox> box;
    if (code == 0) {
        auto held = co_await alone.manager->async_acquire("private");
        if (held) {
            box = held->box;  // the handle outlives the lease, which is let go at once
        } else {
            code = report_error("bench python", held.error());
        }
    }
    // Alternating halves, so a change in the machine's load meets every series.
    for (int half = 0; half < 2 && code == 0; ++half) {
        const std::size_t count = half == 0 ? o.n / 2 : o.n - o.n / 2;
        for (std::size_t i = 0; i < count; ++i) co_await time_cell(*alone.tools, r.private_session);
        for (std::size_t i = 0; i < count; ++i) {
            co_await time_cell(i % 2 == 0 ? *a.tools : *b.tools, r.shared_session);
        }
        for (std::size_t i = 0; i < count; ++i) co_await time_exec(*box, r.exec_true);
    }
    box.reset();
    co_await alone.end();
    co_await a.end();
    co_await b.end();
    if (code == 0 && (r.private_session.failures != 0 || r.shared_session.failures != 0 ||
                      r.exec_true.failures != 0)) {
        std::fprintf(stderr, "moat bench python: some calls failed (see the table)\n");
        code = 1;
    }
    co_return code;
}

}  // namespace

int bench_python(int argc, char** argv) {
    python_bench_options o;
    parse_flags(argc, argv,
                {count_flag("--n", o.n, 2, 100'000), string_flag("--json", o.json_path)});
    python_samples r;
    const int code = run_with_backend([&o, &r](backend& b) { return run_bench(b, o, r); });

    const auto ratio = [&r](const latency_samples& s) {
        const double base = r.exec_true.percentile(0.5);
        return base > 0 ? s.percentile(0.5) / base : 0.0;
    };
    std::string text = "moat bench python: " + std::to_string(o.n) +
                       " run_python(\"1+1\") round trips through a private session and through a "
                       "session two workers share, beside " +
                       std::to_string(o.n) + " `true` commands, alternating\n";
    text += summary_header();
    for (const auto* s : {&r.private_session, &r.shared_session, &r.exec_true}) {
        text += summary_line(*s);
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "shared - private: p50 %+.2f ms, p99 %+.2f ms; p50 over exec true: private "
                  "%.2fx, shared %.2fx\n",
                  r.shared_session.percentile(0.5) - r.private_session.percentile(0.5),
                  r.shared_session.percentile(0.99) - r.private_session.percentile(0.99),
                  ratio(r.private_session), ratio(r.shared_session));
    text += line;
    const bool written = publish_report("bench python", text, o.json_path, [&](json_writer& w) {
        for (const auto* s : {&r.private_session, &r.shared_session, &r.exec_true}) {
            w.key(s->name);
            write_summary(w, *s);
        }
        w.key("shared_minus_private_p50_ms")
            .value(r.shared_session.percentile(0.5) - r.private_session.percentile(0.5));
        w.key("shared_minus_private_p99_ms")
            .value(r.shared_session.percentile(0.99) - r.private_session.percentile(0.99));
        w.key("private_ratio_p50").value(ratio(r.private_session));
        w.key("shared_ratio_p50").value(ratio(r.shared_session));
    });
    if (!written && code == 0) return 1;
    return code;
}

}  // namespace moat::cli
