#include "cli/bench/ports_bench.hpp"

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>

#include "cli/arguments.hpp"
#include "cli/bench/fetch_bench.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/cli_runtime.hpp"
#include "core/asio_compat.hpp"
#include "core/json_writer.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace moat::cli {
namespace {

using namespace std::chrono_literals;

// The port the sandbox's server listens on, on its own loopback.
constexpr std::uint16_t sandbox_port = 8000;

struct ports_bench_options {
    std::size_t n = 10;
    std::size_t mb = 100;
    std::size_t setup_n = 200;
    std::string json_path;
};

// The sandbox's copy of the host server's files, made inside it (the same sizes), and the same
// server program on its loopback, in the background (until the process handle is dropped).
asio::awaitable<result<process>> start_sandbox_server(sandbox& box, std::size_t big_bytes) {
    exec_request fill;
    fill.shell = "mkdir -p /workspace/bench && cd /workspace/bench && head -c " +
                 std::to_string(big_bytes) + " /dev/urandom > big.bin && head -c " +
                 std::to_string(small_file_bytes) + " /dev/urandom > small.bin";
    fill.wall_limit = 2min;
    auto filled = co_await box.async_exec(std::move(fill));
    if (!filled) co_return std::move(filled).error();
    if (filled->exit_code != 0) {
        co_return make_error(
            errc::backend_failure,
            "cannot write the files to serve in the sandbox: " + filled->err.text());
    }
    exec_request serve;
    serve.shell = "exec python3 -m http.server " + std::to_string(sandbox_port) +
                  " --bind 127.0.0.1 --directory /workspace/bench >/dev/null 2>&1";
    serve.wall_limit = 60min;
    co_return co_await box.async_spawn(std::move(serve));
}

// Fetches small.bin through the forward until the sandbox's server answers (20 s at most).
asio::awaitable<bool> wait_until_serving(const std::string& url) {
    const auto executor = co_await asio::this_coro::executor;
    const auto limit = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < limit) {
        latency_samples probe{"probe", {}, 0};
        const std::string text = co_await async_run_on_host(fetch_loop(url, 1));
        read_fetches(text, small_file_bytes, 1, probe);
        if (probe.failures == 0) co_return true;
        asio::steady_timer pause(executor, 100ms);
        co_await pause.async_wait(as_tuple(asio::use_awaitable));
    }
    co_return false;
}

asio::awaitable<int> run_bench(backend& b, const ports_bench_options& o, std::uint16_t host_port,
                               fetch_results& r) {
    runtime sandboxes(b);
    sandbox_spec spec;
    spec.labels["moat.cli"] = "bench-ports";
    auto created = co_await sandboxes.async_create(spec);
    if (!created) co_return report_error("bench ports", created.error());
    auto box = std::move(*created);
    const std::size_t big = o.mb << 20;
    int code = 0;
    auto served = co_await start_sandbox_server(*box, big);
    auto forward = co_await box->async_port_host(sandbox_port);
    if (!served || !forward) {
        code = report_error("bench ports", served ? forward.error() : served.error());
    }
    const std::string direct = "http://127.0.0.1:" + std::to_string(host_port);
    std::string forwarded;
    if (code == 0) forwarded = "http://" + *forward;
    if (code == 0) {
        const std::string probe = forwarded + "/small.bin";
        const bool up = co_await wait_until_serving(probe);
        if (!up) {
            code =
                report_error("bench ports",
                             make_error(errc::backend_failure,
                                        "the sandbox's server did not answer through the forward"));
        }
    }
    struct fetch_kind {
        const char* file;
        std::size_t bytes;
        const char* timing;
        std::size_t count;
        latency_samples* host;
        latency_samples* through;
    };
    const fetch_kind kinds[2] = {
        {"/big.bin", big, "time_total", o.n, &r.host_download, &r.measured_download},
        {"/small.bin", small_file_bytes, "time_starttransfer", o.setup_n, &r.host_small,
         &r.measured_small}};
    // Alternating halves, so a change in the machine's load meets both sides.
    for (int half = 0; half < 2 && code == 0; ++half) {
        for (const auto& kind : kinds) {
            const std::size_t count = half == 0 ? kind.count / 2 : kind.count - kind.count / 2;
            if (count == 0) continue;
            const std::string file = kind.file;
            const std::string timing = kind.timing;
            const std::size_t bytes = kind.bytes;
            latency_samples* host = kind.host;
            latency_samples* through = kind.through;
            auto host_text = co_await async_run_on_host(fetch_loop(direct + file, count, timing));
            read_fetches(host_text, bytes, count, *host);
            auto forward_text =
                co_await async_run_on_host(fetch_loop(forwarded + file, count, timing));
            read_fetches(forward_text, bytes, count, *through);
        }
    }
    auto destroyed = co_await box->async_destroy();
    if (!destroyed) code = report_error("bench ports", destroyed.error());
    co_return code;
}

