#include "cli/bench/http_bench.hpp"

#include "cli/arguments.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/cli_runtime.hpp"
#include "core/json_writer.hpp"
#include "http/client.hpp"
#include "http/server.hpp"

#include <simdjson.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace moat::cli {
namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::size_t warmup_requests = 20;
constexpr std::size_t stream_frame_bytes = 64 * 1024;

// The reference client: Node's http with a keep-alive agent, the same requests against the same
// server. Prints one JSON line.
constexpr const char* node_reference = R"JS(
'use strict';
const http = require('http');
const [small, nText, cText, stream] = process.argv.slice(2);
const n = Number(nText), c = Number(cText);
const agent = new http.Agent({keepAlive: true, maxSockets: c});
const ms = [];
function one() {
    return new Promise((resolve, reject) => {
        const t0 = process.hrtime.bigint();
        http.get(small, {agent}, (res) => {
            res.on('data', () => {});
            res.on('end', () => { ms.push(Number(process.hrtime.bigint() - t0) / 1e6); resolve(); });
        }).on('error', reject);
    });
}
async function worker(count) { for (let i = 0; i < count; i++) await one(); }
async function main() {
    for (let i = 0; i < 20; i++) await one();
    ms.length = 0;
    const t0 = process.hrtime.bigint();
    const workers = [];
    for (let w = 0; w < c; w++) workers.push(worker(Math.floor(n / c) + (w < n % c ? 1 : 0)));
    await Promise.all(workers);
    const elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
    const s0 = process.hrtime.bigint();
    let bytes = 0;
    await new Promise((resolve, reject) => {
        http.get(stream, {agent}, (res) => {
            res.on('data', (d) => { bytes += d.length; });
            res.on('end', resolve);
        }).on('error', reject);
    });
    const streamS = Number(process.hrtime.bigint() - s0) / 1e9;
    process.stdout.write(JSON.stringify({ms, elapsed_s: elapsed, stream_bytes: bytes,
                                         stream_s: streamS}) + '\n');
    agent.destroy();
}
main().catch((e) => { process.stderr.write(String(e) + '\n'); process.exit(1); });
)JS";

struct http_bench_options {
    std::size_t n = 5000;
    std::size_t concurrency = 1;
    std::size_t stream_mib = 256;
    std::string json_path;
};

struct client_run {
    latency_samples unary;
    double elapsed_s = 0;
    double stream_bytes = 0;
    double stream_s = 0;
    bool ok = false;
    std::string why;

    double requests_per_s() const {
        return elapsed_s > 0 ? static_cast<double>(unary.ms.size()) / elapsed_s : 0;
    }
    double stream_mb_per_s() const { return stream_s > 0 ? stream_bytes / 1e6 / stream_s : 0; }
};

// --- the server: a small JSON answer and a streamed body, on its own thread -------------------

asio::awaitable<void> serve_small(http::server_request&, http::server_response& response) {
    http::header_list headers;
    headers.add("Content-Type", "application/json");
    std::string body = R"({"ok":true})";
    (void)co_await response.async_send(200, std::move(headers), std::move(body));
}

asio::awaitable<void> serve_stream(http::server_request& request, http::server_response& response) {
    static const std::string frame(stream_frame_bytes, 'x');
    std::uint64_t total = 0;
    const auto query = request.query();
    if (query.starts_with("bytes=")) total = std::strtoull(query.data() + 6, nullptr, 10);
    http::header_list headers;
    headers.add("Content-Type", "application/octet-stream");
    if (!co_await response.async_begin(200, std::move(headers))) co_return;
    for (std::uint64_t sent = 0; sent < total;) {
        const auto n = std::min<std::uint64_t>(frame.size(), total - sent);
        const std::string_view piece(frame.data(), static_cast<std::size_t>(n));
        if (!co_await response.async_write(piece)) co_return;
        sent += n;
    }
    (void)co_await response.async_end();
}

struct stop_done {
    bool* done;
    void operator()(std::exception_ptr) const { *done = true; }
};

// --- moat's client ---------------------------------------------------------------------------

struct worker_state {
    http::client* client;
    std::string url;
    std::size_t count;
    latency_samples* samples;
};

