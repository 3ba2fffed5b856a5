#include "cli/bench/pty_bench.hpp"

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>
#include <moat/terminal.hpp>

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

struct pty_bench_options {
    std::size_t n = 2000;
    std::string json_path;
};

struct pty_samples {
    latency_samples pty{"pty_echo", {}, 0};
    latency_samples pipe{"pipe_echo", {}, 0};
};

asio::awaitable<result<void>> send_byte(terminal& t) {
    return t.async_write("x");
}

asio::awaitable<result<void>> send_byte(process& p) {
    return p.async_write_stdin("x");
}

// Reads until one byte came back; false if the output ended or failed first.
template <class Handle>
asio::awaitable<bool> read_echo(Handle& h) {
    for (;;) {
        auto next = co_await h.async_next();
        if (!next) co_return false;
        const auto* chunk = std::get_if<output_chunk>(&*next);
        if (chunk == nullptr) co_return false;
        if (!chunk->data.empty()) co_return chunk->data.size() == 1;
    }
}

template <class Handle>
asio::awaitable<void> time_echoes(Handle& h, std::size_t count, latency_samples& into) {
    for (std::size_t i = 0; i < count; ++i) {
        const auto start = std::chrono::steady_clock::now();
        auto sent = co_await send_byte(h);
        const bool echoed = sent && co_await read_echo(h);
        if (!echoed) {
            ++into.failures;
            continue;
        }
        const std::chrono::duration<double, std::milli> took =
            std::chrono::steady_clock::now() - start;
        into.ms.push_back(took.count());
    }
}

asio::awaitable<int> run_bench(backend& b, const pty_bench_options& o, pty_samples& r) {
    runtime sandboxes(b);
    sandbox_spec spec;
    spec.labels["moat.cli"] = "bench-pty";
    auto created = co_await sandboxes.async_create(spec);
    if (!created) co_return report_error("bench pty", created.error());
    auto box = std::move(*created);
    exec_request echo_on_terminal;
    // R: the terminal is raw (no echo of its own) before any byte is typed.
    echo_on_terminal.shell = "stty raw -echo && printf R && exec cat";
    echo_on_terminal.wall_limit = 60min;
    exec_request echo_on_pipes;
    echo_on_pipes.argv = {"cat"};
    echo_on_pipes.wall_limit = 60min;
    auto opened = co_await box->async_open_terminal(std::move(echo_on_terminal), {24, 80});
    auto spawned = co_await box->async_spawn(std::move(echo_on_pipes));
    int code = 0;
    if (!opened || !spawned) {
        code = report_error("bench pty", opened ? spawned.error() : opened.error());
    }
    if (code == 0 && !co_await read_echo(*opened)) {
        code = report_error("bench pty",
                            make_error(errc::backend_failure, "the terminal's cat did not start"));
    }
    if (code == 0) {
        latency_samples warmup{"warmup", {}, 0};
        co_await time_echoes(*opened, 10, warmup);
        co_await time_echoes(*spawned, 10, warmup);
        // Alternating halves, so a change in the machine's load meets both.
        for (int half = 0; half < 2; ++half) {
            const std::size_t count = half == 0 ? o.n / 2 : o.n - o.n / 2;
            co_await time_echoes(*opened, count, r.pty);
            co_await time_echoes(*spawned, count, r.pipe);
        }
        if (r.pty.failures != 0 || r.pipe.failures != 0) {
            std::fprintf(stderr, "moat bench pty: some round trips failed (see the table)\n");
            code = 1;
        }
    }
    opened = make_error(errc::cancelled, "done");  // dropping them kills both
    spawned = make_error(errc::cancelled, "done");
    auto destroyed = co_await box->async_destroy();
    if (!destroyed && code == 0) code = report_error("bench pty", destroyed.error());
    co_return code;
}

}  // namespace

int bench_pty(int argc, char** argv) {
    pty_bench_options o;
    parse_flags(argc, argv,
                {count_flag("--n", o.n, 2, 1'000'000), string_flag("--json", o.json_path)});
    pty_samples r;
    const int code = run_with_backend([&o, &r](backend& b) { return run_bench(b, o, r); });
    const double pipe_p50 = r.pipe.percentile(0.5);
    const double ratio = pipe_p50 > 0 ? r.pty.percentile(0.5) / pipe_p50 : 0.0;
    std::string text = "moat bench pty: " + std::to_string(o.n) +
                       " one-byte echo round trips through a sandbox's terminal (cat, raw) and "
                       "through a spawned cat's pipes, alternating\n";
    text += summary_header();
    text += summary_line(r.pty);
    text += summary_line(r.pipe);
    char line[160];
    std::snprintf(line, sizeof line, "pty - pipe: p50 %+.3f ms, p99 %+.3f ms; p50 ratio %.2fx\n",
                  r.pty.percentile(0.5) - pipe_p50,
                  r.pty.percentile(0.99) - r.pipe.percentile(0.99), ratio);
    text += line;
    const bool written = publish_report("bench pty", text, o.json_path, [&](json_writer& w) {
        for (const auto* s : {&r.pty, &r.pipe}) {
            w.key(s->name);
            write_summary(w, *s);
        }
        w.key("pty_minus_pipe_p50_ms").value(r.pty.percentile(0.5) - pipe_p50);
        w.key("pty_ratio_p50").value(ratio);
    });
    if (!written && code == 0) return 1;
    return code;
}

}  // namespace moat::cli
