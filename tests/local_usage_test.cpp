// What a sandbox uses: a reading from the local backend (its cgroups and writable filesystems,
// read from the host) and the series usage_history makes of readings.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>
#include <moat/usage.hpp>

#include "support/async_wait.hpp"
#include "support/local_fixture.hpp"

#include <chrono>
#include <thread>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

moat::sandbox_usage reading(std::chrono::system_clock::time_point at, std::uint64_t cpu_us,
                            std::uint32_t cpus = 2) {
    moat::sandbox_usage u;
    u.at = at;
    u.cpu_time_us = cpu_us;
    u.cpu_count = cpus;
    return u;
}

asio::awaitable<void> hold(std::shared_ptr<moat::sandbox> box, moat::exec_request request,
                           std::shared_ptr<std::optional<moat::result<moat::exec_result>>> into) {
    auto ran = co_await box->async_exec(std::move(request));
    *into = std::move(ran);
}

}  // namespace

TEST_CASE(
    "a usage history turns CPU time into a share of the sandbox's CPUs, keeps its cap and "
    "answers a time range") {
    const auto t0 = std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000));
    moat::usage_history h(3);
    h.add(reading(t0, 1'000'000));
    h.add(reading(t0 + 5s, 6'000'000));     // 5 s of CPU in 5 s on 2 CPUs: 50 %
    h.add(reading(t0 + 4s, 9'000'000));     // older than the last: ignored
    h.add(reading(t0 + 10s, 6'000'000));    // idle
    h.add(reading(t0 + 15s, 100'000'000));  // more than the CPUs could: clamped to 100 %
    REQUIRE(h.size() == 3);                 // the first reading fell out
    const auto all = h.between(t0, t0 + 1h);
    REQUIRE(all.size() == 3);
    CHECK(all[0].cpu_used_percent == doctest::Approx(50.0));
    CHECK(all[1].cpu_used_percent == doctest::Approx(0.0));
    CHECK(all[2].cpu_used_percent == doctest::Approx(100.0));
    CHECK(h.between(t0 + 6s, t0 + 11s).size() == 1);
    CHECK(h.between(t0 - 1h, t0 - 30min).empty());
    REQUIRE(h.latest());
    CHECK(h.latest()->usage.at == t0 + 15s);
    // A counter that went backwards (a reading of something else) gives no share, not a huge one.
    h.add(reading(t0 + 20s, 5));
    CHECK_FALSE(h.latest()->cpu_used_percent.has_value());
}

TEST_CASE_FIXTURE(local_fixture,
                  "a local sandbox's usage counts its CPU time, memory and disk, read from the "
                  "host, on the side lane") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    moat::sandbox_spec spec;
    spec.limits.memory_bytes = 256u << 20;
    spec.limits.cpu_millicores = 1500;
    auto created = run(rt.async_create(spec));
    REQUIRE_MESSAGE(created, created.error().to_string());
    auto box = *created;

    auto before = run(box->async_usage());
    REQUIRE_MESSAGE(before, before.error().to_string());
    REQUIRE(before->cpu_time_us);
    REQUIRE(before->memory_used_bytes);
    REQUIRE(before->disk_used_bytes);
    REQUIRE(before->disk_total_bytes);
    CHECK(before->cpu_count == 2);  // 1.5 CPUs, rounded up
    CHECK(before->memory_limit_bytes == (256u << 20));
    // The workspace, /tmp and the home, each a filesystem of its own size.
    CHECK(*before->disk_total_bytes >= *box->info().limits.workspace_bytes);

    // A second of CPU and 20 MiB written to the workspace show.
    moat::exec_request burn;
    burn.shell =
        "head -c 20971520 /dev/zero > /workspace/fill && "
        "python3 -c \"import time\nt=time.process_time()\nwhile time.process_time()-t<1: pass\"";
    auto burned = run(box->async_exec(burn));
    REQUIRE(burned);
    REQUIRE(burned->exit_code == 0);
    auto after = run(box->async_usage());
    REQUIRE(after);
    CHECK(*after->cpu_time_us >= *before->cpu_time_us + 900'000);
    CHECK(*after->disk_used_bytes >= *before->disk_used_bytes + (20u << 20));
    CHECK(after->at > before->at);

    // On the side lane: a reading does not wait for a long command on the ordered lane.
    moat::exec_request slow;
    slow.shell = "sleep 3";
    auto holding = std::make_shared<std::optional<moat::result<moat::exec_result>>>();
    tasks.spawn(hold(box, slow, holding));
    run(moat::test::pause(300ms));
    auto beside = run(box->async_usage());
    CHECK(beside);
    CHECK_FALSE(holding->has_value());  // the sleep still runs
    run(moat::test::until([&] { return holding->has_value(); }, 20s));

    // A destroyed sandbox has no usage; an unknown one is not found.
    REQUIRE(run(box->async_destroy()));
    auto gone = run(local->async_usage(box->id()));
    REQUIRE_FALSE(gone);
    auto unknown = run(local->async_usage("sb-00000000000000000000"));
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == moat::errc::sandbox_not_found);
}
