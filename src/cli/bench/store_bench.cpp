#include "cli/bench/store_bench.hpp"

#include <moat/redis_session_store.hpp>
#include <moat/session_store.hpp>

#include "cli/arguments.hpp"
#include "cli/bench/helper_process.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/cli_runtime.hpp"
#include "core/json_writer.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace moat::cli {
namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::size_t workers = 8;

struct store_bench_options {
    std::string url;
    std::string password_file;
    std::size_t n = 2000;
    std::size_t claims = 4000;
    std::string json_path;
};

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

bool socket_answers(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    path.copy(address.sun_path, sizeof address.sun_path - 1);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(fd);
    return ok;
}

// A redis-server of the bench's own (no persistence, unix socket only), stopped at the end.
class own_redis : public helper_server {
  public:
    bool start(std::string& why) {
        if (!make_directory("moat-bench-redis", why)) return false;
        const std::string& dir = directory();
        socket_path = dir + "/redis.sock";
        const std::string path = socket_path;
        if (!launch(
                {"redis-server", "--port", "0", "--unixsocket", socket_path, "--unixsocketperm",
                 "700", "--dir", dir, "--save", "", "--appendonly", "no", "--logfile",
                 dir + "/redis.log"},
                false, [path] { return socket_answers(path); }, "redis-server", why)) {
            why += " (see " + dir + "/redis.log)";
            return false;
        }
        return true;
    }
    std::string socket_path;
};

bool redis_server_on_path() {
    const char* path = std::getenv("PATH");
    if (path == nullptr) return false;
    std::string_view rest(path);
    while (!rest.empty()) {
        const auto colon = rest.find(':');
        const auto dir = rest.substr(0, colon);
        if (!dir.empty() && ::access((std::string(dir) + "/redis-server").c_str(), X_OK) == 0) {
            return true;
        }
        if (colon == std::string_view::npos) break;
        rest = rest.substr(colon + 1);
    }
    return false;
}

struct bench_results {
    latency_samples memory{"memory", {}, 0};
    latency_samples redis{"redis", {}, 0};
    double memory_claims_per_s = 0;
    double redis_claims_per_s = 0;
    std::string why;
};

// One existing session's acquire path through `store`: get, then touch taking the notice.
asio::awaitable<bool> acquire_path(session_store& store, const std::string& key,
                                   const std::string& box) {
    const auto limit = deadline::after(5s);
    auto got = co_await store.async_get(key, limit);
    if (!got || !*got || (**got).sandbox_id != box) co_return false;
    auto touched = co_await store.async_touch(key, box, 600s, true, limit);
    co_return touched && touched->has_value();
}

asio::awaitable<result<void>> make_session(session_store& store, const std::string& key,
                                           const std::string& box) {
    const auto limit = deadline::after(5s);
    auto claimed = co_await store.async_claim(key, "", 10s, limit);
    if (!claimed) co_return std::move(claimed).error();
    if (!claimed->token) co_return make_error(errc::backend_failure, key + ": already claimed");
    auto committed = co_await store.async_commit(key, *claimed->token, box, 0, 600s, limit);
    if (!committed) co_return std::move(committed).error();
    if (!*committed) co_return make_error(errc::backend_failure, key + ": commit refused");
    co_return result<void>{};
}

// One worker's share of the first-use claims: claim a fresh key and commit, `count` times.
asio::awaitable<std::size_t> claim_worker(std::shared_ptr<session_store> store, std::string tag,
                                          std::size_t count) {
    std::size_t failures = 0;
    for (std::size_t i = 0; i < count; ++i) {
        const auto key = tag + "-" + std::to_string(i);
        const auto box = "box-" + key;
        auto made = co_await make_session(*store, key, box);
        if (!made) ++failures;
    }
    co_return failures;
}

struct worker_done {
    std::size_t* finished;
    std::size_t* failures;
    void operator()(std::exception_ptr e, std::size_t f) const {
        *failures += e ? 1 : f;
        ++*finished;
    }
};

