// moat bench create [--n N] [--concurrency C] [--mode sequential|staggered|burst]
//                   [--interval-ms MS] [--template NAME] [--json FILE] [--plot FILE.svg]
//                   [--raw PATH]
//   Each iteration creates a sandbox through the public runtime (until pid 1 is ready), runs a
//   first exec of /bin/true and destroys it (until confirmed). Rounds of C iterations start
//   together (burst), spaced by --interval-ms (staggered), or one at a time (sequential, C = 1);
//   after each round the baselines run once each, round-robin, so background load falls on all
//   alike: the raw isolation program (bench/raw_isolation.cpp), bwrap with comparable flags, and a
//   host posix_spawn of /bin/true. Prints n, success rate, p50, p90, p99, p999 and max per series
//   and the ratios to the baselines; --json writes them, --plot draws their CDFs. --template adds
//   one sandbox of that template per round, measured the same way (template_create, ...), and
//   its ratio to the default root's.
//
// moat bench http: see cli/bench/http_bench.hpp.
// moat bench serve: see cli/bench/serve_bench.hpp.
// moat bench e2b: see cli/bench/e2b_bench.hpp.
// moat bench store: see cli/bench/store_bench.hpp.
// moat bench egress, ports, python, pty, pause: see cli/bench/egress_bench.hpp,
// cli/bench/ports_bench.hpp, cli/bench/python_bench.hpp, cli/bench/pty_bench.hpp,
// cli/bench/pause_bench.hpp.
//
// moat bench advise [--from FILE] [--create-p50-ms MS --create-p99-ms MS] --first-token-ms MS
//                   --arrivals-per-s R [--create-rate R] [--miss-probability P]
//   Recommends creating on demand or a pool, and its size, with the reasoning (bench/advisor.hpp).
#include <moat/local_backend.hpp>
#include <moat/runtime.hpp>

#include "cli/arguments.hpp"
#include "cli/bench/advisor.hpp"
#include "cli/bench/baselines.hpp"
#include "cli/bench/e2b_bench.hpp"
#include "cli/bench/egress_bench.hpp"
#include "cli/bench/fleet_benches.hpp"
#include "cli/bench/http_bench.hpp"
#include "cli/bench/iteration.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/bench/pause_bench.hpp"
#include "cli/bench/ports_bench.hpp"
#include "cli/bench/pty_bench.hpp"
#include "cli/bench/python_bench.hpp"
#include "cli/bench/serve_bench.hpp"
#include "cli/bench/store_bench.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/host_files.hpp"

#include <simdjson.h>

#include <asio/this_coro.hpp>

#include <sys/utsname.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