std::string report_text(const ports_bench_options& o, const fetch_results& r,
                        const fetch_results::rates& rates) {
    std::string out = "moat bench ports: " + std::to_string(o.n) + " downloads of " +
                      std::to_string(o.mb) + " MiB and " + std::to_string(o.setup_n) +
                      " 1 KiB fetches (time to first byte) with curl from python3's http.server, "
                      "on the host's 127.0.0.1 and in a sandbox through a forwarded port, "
                      "alternating\n";
    out += summary_header();
    for (const auto* s : r.all()) out += summary_line(*s);
    char line[256];
    std::snprintf(line, sizeof line, "throughput p50: host %.0f MB/s, forwarded %.0f MB/s: %.2fx\n",
                  rates.host, rates.measured, rates.ratio);
    out += line;
    const double host_p50 = r.host_small.percentile(0.5);
    const double host_p99 = r.host_small.percentile(0.99);
    std::snprintf(line, sizeof line,
                  "connection setup (connect to first byte): p50 %.2f ms vs %.2f ms (%.2fx, %+.2f "
                  "ms), p99 %.2f ms vs %.2f ms (%.2fx)\n",
                  r.measured_small.percentile(0.5), host_p50,
                  host_p50 > 0 ? r.measured_small.percentile(0.5) / host_p50 : 0.0,
                  r.measured_small.percentile(0.5) - host_p50, r.measured_small.percentile(0.99),
                  host_p99, host_p99 > 0 ? r.measured_small.percentile(0.99) / host_p99 : 0.0);
    out += line;
    return out;
}

}  // namespace

int bench_ports(int argc, char** argv) {
    ports_bench_options o;
    parse_flags(
        argc, argv,
        {count_flag("--n", o.n, 1, 10'000), count_flag("--mb", o.mb, 1, 256),
         count_flag("--setup-n", o.setup_n, 1, 100'000), string_flag("--json", o.json_path)});
    fetch_results r("forward", "setup");
    const int code = with_file_server(
        "bench ports", o.mb << 20,
        [&o, &r](backend& b, std::uint16_t port) { return run_bench(b, o, port, r); });

    const auto rates = r.download_rates(o.mb << 20);
    const auto setup_ratio = [&r](double q) {
        const double host = r.host_small.percentile(q);
        return host > 0 ? r.measured_small.percentile(q) / host : 0.0;
    };
    return publish_fetch_report(
        "bench ports", code, report_text(o, r, rates), o.json_path, r, [&](json_writer& w) {
            w.key("throughput_ratio_p50").value(rates.ratio);
            w.key("setup_ratio_p50").value(setup_ratio(0.5));
            w.key("setup_ratio_p99").value(setup_ratio(0.99));
            w.key("setup_overhead_p50_ms")
                .value(r.measured_small.percentile(0.5) - r.host_small.percentile(0.5));
        });
}

}  // namespace moat::cli
