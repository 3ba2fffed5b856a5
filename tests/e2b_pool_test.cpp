// The e2b backend's connections against a real `moat serve` (support/serve_process.hpp): 64
// running commands streaming output through one E2B_SANDBOX_URL do not make a cancel's kill and
// its confirmation wait (streams lease from their own budget), and 500 sandboxes used and
// destroyed leave the process's descriptors where they were.
#include <moat/e2b_backend.hpp>
#include <moat/with_timeout.hpp>

#include "support/async_test.hpp"
#include "support/loopback_peer.hpp"
#include "support/serve_process.hpp"

#include <asio/io_context.hpp>

#include <doctest/doctest.h>

#include <dirent.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using moat::errc;

moat::e2b_config config_for(const moat::test::serve_process& serve) {
    moat::e2b_config c;
    c.api_url = serve.api_url();
    c.sandbox_url = serve.envd_url();
    c.api_key = serve.api_key();
    c.request_timeout = 20s;
    return c;
}

std::size_t open_descriptors() {
    std::size_t n = 0;
    DIR* dir = ::opendir("/proc/self/fd");
    REQUIRE(dir != nullptr);
    while (const auto* entry = ::readdir(dir)) {
        if (entry->d_name[0] != '.') ++n;
    }
    ::closedir(dir);
    return n - 1;  // the directory stream itself
}

asio::awaitable<void> streams_then_cancel(moat::backend* b) {
    std::vector<std::string> ids;
    for (int i = 0; i < 4; ++i) {
        moat::sandbox_spec spec;
        auto created = co_await b->async_create(std::move(spec));
        REQUIRE_MESSAGE(created, created.error().to_string());
        ids.push_back(created->id);
    }
    // 64 long-running commands, each streaming a line every 100 ms, left running.
    std::vector<moat::exec_stream> streams;
    for (int i = 0; i < 64; ++i) {
        moat::exec_request streaming;
        streaming.shell = "while true; do echo tick; sleep 0.1; done";
        streaming.wall_limit = 120s;
        const auto& id = ids[static_cast<std::size_t>(i) % ids.size()];
        auto started = co_await b->async_exec_stream(id, std::move(streaming));
        REQUIRE_MESSAGE(started, "stream " << i << ": " << started.error().to_string());
        auto first = co_await started->async_next();
        REQUIRE_MESSAGE(first, first.error().to_string());
        streams.push_back(std::move(*started));
    }
    // One more command, cancelled by its deadline: the cancel kills it and confirms its end
    // with short calls (SendSignal, Process/List), which must not wait behind the 64 streams.
    moat::exec_request sleeper;
    sleeper.shell = "sleep 60";
    auto ran = b->async_exec(ids.front(), std::move(sleeper));
    const auto t0 = std::chrono::steady_clock::now();
    const auto limit = moat::deadline::after(500ms);
    auto outcome = co_await moat::with_timeout(std::move(ran), limit);
    const auto took = std::chrono::steady_clock::now() - t0;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
    std::printf("cancel-and-confirm with 64 streams open: %lld ms (500 ms of it the deadline)\n",
                static_cast<long long>(ms));
    REQUIRE_FALSE(outcome);
    CHECK_MESSAGE((outcome.error().code == errc::cancelled ||
                   outcome.error().code == errc::deadline_exceeded),
                  outcome.error().to_string());
    CHECK(took < 5s);
    streams.clear();  // dropping them kills their commands
    for (const auto& id : ids) {
        auto destroyed = co_await b->async_destroy(id);
        CHECK_MESSAGE(destroyed, destroyed.error().to_string());
    }
}

asio::awaitable<void> use_and_destroy(moat::backend* b, int count) {
    for (int i = 0; i < count; ++i) {
        moat::sandbox_spec spec;
        auto created = co_await b->async_create(std::move(spec));
        REQUIRE_MESSAGE(created, i << ": " << created.error().to_string());
        moat::exec_request hello;
        hello.argv = {"true"};
        auto ran = co_await b->async_exec(created->id, std::move(hello));
        REQUIRE_MESSAGE(ran, i << ": " << ran.error().to_string());
        auto destroyed = co_await b->async_destroy(created->id);
        REQUIRE_MESSAGE(destroyed, i << ": " << destroyed.error().to_string());
    }
}

}  // namespace

TEST_CASE(
    "e2b backend against moat serve: with 64 commands streaming through one sandbox URL, a "
    "cancel's kill is confirmed within 5 s") {
    moat::test::raise_open_files(4096);
    moat::test::serve_process serve;
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    moat::test::run_async(io, streams_then_cancel(b.get()), std::chrono::seconds(180));
}

TEST_CASE(
    "e2b backend against moat serve: 500 sandboxes used and destroyed leave the descriptors "
    "where they were") {
    moat::test::serve_process serve;
    asio::io_context io;
    auto b = moat::make_e2b_backend(io.get_executor(), config_for(serve));
    moat::test::run_async(io, use_and_destroy(b.get(), 5));  // the pool's steady state
    const auto before = open_descriptors();
    const auto t0 = std::chrono::steady_clock::now();
    moat::test::run_async(io, use_and_destroy(b.get(), 500), std::chrono::seconds(600));
    const auto after = open_descriptors();
    std::printf("500 sandboxes used and destroyed in %.1f s; descriptors %zu -> %zu\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                before, after);
    CHECK(after <= before + 4);
}