namespace moat::cli {
namespace {

enum class arrival { sequential, staggered, burst };

struct bench_options {
    std::size_t n = 500;
    std::size_t concurrency = 1;
    arrival mode = arrival::sequential;
    std::chrono::milliseconds interval{10};
    std::string json_path;
    std::string plot_path;
    std::string raw_path;
    std::string template_name;
};

struct bench_results {
    latency_samples create{"create", {}, 0};
    latency_samples exec{"exec", {}, 0};
    latency_samples destroy{"destroy", {}, 0};
    latency_samples baseline_create{"baseline_create", {}, 0};
    latency_samples baseline_exec{"baseline_exec", {}, 0};  // host posix_spawn
    latency_samples raw_exec{"raw_exec", {}, 0};
    latency_samples baseline_destroy{"baseline_destroy", {}, 0};
    latency_samples bwrap_create{"bwrap_create", {}, 0};
    latency_samples template_create{"template_create", {}, 0};
    latency_samples template_exec{"template_exec", {}, 0};
    latency_samples template_destroy{"template_destroy", {}, 0};
    bool have_raw = false;
    bool have_bwrap = false;
    std::string raw_note;
    std::string bwrap_note;
};

asio::awaitable<int> run_bench(backend& b, bench_options o, bench_results* r) {
    runtime sandboxes(b, bench_runtime_options(o.n, o.concurrency));

    std::unique_ptr<raw_baseline> raw;
    const std::string raw_path = find_raw_baseline(o.raw_path);
    if (raw_path.empty()) {
        r->raw_note = "moat-bench-raw not found (pass --raw PATH)";
    } else {
        raw = raw_baseline::start(raw_path, "/run/moat", r->raw_note);
    }
    r->have_raw = raw != nullptr;
    const std::string bwrap = find_bwrap();
    r->have_bwrap = !bwrap.empty();
    if (bwrap.empty()) r->bwrap_note = "bwrap is not installed (apt-get install bubblewrap)";

    // Warm up the helper, the template and the caches before measuring.
    for (int i = 0; i < 5; ++i) {
        auto warm = std::make_shared<iteration_outcome>();
        co_await one_iteration(sandboxes, std::chrono::milliseconds(0), warm);
        if (o.template_name.empty()) continue;
        auto warm_template = std::make_shared<iteration_outcome>();
        co_await one_iteration(sandboxes, std::chrono::milliseconds(0), warm_template,
                               o.template_name);
        if (!warm_template->ok) {
            write_all(STDERR_FILENO, "moat bench create: a sandbox of template '" +
                                         o.template_name + "' could not be made and run\n");
            co_return exit_failure;
        }
    }
    const std::size_t per_round = o.mode == arrival::sequential ? 1 : o.concurrency;
    const bool interactive = ::isatty(STDERR_FILENO) != 0;
    std::chrono::milliseconds spacing(0);
    if (o.mode == arrival::staggered) spacing = o.interval;
    std::size_t finished = 0;
    while (finished < o.n) {
        const std::size_t count = std::min(per_round, o.n - finished);
        auto round = co_await run_round(sandboxes, count, spacing);
        for (const auto& it : round) {
            if (!it->ok) {
                ++r->create.failures;
                continue;
            }
            r->create.ms.push_back(it->create_ms);
            r->exec.ms.push_back(it->exec_ms);
            r->destroy.ms.push_back(it->destroy_ms);
        }
        finished += count;
        if (!o.template_name.empty()) {
            auto it = std::make_shared<iteration_outcome>();
            co_await one_iteration(sandboxes, std::chrono::milliseconds(0), it, o.template_name);
            if (it->ok) {
                r->template_create.ms.push_back(it->create_ms);
                r->template_exec.ms.push_back(it->exec_ms);
                r->template_destroy.ms.push_back(it->destroy_ms);
            } else {
                ++r->template_create.failures;
            }
        }
        // The baselines, once each per round (blocking, while nothing of moat's runs).
        if (raw) {
            std::string why;
            if (auto s = raw->run(why)) {
                r->baseline_create.ms.push_back(s->create_ms);
                r->raw_exec.ms.push_back(s->exec_ms);
                r->baseline_destroy.ms.push_back(s->destroy_ms);
            } else {
                ++r->baseline_create.failures;
                r->raw_note = why;
            }
        }
        if (r->have_bwrap) {
            if (auto ms = bwrap_run_true(bwrap)) {
                r->bwrap_create.ms.push_back(*ms);
            } else {
                ++r->bwrap_create.failures;
            }
        }
        r->baseline_exec.ms.push_back(host_spawn_true());
        // A progress line for people; nothing for logs and pipes.
        if (interactive && (finished % 25 == 0 || finished == o.n))
            std::fprintf(stderr, "\rmoat bench create: %zu/%zu", finished, o.n);
    }
    if (interactive) std::fprintf(stderr, "\n");
    co_return 0;
}

void write_json_file(const std::string& path, const bench_options& o, const bench_results& r) {
    json_writer w;
    w.begin_object();
    w.key("mode").value(o.mode == arrival::sequential ? "sequential"
                        : o.mode == arrival::burst    ? "burst"
                                                      : "staggered");
    w.key("concurrency").value(static_cast<std::uint64_t>(o.concurrency));
    utsname host{};
    ::uname(&host);
    w.key("host").begin_object();
    w.key("kernel").value(host.release);
    w.key("cpus").value(static_cast<std::int64_t>(::sysconf(_SC_NPROCESSORS_ONLN)));
    double load[3] = {0, 0, 0};
    ::getloadavg(load, 3);
    w.key("loadavg_1m").value(load[0]);
    w.end_object();
    const auto series = [&w](const char* key, const latency_samples& s, bool present) {
        w.key(key);
        if (present) {
            write_summary(w, s);
        } else {
            w.null();
        }
    };
    series("create", r.create, true);
    series("exec", r.exec, true);
    series("destroy", r.destroy, true);
    series("baseline_create", r.baseline_create, r.have_raw);
    series("raw_exec", r.raw_exec, r.have_raw);
    series("baseline_destroy", r.baseline_destroy, r.have_raw);
    series("baseline_exec", r.baseline_exec, true);
    series("bwrap_create", r.bwrap_create, r.have_bwrap);
    const bool templated = !o.template_name.empty();
    series("template_create", r.template_create, templated);
    series("template_exec", r.template_exec, templated);
    series("template_destroy", r.template_destroy, templated);
    if (templated) w.key("template").value(o.template_name);
    w.end_object();
    std::ofstream(path) << w.take() << "\n";
}

int bench_create(int argc, char** argv) {
    bench_options o;
    const auto mode = [&o](const std::string& m) {
        if (m == "sequential") {
            o.mode = arrival::sequential;
        } else if (m == "staggered") {
            o.mode = arrival::staggered;
        } else if (m == "burst") {
            o.mode = arrival::burst;
        } else {
            throw usage_error("--mode: expected sequential, staggered or burst, got '" + m + "'");
        }
    };
    const auto interval = [&o](const std::string& ms) {
        o.interval = std::chrono::milliseconds(parse_count("--interval-ms", ms, 0, 60'000));
    };
    parse_flags(argc, argv,
                {count_flag("--n", o.n, 1, 1'000'000),
                 count_flag("--concurrency", o.concurrency, 1, 1000),
                 {"--mode", mode},
                 {"--interval-ms", interval},
                 string_flag("--json", o.json_path),
                 string_flag("--plot", o.plot_path),
                 string_flag("--raw", o.raw_path),
                 string_flag("--template", o.template_name)});
    if (o.mode == arrival::sequential) o.concurrency = 1;
    bench_results r;
    const int code = run_with_backend([&o, &r](backend& b) { return run_bench(b, o, &r); });
    if (code != 0) return code;

    std::string out = summary_header();
    for (const latency_samples* s : {&r.create, &r.exec, &r.destroy}) out += summary_line(*s);
    if (r.have_raw) {
        for (const latency_samples* s : {&r.baseline_create, &r.raw_exec, &r.baseline_destroy})
            out += summary_line(*s);
    }
    out += summary_line(r.baseline_exec);
    if (r.have_bwrap) out += summary_line(r.bwrap_create);
    if (!o.template_name.empty()) {
        for (const latency_samples* s : {&r.template_create, &r.template_exec, &r.template_destroy})
            out += summary_line(*s);
    }
    char line[256];
    if (!o.template_name.empty() && !r.template_create.ms.empty()) {
        std::snprintf(line, sizeof line,
                      "create of template '%s' / default root: p50 %.2fx, p99 %.2fx (target: "
                      "p50 <= 1.1x)\n",
                      o.template_name.c_str(),
                      r.template_create.percentile(0.5) / r.create.percentile(0.5),
                      r.template_create.percentile(0.99) / r.create.percentile(0.99));
        out += line;
    }
    if (r.have_raw && !r.baseline_create.ms.empty()) {
        std::snprintf(
            line, sizeof line,
            "create / raw isolation: p50 %.2fx, p99 %.2fx (target: p50 <= 1.3x, p99 <= 2x)\n",
            r.create.percentile(0.5) / r.baseline_create.percentile(0.5),
            r.create.percentile(0.99) / r.baseline_create.percentile(0.99));
        out += line;
    }
    std::snprintf(line, sizeof line,
                  "exec / host posix_spawn: p50 %.2fx, p99 %.2fx (target: p50 <= 1.3x)\n",
                  r.exec.percentile(0.5) / r.baseline_exec.percentile(0.5),
                  r.exec.percentile(0.99) / r.baseline_exec.percentile(0.99));
    out += line;
    if (r.have_bwrap && !r.bwrap_create.ms.empty()) {
        std::snprintf(line, sizeof line,
                      "bwrap (start to exit of /bin/true) / moat create: p50 %.1fx\n",
                      r.bwrap_create.percentile(0.5) / r.create.percentile(0.5));
        out += line;
    }
    if (!r.have_raw) out += "no raw baseline: " + r.raw_note + "\n";
    if (!r.have_bwrap) out += "no bwrap baseline: " + r.bwrap_note + "\n";
    write_all(STDOUT_FILENO, out);
    if (!o.json_path.empty()) write_json_file(o.json_path, o, r);
    if (!o.plot_path.empty()) {
        std::vector<const latency_samples*> series{&r.create};
        if (r.have_raw) series.push_back(&r.baseline_create);
        if (r.have_bwrap) series.push_back(&r.bwrap_create);
        series.push_back(&r.exec);
        series.push_back(&r.baseline_exec);
        std::ofstream(o.plot_path) << cdf_svg(series, "moat bench create: latency CDF");
    }
    return r.create.failures == 0 && r.template_create.failures == 0 ? 0 : exit_failure;
}

int bench_advise(int argc, char** argv) {
    advisor_input in;
    std::string from;
    bool have_p50 = false, have_p99 = false, have_budget = false, have_arrivals = false;
    const auto number = [](const std::string& flag, const std::string& text) {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !(v >= 0)) {
            throw usage_error(flag + ": expected a non-negative number, got '" + text + "'");
        }
        return v;
    };
    // A non-negative number for `flag`, noting in `seen` (when given) that it was.
    const auto number_flag = [&number](std::string_view flag, double& into, bool* seen) {
        return flag_handler{flag, [flag, &into, seen, &number](const std::string& text) {
                                into = number(std::string(flag), text);
                                if (seen != nullptr) *seen = true;
                            }};
    };
    parse_flags(
        argc, argv,
        {string_flag("--from", from),
         number_flag("--create-p50-ms", in.create_p50_ms, &have_p50),
         number_flag("--create-p99-ms", in.create_p99_ms, &have_p99),
         number_flag("--first-token-ms", in.first_token_ms, &have_budget),
         number_flag("--arrivals-per-s", in.arrivals_per_s, &have_arrivals),
         {"--create-rate",
          [&](const std::string& text) { in.create_rate_cap = number("--create-rate", text); }},
         number_flag("--miss-probability", in.miss_probability, nullptr)});
    if (in.miss_probability <= 0 || in.miss_probability >= 1) {
        throw usage_error("--miss-probability: expected a number between 0 and 1");
    }
    if (!from.empty()) {
        std::uint32_t mode = 0;
        auto text = read_host_input(from, 16u << 20, mode);
        if (!text) return report_error("bench advise", text.error());
        simdjson::dom::parser parser;
        const simdjson::padded_string padded(*text);
        simdjson::dom::element doc;
        double p50 = 0, p99 = 0;
        if (parser.parse(padded).get(doc) != simdjson::SUCCESS ||
            doc["create"]["p50_ms"].get_double().get(p50) != simdjson::SUCCESS ||
            doc["create"]["p99_ms"].get_double().get(p99) != simdjson::SUCCESS) {
            return report_error(
                "bench advise",
                make_error(errc::invalid_argument,
                           from + ": not a moat bench JSON (create.p50_ms, create.p99_ms)"));
        }
        if (!have_p50) in.create_p50_ms = p50;
        if (!have_p99) in.create_p99_ms = p99;
        have_p50 = have_p99 = true;
    }
    if (!have_p99) throw usage_error("give --from FILE or --create-p99-ms (and --create-p50-ms)");
    if (!have_p50) in.create_p50_ms = in.create_p99_ms;
    if (!have_budget) throw usage_error("missing --first-token-ms");
    if (!have_arrivals) throw usage_error("missing --arrivals-per-s");
    const advice a = advise(in);
    std::string out;
    if (!a.use_pool) {
        out = "recommendation: create on demand (no pool)\n";
    } else {
        out = "recommendation: a warm pool of " + std::to_string(a.pool_size) +
              (a.cannot_keep_up ? " (it cannot keep up: see below)\n" : "\n");
    }
    for (const auto& reason : a.reasoning) out += "  - " + reason + "\n";
    write_all(STDOUT_FILENO, out);
    return 0;
}

}  // namespace

int bench_command(int argc, char** argv) {
    if (argc < 1) {
        throw usage_error(
            "expected create, advise, sweep, memory, pool, hostsize, http, serve, e2b, store, "
            "egress, ports, python, pty or pause (see moat --help)");
    }
    const std::string_view what = argv[0];
    if (what == "create") return bench_create(argc - 1, argv + 1);
    if (what == "advise") return bench_advise(argc - 1, argv + 1);
    if (auto code = bench_fleet(what, argc - 1, argv + 1)) return *code;
    if (what == "http") return bench_http(argc - 1, argv + 1);
    if (what == "serve") return bench_serve(argc - 1, argv + 1);
    if (what == "e2b") return bench_e2b(argc - 1, argv + 1);
    if (what == "store") return bench_store(argc - 1, argv + 1);
    if (what == "egress") return bench_egress(argc - 1, argv + 1);
    if (what == "ports") return bench_ports(argc - 1, argv + 1);
    if (what == "python") return bench_python(argc - 1, argv + 1);
    if (what == "pty") return bench_pty(argc - 1, argv + 1);
    if (what == "pause") return bench_pause(argc - 1, argv + 1);
    throw usage_error(
        "expected create, advise, sweep, memory, pool, hostsize, http, serve, e2b, store, egress, "
        "ports, python, pty or pause, got '" +
        std::string(what) + "'");
}

}  // namespace moat::cli
