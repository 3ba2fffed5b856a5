// A minimal server worker for the shared-session tests: its own local backend, runtime and
// session manager over a shared store, one action, one line of output. Reusable by any store's
// tests (the store is a command-line argument).
//
//   moat_session_worker STORE KEY ACTION [--label NAME=VALUE] [--lease-ms N] [--deadline-ms N]
//                       [--hang-in-seed] [--idle-ms N]
//
// STORE: "host:DIR" (the host store in DIR), "host" (its default directory). ACTION:
//   acquire  prints "id=<sandbox id> rebuilt=<0|1>" and exits, leaving the session's sandbox;
//   end      ends the session, prints "ended";
// --hang-in-seed prints "seeding id=<id>" from the seed hook and then hangs there (a worker to
// SIGKILL in the middle of its create). Errors print "error=<errc name> <detail>" and exit 1.
#include <moat/local_backend.hpp>
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace {

struct arguments {
    std::string store;
    std::string key;
    std::string action;
    std::map<std::string, std::string> labels;
    std::chrono::milliseconds lease = std::chrono::seconds(15);
    std::chrono::milliseconds limit = std::chrono::seconds(60);
    std::chrono::milliseconds idle = std::chrono::minutes(10);
    bool hang_in_seed = false;
};

std::optional<arguments> parse(int argc, char** argv) {
    if (argc < 4) return std::nullopt;
    arguments a;
    a.store = argv[1];
    a.key = argv[2];
    a.action = argv[3];
    for (int i = 4; i < argc; ++i) {
        const std::string flag = argv[i];
        const bool has_value = i + 1 < argc;
        if (flag == "--hang-in-seed") {
            a.hang_in_seed = true;
        } else if (flag == "--label" && has_value) {
            const std::string pair = argv[++i];
            const auto eq = pair.find('=');
            if (eq == std::string::npos) return std::nullopt;
            a.labels[pair.substr(0, eq)] = pair.substr(eq + 1);
        } else if (flag == "--lease-ms" && has_value) {
            a.lease = std::chrono::milliseconds(std::atoll(argv[++i]));
        } else if (flag == "--deadline-ms" && has_value) {
            a.limit = std::chrono::milliseconds(std::atoll(argv[++i]));
        } else if (flag == "--idle-ms" && has_value) {
            a.idle = std::chrono::milliseconds(std::atoll(argv[++i]));
        } else {
            return std::nullopt;
        }
    }
    return a;
}

std::shared_ptr<moat::session_store> make_store(const std::string& url,
                                                asio::any_io_executor executor) {
    if (url == "host") return moat::make_host_session_store(executor);
    if (url.rfind("host:", 0) == 0) {
        moat::host_store_options options;
        options.directory = url.substr(5);
        return moat::make_host_session_store(executor, options);
    }
    return nullptr;
}

void print_error(const moat::error& e) {
    std::printf("error=%s\n", e.to_string().c_str());
    std::fflush(stdout);
}

asio::awaitable<moat::result<void>> hang(std::shared_ptr<moat::sandbox> box) {
    std::printf("seeding id=%s\n", box->id().c_str());
    std::fflush(stdout);
    asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::hours(1));
    co_await timer.async_wait(asio::use_awaitable);
    co_return moat::result<void>{};
}

asio::awaitable<int> work(arguments a, moat::backend& local) {
    moat::runtime rt(local);
    auto store = make_store(a.store, local.get_executor());
    if (!store) {
        std::printf("error=unsupported store %s\n", a.store.c_str());
        co_return 2;
    }
    moat::manager_options options;
    options.spec.labels = a.labels;
    options.claim_lease = a.lease;
    options.idle_timeout = a.idle;
    if (a.hang_in_seed) {
        options.seed = [](std::shared_ptr<moat::sandbox> box, bool) {
            return hang(std::move(box));
        };
    }
    moat::session_manager manager(rt, options, store);
    int code = 0;
    if (a.action == "acquire") {
        auto got = co_await manager.async_acquire(a.key, moat::deadline::after(a.limit));
        if (got) {
            std::printf("id=%s rebuilt=%d\n", got->box->id().c_str(), got->rebuilt ? 1 : 0);
        } else {
            print_error(got.error());
            code = 1;
        }
    } else if (a.action == "end") {
        auto ended = co_await manager.async_end(a.key);
        if (ended) {
            std::printf("ended\n");
        } else {
            print_error(ended.error());
            code = 1;
        }
    } else {
        std::printf("error=unknown action %s\n", a.action.c_str());
        code = 2;
    }
    std::fflush(stdout);
    (void)co_await manager.async_shutdown(std::chrono::seconds(5));
    co_return code;
}

}  // namespace

int main(int argc, char** argv) {
    auto a = parse(argc, argv);
    if (!a) {
        std::fprintf(stderr,
                     "usage: moat_session_worker STORE KEY acquire|end [--label N=V] "
                     "[--lease-ms N] [--deadline-ms N] [--idle-ms N] [--hang-in-seed]\n");
        return 2;
    }
    asio::io_context io;
    auto local = moat::make_local_backend(io.get_executor());
    std::optional<int> code;
    asio::co_spawn(io, work(*a, *local),
                   [&code](std::exception_ptr failure, int c) { code = failure ? 3 : c; });
    while (!code && io.run_one() > 0) {
    }
    local.reset();
    io.run_for(std::chrono::seconds(1));
    return code.value_or(3);
}
