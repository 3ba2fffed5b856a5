// Google Benchmark microbenchmarks of moat's pure parts: capturing output as head + tail, writing
// an exec result as JSON, and a state record's JSON round trip (written at every create, read by
// every cross-process list, attach and destroy).
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
    r.workdir = "/workspace";
    r.layers = {"user_ns", "pid_ns", "mount_ns", "net_ns", "seccomp"};
    for (auto _ : state) {
        auto back = moat::record_from_json(moat::to_json(r));
        benchmark::DoNotOptimize(back);
    }
}
BENCHMARK(record_json_round_trip);

}  // namespace

BENCHMARK_MAIN();
