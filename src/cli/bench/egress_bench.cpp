#include "cli/bench/egress_bench.hpp"

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>

#include "cli/arguments.hpp"
#include "cli/bench/fetch_bench.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/cli_runtime.hpp"
#include "core/json_writer.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace moat::cli {
namespace {

using namespace std::chrono_literals;

struct egress_bench_options {
    std::size_t n = 10;
    std::size_t mb = 100;
    std::string json_path;
};

struct egress_results {
    latency_samples host_download{"host_download", {}, 0};
    latency_samples sandbox_download{"sandbox_download", {}, 0};
    latency_samples host_small{"host_small", {}, 0};
    latency_samples sandbox_small{"sandbox_small", {}, 0};
};

asio::awaitable<int> run_bench(backend& b, const egress_bench_options& o, std::uint16_t port,
                               egress_results& r) {
    runtime sandboxes(b);
    sandbox_spec spec;
    spec.labels["moat.cli"] = "bench-egress";
    spec.network.mode = network_mode::allow_list;
    spec.network.allow_hosts = {"bench.test:" + std::to_string(port)};
    spec.network.resolve = {"bench.test=127.0.0.1"};
    spec.network.allow_addresses = {"127.0.0.1/32"};
    auto created = co_await sandboxes.async_create(spec);
    if (!created) co_return report_error("bench egress", created.error());
    auto box = std::move(*created);
    const std::string direct = "http://127.0.0.1:" + std::to_string(port);
    const std::string proxied = "http://bench.test:" + std::to_string(port);
    const std::size_t big = o.mb << 20;
    // Alternating halves, so a change in the machine's load meets both sides.
    const std::size_t halves[2] = {o.n / 2, o.n - o.n / 2};
    struct fetch_kind {
        const char* file;
        std::size_t bytes;
        latency_samples* host;
        latency_samples* inside;
    };
    const fetch_kind kinds[2] = {{"/big.bin", big, &r.host_download, &r.sandbox_download},
                                 {"/small.bin", small_file_bytes, &r.host_small, &r.sandbox_small}};
    int code = 0;
    for (const std::size_t count : halves) {
        if (count == 0) continue;
        for (const auto& kind : kinds) {
            const std::string file = kind.file;
            const std::size_t bytes = kind.bytes;
            latency_samples* host = kind.host;
            latency_samples* inside = kind.inside;
            read_fetches(run_on_host(fetch_loop(direct + file, count)), bytes, count, *host);
            exec_request request;
            request.argv = {"/bin/sh", "-c", fetch_loop(proxied + file, count)};
            request.wall_limit = std::chrono::minutes(5);
            auto ran = co_await box->async_exec(std::move(request));
            if (!ran) {
                code = report_error("bench egress", ran.error());
                inside->failures += count;
                continue;
            }
            read_fetches(ran->out.text(), bytes, count, *inside);
        }
    }
    auto destroyed = co_await box->async_destroy();
    if (!destroyed) code = report_error("bench egress", destroyed.error());
    co_return code;
}

}  // namespace

int bench_egress(int argc, char** argv) {
    egress_bench_options o;
    parse_flags(argc, argv,
                {count_flag("--n", o.n, 1, 10'000), count_flag("--mb", o.mb, 1, 4096),
                 string_flag("--json", o.json_path)});
    file_server server;
    std::string why;
    if (!server.start(o.mb << 20, why)) {
        return report_error("bench egress", make_error(errc::backend_failure, why));
    }
    egress_results r;
    const int code = run_with_backend(
        [&o, &r, port = server.port](backend& b) { return run_bench(b, o, port, r); });
    server.stop();

    const double mb = static_cast<double>(o.mb << 20) / 1e6;
    const double host_p50 = r.host_download.percentile(0.5);
    const double inside_p50 = r.sandbox_download.percentile(0.5);
    const double host_rate = host_p50 > 0 ? mb / (host_p50 / 1000.0) : 0.0;
    const double inside_rate = inside_p50 > 0 ? mb / (inside_p50 / 1000.0) : 0.0;
    const double ratio = host_rate > 0 ? inside_rate / host_rate : 0.0;
    const double overhead = r.sandbox_small.percentile(0.5) - r.host_small.percentile(0.5);
    char line[256];
    std::string out = "moat bench egress: " + std::to_string(o.n) + " downloads of " +
                      std::to_string(o.mb) + " MiB and " + std::to_string(o.n) +
                      " of 1 KiB with curl from a python3 http.server on 127.0.0.1, from the host "
                      "directly and from a sandbox through its egress proxy, alternating\n";
    out += summary_header();
    for (const auto* s : {&r.host_download, &r.sandbox_download, &r.host_small, &r.sandbox_small})
        out += summary_line(*s);
    std::snprintf(line, sizeof line,
                  "throughput p50: host %.0f MB/s, sandbox %.0f MB/s: %.2fx (target >= 0.8x)\n",
                  host_rate, inside_rate, ratio);
    out += line;
    std::snprintf(line, sizeof line,
                  "connection setup overhead (1 KiB fetch p50, proxied minus direct): %.2f ms\n",
                  overhead);
    out += line;
    const bool published = publish_report("bench egress", out, o.json_path, [&](json_writer& w) {
        for (const auto* s :
             {&r.host_download, &r.sandbox_download, &r.host_small, &r.sandbox_small}) {
            w.key(s->name);
            write_summary(w, *s);
        }
        w.key("throughput_ratio_p50").value(ratio);
        w.key("setup_overhead_p50_ms").value(overhead);
    });
    const std::size_t failures = r.host_download.failures + r.sandbox_download.failures +
                                 r.host_small.failures + r.sandbox_small.failures;
    if (failures > 0) {
        write_all(STDERR_FILENO,
                  "moat bench egress: " + std::to_string(failures) + " fetches failed\n");
        return code != 0 ? code : exit_failure;
    }
    return published ? code : exit_failure;
}

}  // namespace moat::cli
