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

asio::awaitable<int> run_bench(backend& b, const egress_bench_options& o, std::uint16_t port,
                               fetch_results& r) {
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
    const fetch_kind kinds[2] = {
        {"/big.bin", big, &r.host_download, &r.measured_download},
        {"/small.bin", small_file_bytes, &r.host_small, &r.measured_small}};
    int code = 0;
    for (const std::size_t count : halves) {
        if (count == 0) continue;
        for (const auto& kind : kinds) {
            const std::string file = kind.file;
            const std::size_t bytes = kind.bytes;
            latency_samples* host = kind.host;
            latency_samples* inside = kind.inside;
            const std::string host_text =
                co_await async_run_on_host(fetch_loop(direct + file, count));
            read_fetches(host_text, bytes, count, *host);
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
    fetch_results r("sandbox", "small");
    const int code = with_file_server(
        "bench egress", o.mb << 20,
        [&o, &r](backend& b, std::uint16_t port) { return run_bench(b, o, port, r); });

    const auto rates = r.download_rates(o.mb << 20);
    const double overhead = r.measured_small.percentile(0.5) - r.host_small.percentile(0.5);
    char line[256];
    std::string out = "moat bench egress: " + std::to_string(o.n) + " downloads of " +
                      std::to_string(o.mb) + " MiB and " + std::to_string(o.n) +
                      " of 1 KiB with curl from a python3 http.server on 127.0.0.1, from the host "
                      "directly and from a sandbox through its egress proxy, alternating\n";
    out += summary_header();
    for (const auto* s : r.all()) out += summary_line(*s);
    std::snprintf(line, sizeof line,
                  "throughput p50: host %.0f MB/s, sandbox %.0f MB/s: %.2fx (target >= 0.8x)\n",
                  rates.host, rates.measured, rates.ratio);
    out += line;
    std::snprintf(line, sizeof line,
                  "connection setup overhead (1 KiB fetch p50, proxied minus direct): %.2f ms\n",
                  overhead);
    out += line;
    return publish_fetch_report("bench egress", code, out, o.json_path, r, [&](json_writer& w) {
        w.key("throughput_ratio_p50").value(rates.ratio);
        w.key("setup_overhead_p50_ms").value(overhead);
    });
}

}  // namespace moat::cli
