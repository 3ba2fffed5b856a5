// Google Benchmark microbenchmarks of moat's pure parts: capturing output as head + tail, writing
// an exec result as JSON, a state record's JSON round trip (written at every create, read by
// every cross-process list, attach and destroy), and what every tool call does to its output
// before a model reads it (shaping, the result's JSON).
#include <moat/model_text.hpp>
#include <moat/tools.hpp>

#include <benchmark/benchmark.h>

#include "core/json_writer.hpp"
#include "core/output_capture.hpp"
#include "local/sandbox_records.hpp"

#include <string>

namespace {

void capture_4_mib_in_chunks(benchmark::State& state) {
    const std::string chunk(static_cast<std::size_t>(state.range(0)), 'x');
    for (auto _ : state) {
        moat::output_capture capture(moat::output_limits{});
        for (std::size_t total = 0; total < (std::size_t{4} << 20); total += chunk.size())
            capture.append(chunk);
        benchmark::DoNotOptimize(capture.finish());
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * (4 << 20));
}
BENCHMARK(capture_4_mib_in_chunks)->Arg(4096)->Arg(65536);

void write_exec_result_json(benchmark::State& state) {
    const std::string out(6000, 'a');
    const std::string err =
        "Traceback (most recent call last):\n  File \"<cell>\", line 1\nKeyError: 'x'\n";
    for (auto _ : state) {
        moat::json_writer w;
        w.begin_object().key("status").value("error").key("exit_code").value(1);
        w.key("stdout").value(out).key("stderr").value(err).key("duration_ms").value(12.5);
        w.end_object();
        benchmark::DoNotOptimize(w.take());
    }
}
BENCHMARK(write_exec_result_json);

void record_json_round_trip(benchmark::State& state) {
    moat::sandbox_record r;
    r.id = "sb-0123456789abcdef0123";
    r.owner_instance = "host/1234/abcdef";
    r.labels = {{"moat.policy", "session"}, {"moat.session", "conversation-42"}};
    r.init_pid = 4242;
    r.init_start_ticks = 123456;
    r.cgroups = {"/sys/fs/cgroup/pids/moat/" + r.id};
    r.layout.workdir = "/workspace";
    r.layers = {"user_ns", "pid_ns", "mount_ns", "net_ns", "seccomp"};
    for (auto _ : state) {
        auto back = moat::record_from_json(moat::to_json(r));
        benchmark::DoNotOptimize(back);
    }
}
BENCHMARK(record_json_round_trip);

// Program output as a model's code produces it: coloured log lines, ASCII tables, accented and
// CJK text and emoji, a progress bar's carriage returns.
std::string mixed_output(std::size_t bytes) {
    const std::string lines[] = {
        "\x1b[32mINFO\x1b[0m epoch 3 step 1200: loss=0.0421 acc=0.981\n",
        "| city      | population | caf\xC3\xA9s |\n",
        "\xE6\x9D\xB1\xE4\xBA\xAC 13,960,000 \xF0\x9F\x98\x80 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9\n",
        "\x1b[1;31mWARNING\x1b[0m: column 'price' has 12 missing values\n",
        " 45%|\xE2\x96\x88\xE2\x96\x88\xE2\x96\x88\xE2\x96\x88      | 45/100\r",
    };
    std::string out;
    out.reserve(bytes + 128);
    for (std::size_t k = 0; out.size() < bytes; ++k) out += lines[k % std::size(lines)];
    out.resize(bytes);  // may cut a sequence: shaping must cope
    return out;
}

void shape_1_mib_of_coloured_utf8_output(benchmark::State& state) {
    const std::string raw = mixed_output(std::size_t{1} << 20);
    for (auto _ : state) benchmark::DoNotOptimize(moat::shape_for_model(raw));
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                            static_cast<std::int64_t>(raw.size()));
}
BENCHMARK(shape_1_mib_of_coloured_utf8_output);

void tool_result_error_to_json(benchmark::State& state) {
    moat::tool_result r;
    r.tool = "run_python";
    r.status = moat::tool_status::error;
    r.exit_code = 1;
    r.stdout_text = mixed_output(2000);
    r.stderr_text =
        "Traceback (most recent call last):\n  File \"/workspace/.cells/004.py\", line 3, in "
        "<module>\n    total = df[\"price\"].sum()\n            ~~^^^^^^^^^\nKeyError: 'price'\n";
    r.duration = std::chrono::milliseconds(87);
    r.error_type = "KeyError";
    r.traceback = r.stderr_text;
    r.message = "KeyError: 'price'";
    r.hint = "print df.columns to see which columns exist, then retry with one of them";
    r.artifacts = {{"plot.png", 48213, "image/png"}};
    for (auto _ : state) benchmark::DoNotOptimize(r.to_json());
}
BENCHMARK(tool_result_error_to_json);

}  // namespace

BENCHMARK_MAIN();
