#include "cli/bench/fleet_benches.hpp"

#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>

#include "cli/arguments.hpp"
#include "cli/bench/iteration.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/cli_runtime.hpp"

#include <moat/task_group.hpp>

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace moat::cli {
namespace {

using clock_type = std::chrono::steady_clock;

// The one flag a fleet bench takes (a count from 1 to 100000), or `fallback`.
std::size_t counted(const char* flag, int argc, char** argv, std::size_t fallback) {
    std::size_t value = fallback;
    parse_flags(argc, argv, {count_flag(flag, value, 1, 100'000)});
    return value;
}

// VmRSS of a process in bytes, or 0.
std::uint64_t resident_bytes(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string key;
    while (in >> key) {
        if (key == "VmRSS:") {
            std::uint64_t kib = 0;
            in >> kib;
            return kib * 1024;
        }
        in.ignore(4096, '\n');
    }
    return 0;
}

std::string comm_of(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
    std::string name;
    std::getline(in, name);
    return name;
}

int parent_of(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    std::getline(in, text);
    const auto close = text.rfind(')');
    if (close == std::string::npos) return 0;
    int ppid = 0;
    std::sscanf(text.c_str() + close + 2, "%*c %d", &ppid);
    return ppid;
}

// Processes named `comm` whose parent is `parent` (0: any parent).
std::vector<int> processes_named(const std::string& comm, int parent) {
    std::vector<int> out;
    DIR* d = ::opendir("/proc");
    if (d == nullptr) return out;
    while (dirent* e = ::readdir(d)) {
        const int pid = std::atoi(e->d_name);
        if (pid <= 0 || comm_of(pid) != comm) continue;
        if (parent == 0 || parent_of(pid) == parent) out.push_back(pid);
    }
    ::closedir(d);
    return out;
}

void raise_descriptor_limit() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &limit);
    }
}

// --- sweep -----------------------------------------------------------------------------------

asio::awaitable<int> sweep(backend& b, std::size_t per_level) {
    std::string out = "in flight      n   creates/s   create p50   create p99   exec p99\n";
    for (const std::size_t level : {1, 2, 4, 8, 16, 64}) {
        const std::size_t n = std::max(per_level, 2 * level);
        runtime sandboxes(b, bench_runtime_options(n, level));
        latency_samples create{"create", {}, 0}, exec{"exec", {}, 0};
        const auto start = clock_type::now();
        std::size_t done = 0;
        while (done < n) {
            const std::size_t count = std::min(level, n - done);
            const std::chrono::milliseconds no_spacing(0);
            auto round = co_await run_round(sandboxes, count, no_spacing);
            for (const auto& it : round) {
                if (!it->ok) {
                    ++create.failures;
                    continue;
                }
                create.ms.push_back(it->create_ms);
                exec.ms.push_back(it->exec_ms);
            }
            done += count;
        }
        const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        char line[160];
        std::snprintf(line, sizeof line, "%9zu %6zu %11.1f %12.2f %12.2f %10.2f%s\n", level, n,
                      static_cast<double>(create.ms.size()) / seconds, create.percentile(0.5),
                      create.percentile(0.99), exec.percentile(0.99),
                      create.failures ? "  (failures)" : "");
        out += line;
        std::fputs(line, stderr);
    }
    out += "(each sandbox: create until ready, one exec of /bin/true, destroy until confirmed)\n";
    write_all(STDOUT_FILENO, out);
    co_return 0;
}

// --- memory ----------------------------------------------------------------------------------

asio::awaitable<int> hold_idle(backend& b, std::size_t count) {
    raise_descriptor_limit();
    runtime_options options = bench_runtime_options(count, 16);
    runtime sandboxes(b, options);
    // Start the helper, then take the baseline.
    sandbox_spec spec;
    spec.labels["moat.cli"] = "bench-memory";
    auto first = co_await sandboxes.async_create(spec);
    if (!first) co_return report_error("bench memory", first.error());
    const int self = ::getpid();
    const auto helpers = processes_named("moat-helper", self);
    const int helper = helpers.empty() ? 0 : helpers.front();
    const std::uint64_t self_before = resident_bytes(self);
    const std::uint64_t helper_before = helper ? resident_bytes(helper) : 0;

    std::vector<std::shared_ptr<sandbox>> held{std::move(*first)};
    for (std::size_t i = 1; i < count; ++i) {
        auto created = co_await sandboxes.async_create(spec);
        if (!created) {
            std::fprintf(stderr, "moat bench memory: create %zu failed: %s\n", i + 1,
                         created.error().to_string().c_str());
            break;
        }
        held.push_back(std::move(*created));
    }
    const std::size_t n = held.size();
    const std::uint64_t self_after = resident_bytes(self);
    const std::uint64_t helper_after = helper ? resident_bytes(helper) : 0;
    const auto agents = processes_named("moat-agent", helper);
    std::uint64_t kernel = 0;
    std::size_t measured = 0;
    label_filter ours;
    ours["moat.cli"] = "bench-memory";
    auto listed = co_await b.async_list(ours);
    if (listed) {
        for (const auto& info : *listed) {
            if (!info.memory_used_bytes) continue;
            kernel += *info.memory_used_bytes;
            ++measured;
        }
    }
    char text[768];
    const double per = n > 1 ? static_cast<double>(n - 1) : 1.0;
    std::snprintf(
        text, sizeof text,
        "held %zu idle sandboxes at once; live pid-1 agents under the helper in /proc: %zu\n"
        "host side per sandbox: application %.1f KiB, helper %.1f KiB\n"
        "kernel side per sandbox (its memory cgroup: agent, tmpfs, page tables): %.1f KiB "
        "(over %zu cgroups)\n",
        n, agents.size(),
        static_cast<double>(self_after > self_before ? self_after - self_before : 0) / per / 1024,
        static_cast<double>(helper_after > helper_before ? helper_after - helper_before : 0) / per /
            1024,
        measured ? static_cast<double>(kernel) / static_cast<double>(measured) / 1024 : 0.0,
        measured);
    write_all(STDOUT_FILENO, text);
    for (auto& box : held) (void)co_await box->async_destroy();
    co_return agents.size() >= n ? 0 : exit_failure;
}

// --- pool ------------------------------------------------------------------------------------

asio::awaitable<void> destroy_taken(std::shared_ptr<sandbox> box) {
    (void)co_await box->async_destroy();
}

asio::awaitable<int> pool_handout(backend& b, std::size_t n) {
    runtime sandboxes(b);
    manager_options options;
    options.pool_size = 4;
    options.spec.labels["moat.cli"] = "bench-pool";
    session_manager manager(sandboxes, options);
    const auto executor = co_await asio::this_coro::executor;
    asio::steady_timer timer(executor);
    task_group destroys(executor, "bench pool destroys");
    latency_samples handout{"pool hand-out", {}, 0};
    for (std::size_t i = 0; i < n; ++i) {
        // Every take is a hit: wait until the pool is full again.
        const auto limit = clock_type::now() + std::chrono::seconds(30);
        while (manager.warm() < options.pool_size && clock_type::now() < limit) {
            timer.expires_after(std::chrono::milliseconds(1));
            co_await timer.async_wait(asio::use_awaitable);
        }
        const auto start = clock_type::now();
        auto box = co_await manager.async_take_warm();
        const double ms =
            std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
        if (!box) {
            ++handout.failures;
            continue;
        }
        handout.ms.push_back(ms);
        // Destroyed off the measured path; the next take waits for the refill anyway.
        destroys.spawn(destroy_taken(std::move(*box)));
    }
    co_await destroys.async_wait_all();
    (void)co_await manager.async_shutdown();
    char line[256];
    std::snprintf(line, sizeof line,
                  "pool hand-out (async_take_warm, every take a hit), n %zu: p50 %.1f us, p99 %.1f "
                  "us, max %.1f us (target: p50 < 50 us)\n",
                  handout.ms.size(), handout.percentile(0.5) * 1000,
                  handout.percentile(0.99) * 1000, handout.percentile(1.0) * 1000);
    write_all(STDOUT_FILENO, line);
    co_return handout.failures == 0 ? 0 : exit_failure;
}

// --- hostsize --------------------------------------------------------------------------------

asio::awaitable<latency_samples> sequential_creates(backend& b, std::size_t n, const char* name) {
    runtime sandboxes(b, bench_runtime_options(n, 1));
    latency_samples create{name, {}, 0};
    for (std::size_t i = 0; i < n + 5; ++i) {
        auto it = std::make_shared<iteration_outcome>();
        co_await one_iteration(sandboxes, std::chrono::milliseconds(0), it);
        if (i < 5) continue;  // warm-up
        if (it->ok) {
            create.ms.push_back(it->create_ms);
        } else {
            ++create.failures;
        }
    }
    co_return create;
}

asio::awaitable<int> host_size(backend& b, std::size_t n) {
    auto small = co_await sequential_creates(b, n, "create, small host");
    // A big application: 2 GiB resident and 8 more threads. The threads spin at SCHED_IDLE, so
    // they make the process big without taking the two cores from the bench itself (which would
    // measure CPU starvation, not host size).
    std::vector<char> resident(std::size_t{2} << 30);
    for (std::size_t i = 0; i < resident.size(); i += 4096) resident[i] = 1;
    std::atomic<bool> stop{false};
    std::vector<std::thread> busy;
    for (int i = 0; i < 8; ++i) {
        busy.emplace_back([&stop] {
            sched_param none{};
            ::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &none);
            volatile std::uint64_t spin = 0;
            while (!stop.load(std::memory_order_relaxed)) spin = spin + 1;
        });
    }
    auto big = co_await sequential_creates(b, n, "create, 2 GiB + 8 threads");
    stop = true;
    for (auto& t : busy) t.join();
    std::string out = summary_header() + summary_line(small) + summary_line(big);
    char line[160];
    std::snprintf(
        line, sizeof line, "big host / small host: p50 %.2fx, p99 %.2fx (target: p50 <= 1.3x)\n",
        big.percentile(0.5) / small.percentile(0.5), big.percentile(0.99) / small.percentile(0.99));
    out += line;
    write_all(STDOUT_FILENO, out);
    co_return 0;
}

}  // namespace

std::optional<int> bench_fleet(std::string_view what, int argc, char** argv) {
    struct fleet_bench {
        std::string_view name;
        const char* flag;
        std::size_t fallback;
        asio::awaitable<int> (*run)(backend&, std::size_t);
    };
    static constexpr fleet_bench benches[] = {{"sweep", "--n", 128, sweep},
                                              {"memory", "--count", 1000, hold_idle},
                                              {"pool", "--n", 500, pool_handout},
                                              {"hostsize", "--n", 300, host_size}};
    for (const auto& bench : benches) {
        if (bench.name != what) continue;
        const std::size_t count = counted(bench.flag, argc, argv, bench.fallback);
        return run_with_backend([&bench, count](backend& b) { return bench.run(b, count); });
    }
    return std::nullopt;
}

}  // namespace moat::cli