asio::awaitable<void> unary_worker(worker_state w) {
    for (std::size_t i = 0; i < w.count; ++i) {
        http::request r;
        r.url = w.url;
        r.limit = deadline::after(std::chrono::seconds(30));
        const auto t0 = clock_type::now();
        auto fetched = co_await w.client->async_fetch(std::move(r), 1 << 20);
        const auto t1 = clock_type::now();
        if (!fetched || fetched->status() != 200) {
            ++w.samples->failures;
            continue;
        }
        w.samples->ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
}

// Stops the io_context when the last worker ends: the client's pool keeps it busy while it has
// idle connections (its idle sweep).
struct count_down {
    std::size_t* left;
    asio::io_context* io;
    void operator()(std::exception_ptr) const {
        if (--*left == 0) io->stop();
    }
};

asio::awaitable<void> stream_once(http::client& client, std::string url, client_run& run) {
    http::request r;
    r.url = std::move(url);
    r.limit = deadline::after(std::chrono::seconds(120));
    const auto t0 = clock_type::now();
    auto sent = co_await client.async_send(std::move(r));
    if (!sent) {
        run.why = sent.error().to_string();
        co_return;
    }
    double bytes = 0;
    for (;;) {
        auto piece = co_await sent->async_read_some();
        if (!piece) {
            run.why = piece.error().to_string();
            co_return;
        }
        if (piece->empty()) break;
        bytes += static_cast<double>(piece->size());
    }
    run.stream_s = std::chrono::duration<double>(clock_type::now() - t0).count();
    run.stream_bytes = bytes;
}

client_run run_moat_client(const http_bench_options& o, const std::string& base) {
    client_run run;
    run.unary.name = "moat client";
    asio::io_context io;
    http::client_options options;
    options.max_connections_per_origin = o.concurrency;
    http::client client(io.get_executor(), options);
    const auto small = base + "/small";

    latency_samples warmup{"warmup", {}, 0};
    std::size_t left = 1;
    asio::co_spawn(io, unary_worker({&client, small, warmup_requests, &warmup}),
                   count_down{&left, &io});
    io.run();
    io.restart();

    left = o.concurrency;
    const auto t0 = clock_type::now();
    for (std::size_t w = 0; w < o.concurrency; ++w) {
        const std::size_t count = o.n / o.concurrency + (w < o.n % o.concurrency ? 1 : 0);
        asio::co_spawn(io, unary_worker({&client, small, count, &run.unary}),
                       count_down{&left, &io});
    }
    io.run();
    io.restart();
    run.elapsed_s = std::chrono::duration<double>(clock_type::now() - t0).count();

    const auto stream_url = base + "/stream?bytes=" + std::to_string(o.stream_mib << 20);
    left = 1;
    asio::co_spawn(io, stream_once(client, stream_url, run), count_down{&left, &io});
    io.run();
    run.ok = run.why.empty() && run.unary.failures == 0;
    return run;
}

// --- the reference client --------------------------------------------------------------------

client_run run_node_client(const http_bench_options& o, const std::string& base) {
    client_run run;
    run.unary.name = "node http";
    char path[] = "/tmp/moat-bench-http-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) {
        run.why = "cannot write the reference script";
        return run;
    }
    write_all(fd, node_reference);
    ::close(fd);
    const auto command = "node " + std::string(path) + " " + base + "/small " +
                         std::to_string(o.n) + " " + std::to_string(o.concurrency) + " '" + base +
                         "/stream?bytes=" + std::to_string(o.stream_mib << 20) + "'";
    std::string out;
    if (FILE* pipe = ::popen(command.c_str(), "r")) {
        char buffer[65536];
        std::size_t got = 0;
        while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, got);
        if (::pclose(pipe) != 0) run.why = "node exited with a failure";
    } else {
        run.why = "cannot start node";
    }
    ::unlink(path);
    if (!run.why.empty()) return run;
    simdjson::dom::parser parser;
    const simdjson::padded_string padded(out);
    simdjson::dom::element doc;
    simdjson::dom::array ms;
    if (parser.parse(padded).get(doc) != simdjson::SUCCESS ||
        doc["ms"].get_array().get(ms) != simdjson::SUCCESS ||
        doc["elapsed_s"].get_double().get(run.elapsed_s) != simdjson::SUCCESS ||
        doc["stream_s"].get_double().get(run.stream_s) != simdjson::SUCCESS) {
        run.why = "node printed no result";
        return run;
    }
    std::int64_t bytes = 0;
    if (doc["stream_bytes"].get_int64().get(bytes) == simdjson::SUCCESS) {
        run.stream_bytes = static_cast<double>(bytes);
    }
    for (auto v : ms) {
        double d = 0;
        if (v.get_double().get(d) == simdjson::SUCCESS) run.unary.ms.push_back(d);
    }
    run.ok = true;
    return run;
}

// curl, for the streamed body only: one transfer to /dev/null, MB/s as curl measures it.
double run_curl_stream(const http_bench_options& o, const std::string& base) {
    const auto command = "curl -s -o /dev/null -w '%{size_download} %{time_total}' '" + base +
                         "/stream?bytes=" + std::to_string(o.stream_mib << 20) + "' 2>/dev/null";
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return 0;
    double bytes = 0;
    double seconds = 0;
    const int got = std::fscanf(pipe, "%lf %lf", &bytes, &seconds);
    ::pclose(pipe);
    return got == 2 && seconds > 0 ? bytes / 1e6 / seconds : 0;
}