// Claims per second over `stores` (one worker each), `total` claims in all.
asio::awaitable<double> claims_per_second(asio::io_context& io,
                                          std::vector<std::shared_ptr<session_store>> stores,
                                          std::string tag, std::size_t total,
                                          std::size_t* failures) {
    std::size_t finished = 0;
    const auto t0 = clock_type::now();
    for (std::size_t w = 0; w < stores.size(); ++w) {
        auto work = claim_worker(stores[w], tag + "-w" + std::to_string(w), total / stores.size());
        asio::co_spawn(io, std::move(work), worker_done{&finished, failures});
    }
    asio::steady_timer timer(io);
    while (finished < stores.size()) {
        timer.expires_after(1ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
    const double seconds = ms_since(t0) / 1000.0;
    co_return seconds > 0 ? static_cast<double>(total / stores.size() * stores.size()) / seconds
                          : 0.0;
}

asio::awaitable<void> run_bench(asio::io_context& io, const store_bench_options& o,
                                const redis_config& config, bench_results& r) {
    auto memory = make_memory_session_store();
    auto made = make_redis_session_store(io.get_executor(), config);
    if (!made) {
        r.why = made.error().to_string();
        co_return;
    }
    auto redis = std::move(*made);
    // A run's own keys: a second run against the same Redis does not find the first's.
    const auto run_tag = "bench-" + std::to_string(::getpid()) + "-" +
                         std::to_string(clock_type::now().time_since_epoch().count());
    const auto key = run_tag + "-session";
    const std::string box = "bench-box";
    for (auto* store : {memory.get(), redis.get()}) {
        auto ready = co_await make_session(*store, key, box);
        if (!ready) {
            r.why = ready.error().to_string();
            co_return;
        }
    }
    // Warm-up: the connection, the script cache.
    for (int i = 0; i < 50; ++i) {
        (void)co_await acquire_path(*memory, key, box);
        (void)co_await acquire_path(*redis, key, box);
    }
    for (std::size_t i = 0; i < o.n; ++i) {
        auto t0 = clock_type::now();
        if (co_await acquire_path(*memory, key, box)) {
            r.memory.ms.push_back(ms_since(t0));
        } else {
            ++r.memory.failures;
        }
        t0 = clock_type::now();
        if (co_await acquire_path(*redis, key, box)) {
            r.redis.ms.push_back(ms_since(t0));
        } else {
            ++r.redis.failures;
        }
    }

    std::vector<std::shared_ptr<session_store>> memory_workers(workers, memory);
    std::vector<std::shared_ptr<session_store>> redis_workers;
    for (std::size_t w = 0; w < workers; ++w) {
        auto worker_store = make_redis_session_store(io.get_executor(), config);
        if (!worker_store) {
            r.why = worker_store.error().to_string();
            co_return;
        }
        redis_workers.push_back(std::move(*worker_store));
    }
    std::size_t failures = 0;
    r.memory_claims_per_s =
        co_await claims_per_second(io, memory_workers, run_tag + "-m", o.claims, &failures);
    r.redis_claims_per_s =
        co_await claims_per_second(io, redis_workers, run_tag + "-r", o.claims, &failures);
    if (failures != 0) r.why = std::to_string(failures) + " first-use claims failed";
}

struct run_done {
    bool* done;
    std::exception_ptr* failure;
    void operator()(std::exception_ptr e) const {
        *failure = e;
        *done = true;
    }
};

}  // namespace

int bench_store(int argc, char** argv) {
    store_bench_options o;
    if (const char* env = std::getenv("MOAT_STORE"); env != nullptr) o.url = env;
    parse_flags(
        argc, argv,
        {string_flag("--store", o.url), string_flag("--password-file", o.password_file),
         count_flag("--n", o.n, 1, 1'000'000), count_flag("--claims", o.claims, workers, 1'000'000),
         string_flag("--json", o.json_path)});
    own_redis own;
    redis_config config;
    std::string where;
    if (o.url.empty()) {
        if (!redis_server_on_path()) {
            write_all(STDERR_FILENO,
                      "moat bench store: no --store URL (or MOAT_STORE) given and no redis-server "
                      "on PATH to start one: install redis-server (scripts/install-deps) or pass "
                      "--store redis://host:port\n");
            return exit_failure;
        }
        std::string why;
        if (!own.start(why)) {
            return report_error("bench store", make_error(errc::backend_failure, why));
        }
        config.kind = redis_config::transport::unix_socket;
        config.socket_path = own.socket_path;
        where = "its own redis-server on " + own.socket_path;
    } else {
        auto parsed = parse_redis_url(o.url);
        if (!parsed) return report_error("bench store", parsed.error());
        config = std::move(*parsed);
        where = config.to_string();
    }
    if (auto loaded = load_redis_password(config, o.password_file); !loaded) {
        return report_error("bench store", loaded.error());
    }

    bench_results r;
    asio::io_context io;
    bool done = false;
    std::exception_ptr failure;
    asio::co_spawn(io, run_bench(io, o, config, r), run_done{&done, &failure});
    io.run();
    if (failure) {
        try {
            std::rethrow_exception(failure);
        } catch (const std::exception& e) {
            return report_error("bench store", make_error(errc::backend_failure, e.what()));
        }
    }
    if (!done)
        return report_error("bench store", make_error(errc::backend_failure, "did not finish"));
    if (r.memory.ms.empty() || r.redis.ms.empty()) {
        return report_error("bench store", make_error(errc::store_unavailable, r.why));
    }

    const double added = r.redis.percentile(0.5) - r.memory.percentile(0.5);
    std::string out;
    char line[320];
    std::snprintf(line, sizeof line,
                  "moat bench store: %zu acquires of an existing session (the store's get and "
                  "touch) through the memory store and the Redis store (%s), interleaved\n",
                  o.n, where.c_str());
    out += line;
    out += summary_header();
    out += summary_line(r.memory);
    out += summary_line(r.redis);
    std::snprintf(line, sizeof line, "Redis adds %.3f ms at p50 (target: <= 0.5 ms on loopback)\n",
                  added);
    out += line;
    std::snprintf(line, sizeof line,
                  "first-use claims (claim + commit), %zu workers, %zu claims: memory %.0f/s, "
                  "redis %.0f/s\n",
                  workers, o.claims, r.memory_claims_per_s, r.redis_claims_per_s);
    out += line;
    if (!r.why.empty()) out += "first failure: " + r.why + "\n";
    const bool published = publish_report("bench store", out, o.json_path, [&](json_writer& w) {
        w.key("n").value(static_cast<std::uint64_t>(o.n));
        w.key("store").value(where);
        w.key("memory");
        write_summary(w, r.memory);
        w.key("redis");
        write_summary(w, r.redis);
        w.key("redis_added_p50_ms").value(added);
        w.key("workers").value(static_cast<std::uint64_t>(workers));
        w.key("claims").value(static_cast<std::uint64_t>(o.claims));
        w.key("claims_per_s").begin_object();
        w.key("memory").value(r.memory_claims_per_s);
        w.key("redis").value(r.redis_claims_per_s);
        w.end_object();
    });
    const bool ok = published && r.why.empty() && r.memory.failures == 0 && r.redis.failures == 0;
    return ok ? 0 : exit_failure;
}

}  // namespace moat::cli
