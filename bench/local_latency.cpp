// Latency of the local backend's create (until pid 1 is ready), exec round trip and destroy
// (until confirmed gone), interleaved round-robin with a host posix_spawn + wait of the same
// command as the exec baseline, so background load falls on both alike.
//
//   build/dev/bench/moat_bench_local [--n N] [--warmup N]
//
// Prints p50/p90/p99/max per operation and the exec/baseline ratio. The full `moat bench`
// (raw-clone and bwrap baselines, concurrency sweeps, the pooling advisor) is a separate issue.
#include <moat/local_backend.hpp>
#include <moat/runtime.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

extern char** environ;

namespace {

using clock_type = std::chrono::steady_clock;

struct samples {
    const char* name;
    std::vector<double> ms;

    double percentile(double p) const {
        std::vector<double> sorted = ms;
        std::sort(sorted.begin(), sorted.end());
        const auto index =
            static_cast<std::size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
        return sorted[index];
    }
};

double elapsed_ms(clock_type::time_point start) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
}

double host_spawn_true() {
    const auto start = clock_type::now();
    pid_t pid = -1;
    char arg0[] = "/bin/true";
    char* argv[] = {arg0, nullptr};
    if (::posix_spawn(&pid, "/bin/true", nullptr, nullptr, argv, environ) != 0) std::abort();
    int status = 0;
    ::waitpid(pid, &status, 0);
    return elapsed_ms(start);
}

struct bench_options {
    int iterations = 200;
    int warmup = 10;
};

asio::awaitable<int> measure(moat::backend& local, bench_options options, samples* create,
                             samples* exec, samples* exec_again, samples* handle_exec,
                             samples* baseline, samples* destroy) {
    moat::runtime sandboxes(local);
    moat::exec_request request;
    request.argv = {"/bin/true"};
    const moat::sandbox_spec spec;
    for (int i = -options.warmup; i < options.iterations; ++i) {
        auto start = clock_type::now();
        auto box = co_await local.async_create(spec);
        const double create_ms = elapsed_ms(start);
        if (!box) {
            std::fprintf(stderr, "create failed: %s\n", box.error().to_string().c_str());
            co_return 1;
        }
        start = clock_type::now();
        auto ran = co_await local.async_exec(box->id, request);
        const double exec_ms = elapsed_ms(start);
        const double baseline_ms = host_spawn_true();
        // A second exec in the same sandbox: what a session pays per command.
        start = clock_type::now();
        auto again = co_await local.async_exec(box->id, request);
        const double again_ms = elapsed_ms(start);
        if (!again || again->exit_code != 0) co_return 1;
        // The same exec through a sandbox handle (queue, deadline, quarantine bookkeeping).
        auto handle = co_await sandboxes.async_attach(box->id);
        if (!handle) co_return 1;
        start = clock_type::now();
        auto through_handle = co_await (*handle)->async_exec(request);
        const double handle_ms = elapsed_ms(start);
        handle->reset();  // detaches; the sandbox stays
        if (!through_handle || through_handle->exit_code != 0) co_return 1;
        start = clock_type::now();
        auto gone = co_await local.async_destroy(box->id);
        const double destroy_ms = elapsed_ms(start);
        if (!ran || ran->exit_code != 0 || !gone) {
            std::fprintf(stderr, "exec or destroy failed\n");
            co_return 1;
        }
        if (i < 0) continue;
        create->ms.push_back(create_ms);
        exec->ms.push_back(exec_ms);
        exec_again->ms.push_back(again_ms);
        handle_exec->ms.push_back(handle_ms);
        baseline->ms.push_back(baseline_ms);
        destroy->ms.push_back(destroy_ms);
        if ((i + 1) % 50 == 0) std::fprintf(stderr, "\r%d/%d", i + 1, options.iterations);
    }
    std::fprintf(stderr, "\n");
    co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
    bench_options options;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--n") == 0)
            options.iterations = std::max(1, std::atoi(argv[i + 1]));
        if (std::strcmp(argv[i], "--warmup") == 0)
            options.warmup = std::max(0, std::atoi(argv[i + 1]));
    }
    samples create{"create (until pid 1 ready)", {}};
    samples exec{"exec /bin/true (round trip)", {}};
    samples exec_again{"exec again, same sandbox", {}};
    samples handle_exec{"exec /bin/true via a handle", {}};
    samples baseline{"host posix_spawn /bin/true", {}};
    samples destroy{"destroy (until confirmed)", {}};

    asio::io_context io;
    auto local = moat::make_local_backend(io.get_executor());
    int code = 1;
    asio::co_spawn(
        io,
        measure(*local, options, &create, &exec, &exec_again, &handle_exec, &baseline, &destroy),
        [&code, &io](std::exception_ptr failure, int value) {
            code = failure ? 1 : value;
            io.stop();  // the backend's helper keeps the context busy until destroyed
        });
    io.run();
    if (code != 0) return code;

    std::printf("%-30s %6s %8s %8s %8s %8s\n", "operation (ms)", "n", "p50", "p90", "p99", "max");
    for (const samples* s : {&create, &exec, &exec_again, &handle_exec, &baseline, &destroy}) {
        std::printf("%-30s %6zu %8.2f %8.2f %8.2f %8.2f\n", s->name, s->ms.size(),
                    s->percentile(0.5), s->percentile(0.9), s->percentile(0.99),
                    s->percentile(1.0));
    }
    std::printf("exec / host posix_spawn: p50 %.2fx, p99 %.2fx\n",
                exec.percentile(0.5) / baseline.percentile(0.5),
                exec.percentile(0.99) / baseline.percentile(0.99));
    std::printf("exec via a handle / exec again on the backend: p50 %.2fx, p99 %.2fx\n",
                handle_exec.percentile(0.5) / exec_again.percentile(0.5),
                handle_exec.percentile(0.99) / exec_again.percentile(0.99));
    return 0;
}