std::string ratio(double a, double b) {
    if (a <= 0 || b <= 0) return "n/a";
    char text[32];
    std::snprintf(text, sizeof text, "%.2fx", a / b);
    return text;
}

void write_run(json_writer& w, const client_run& r) {
    w.begin_object();
    w.key("unary");
    write_summary(w, r.unary);
    w.key("requests_per_s").value(r.requests_per_s());
    w.key("stream_mb_per_s").value(r.stream_mb_per_s());
    w.end_object();
}

}  // namespace

int bench_http(int argc, char** argv) {
    http_bench_options o;
    parse_flags(
        argc, argv,
        {count_flag("--n", o.n, 1, 10'000'000), count_flag("--concurrency", o.concurrency, 1, 256),
         count_flag("--stream-mib", o.stream_mib, 1, 65536), string_flag("--json", o.json_path)});

    // moat's server on its own thread: both clients load the same server the same way.
    asio::io_context server_io;
    http::server_options server_options;
    server_options.max_connections = 4096;
    server_options.idle_timeout = std::chrono::seconds(120);
    http::server server(server_io.get_executor(), server_options);
    (void)server.route("GET", "/small", serve_small);
    (void)server.route("GET", "/stream", serve_stream);
    auto endpoint = server.start();
    if (!endpoint) return report_error("bench http", endpoint.error());
    auto guard = asio::make_work_guard(server_io);
    std::thread server_thread([&server_io] { server_io.run(); });
    const auto base = "http://127.0.0.1:" + std::to_string(endpoint->port());

    std::fprintf(stderr, "moat bench http: moat client...\n");
    const auto moat_run = run_moat_client(o, base);
    std::fprintf(stderr, "moat bench http: node client...\n");
    const auto node_run = run_node_client(o, base);
    std::fprintf(stderr, "moat bench http: curl...\n");
    const double curl_mb_s = run_curl_stream(o, base);

    bool stopped = false;
    asio::co_spawn(server_io, server.async_stop(std::chrono::milliseconds(2000)),
                   stop_done{&stopped});
    guard.reset();
    server_thread.join();

    char line[256];
    std::string out;
    std::snprintf(line, sizeof line,
                  "moat bench http: %zu GETs of a small JSON body, %zu in flight, then one %zu MiB "
                  "streamed body; moat's server on 127.0.0.1\n",
                  o.n, o.concurrency, o.stream_mib);
    out += line;
    out += "client                n  failed      req/s   p50 ms   p99 ms   stream MB/s\n";
    for (const client_run* r : {&moat_run, &node_run}) {
        if (!r->ok) {
            out += r->unary.name + ": failed: " + r->why + "\n";
            continue;
        }
        std::snprintf(line, sizeof line, "%-14s %8zu %7zu %10.0f %8.3f %8.3f %13.0f\n",
                      r->unary.name.c_str(), r->unary.ms.size(), r->unary.failures,
                      r->requests_per_s(), r->unary.percentile(0.5), r->unary.percentile(0.99),
                      r->stream_mb_per_s());
        out += line;
    }
    if (curl_mb_s > 0) {
        std::snprintf(line, sizeof line, "%-14s %8s %7s %10s %8s %8s %13.0f\n", "curl", "-", "-",
                      "-", "-", "-", curl_mb_s);
        out += line;
    }
    if (moat_run.ok && node_run.ok) {
        out += "moat / node: req/s " + ratio(moat_run.requests_per_s(), node_run.requests_per_s()) +
               ", p50 " + ratio(node_run.unary.percentile(0.5), moat_run.unary.percentile(0.5)) +
               " faster, p99 " +
               ratio(node_run.unary.percentile(0.99), moat_run.unary.percentile(0.99)) +
               " faster, stream " + ratio(moat_run.stream_mb_per_s(), node_run.stream_mb_per_s()) +
               "\n";
    }
    if (moat_run.ok && curl_mb_s > 0) {
        out += "moat / curl: stream " + ratio(moat_run.stream_mb_per_s(), curl_mb_s) + "\n";
    }
    const bool published = publish_report("bench http", out, o.json_path, [&](json_writer& w) {
        w.key("n").value(static_cast<std::uint64_t>(o.n));
        w.key("concurrency").value(static_cast<std::uint64_t>(o.concurrency));
        w.key("stream_mib").value(static_cast<std::uint64_t>(o.stream_mib));
        w.key("moat");
        write_run(w, moat_run);
        w.key("node");
        write_run(w, node_run);
        w.key("curl_stream_mb_per_s").value(curl_mb_s);
    });
    return published && moat_run.ok ? 0 : exit_failure;
}

}  // namespace moat::cli
