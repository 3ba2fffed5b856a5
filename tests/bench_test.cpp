// `moat bench`: the pooling advisor's arithmetic, and a short real run with its JSON and plot.
#include <doctest/doctest.h>

#include "cli/bench/advisor.hpp"
#include "support/build_paths.hpp"
#include "support/host_inspect.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

TEST_CASE("the advisor creates on demand when a create fits the budget") {
    moat::cli::advisor_input in;
    in.create_p50_ms = 2;
    in.create_p99_ms = 4;
    in.first_token_ms = 500;
    in.arrivals_per_s = 50;
    const auto a = moat::cli::advise(in);
    CHECK_FALSE(a.use_pool);
    CHECK(a.pool_size == 0);
    REQUIRE(a.reasoning.size() >= 2);
    CHECK(a.reasoning[1].find("on demand") != std::string::npos);
}

TEST_CASE("the advisor sizes a pool from arrivals over the refill time") {
    CHECK(moat::cli::poisson_quantile(0, 0.01) == 0);
    // Poisson(1): P(X > 3) = 1.9%, P(X > 4) = 0.37%.
    CHECK(moat::cli::poisson_quantile(1, 0.01) == 4);
    moat::cli::advisor_input in;
    in.create_p50_ms = 900;
    in.create_p99_ms = 2500;
    in.first_token_ms = 800;
    in.arrivals_per_s = 5;
    const auto a = moat::cli::advise(in);
    CHECK(a.use_pool);
    CHECK(a.pool_size == moat::cli::poisson_quantile(12.5, 0.01));
    CHECK_FALSE(a.cannot_keep_up);
    // A create-rate cap below the arrival rate: no pool size keeps up, and the advice says so.
    in.create_rate_cap = 4;
    const auto capped = moat::cli::advise(in);
    CHECK(capped.cannot_keep_up);
}

namespace {

std::string run_shell(const std::string& command, int& code) {
    FILE* pipe = ::popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::string out;
    char buffer[4096];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
    const int status = ::pclose(pipe);
    code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

}  // namespace

TEST_CASE("moat bench create measures moat beside its baselines and writes JSON and a plot" *
          moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const std::string json = "/tmp/moat-bench-test.json";
    const std::string svg = "/tmp/moat-bench-test.svg";
    int code = -1;
    const auto out = run_shell(std::string(moat::test::moat_cli_path()) +
                                   " bench create --n 20 --mode burst "
                                   "--concurrency 4 --json " +
                                   json + " --plot " + svg + " 2>&1",
                               code);
    CHECK_MESSAGE(code == 0, out);
    CHECK(out.find("create / raw isolation") != std::string::npos);
    const std::string report = moat::test::read_file(json);
    CHECK(report.find("\"create\":{\"n\":20,\"failures\":0") != std::string::npos);
    CHECK(report.find("\"baseline_create\":{") != std::string::npos);
    CHECK(report.find("\"baseline_exec\":{") != std::string::npos);
    CHECK(report.find("\"p99_ms\"") != std::string::npos);
    CHECK(report.find("\"mode\":\"burst\"") != std::string::npos);
    CHECK(moat::test::read_file(svg).find("<polyline") != std::string::npos);
    // The advisor reads the measured file.
    const auto advice =
        run_shell(std::string(moat::test::moat_cli_path()) + " bench advise --from " + json +
                      " --first-token-ms 400 --arrivals-per-s 10 2>&1",
                  code);
    CHECK(code == 0);
    // The advice follows the measured p99 (not the load this test ran under): on demand when it
    // fits in 10% of the 400 ms budget, a pool otherwise; and it quotes the measured figure.
    const auto p99_at = report.find("\"p99_ms\":", report.find("\"create\":{"));
    REQUIRE(p99_at != std::string::npos);
    const double measured_p99 = std::strtod(report.c_str() + p99_at + 9, nullptr);
    char quoted[64];
    std::snprintf(quoted, sizeof quoted, "%.2f ms at p99", measured_p99);
    CHECK_MESSAGE(advice.find(quoted) != std::string::npos, advice);
    const char* expected = measured_p99 <= 40.0 ? "recommendation: create on demand"
                                                : "recommendation: a warm pool of ";
    CHECK_MESSAGE(advice.find(expected) != std::string::npos, advice);
    std::remove(json.c_str());
    std::remove(svg.c_str());
}

TEST_CASE("moat bench memory, pool and sweep run and report what they measured" *
          moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    int code = -1;
    auto out =
        run_shell(std::string(moat::test::moat_cli_path()) + " bench memory --count 30 2>&1", code);
    CHECK_MESSAGE(code == 0, out);
    CHECK(out.find(
              "held 30 idle sandboxes at once; live pid-1 agents under the helper in /proc: 30") !=
          std::string::npos);
    out = run_shell(std::string(moat::test::moat_cli_path()) + " bench pool --n 20 2>&1", code);
    CHECK_MESSAGE(code == 0, out);
    CHECK(out.find("pool hand-out (async_take_warm, every take a hit), n 20") != std::string::npos);
    out = run_shell(std::string(moat::test::moat_cli_path()) + " bench sweep --n 8 2>/dev/null",
                    code);
    CHECK_MESSAGE(code == 0, out);
    CHECK(out.find("       64    128") != std::string::npos);
    CHECK(out.find("(failures)") == std::string::npos);
}

TEST_CASE(
    "moat bench serve times create, a first command and kill through the API beside the "
    "library and leaves no sandbox behind" *
    moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const std::string json = "/tmp/moat-bench-serve-test.json";
    std::remove(json.c_str());
    int code = -1;
    const auto out = run_shell(
        std::string(moat::test::moat_cli_path()) + " bench serve --n 5 --json " + json + " 2>&1",
        code);
    CHECK_MESSAGE(code == 0, out);
    CHECK_MESSAGE(out.find("serve create / library create: p50 ") != std::string::npos, out);
    CHECK(out.find("(target: p50 <= 1.5x)") != std::string::npos);
    CHECK(out.find("serve command / library command: p50 ") != std::string::npos);
    CHECK(out.find("serve kill / library kill: p50 ") != std::string::npos);
    const std::string report = moat::test::read_file(json);
    for (const char* series : {"serve_create", "serve_command", "serve_kill", "library_create",
                               "library_command", "library_kill"}) {
        const std::string expected = "\"" + std::string(series) + "\":{\"n\":5,\"failures\":0";
        CHECK_MESSAGE(report.find(expected) != std::string::npos, series, "\n", report);
    }
    CHECK(report.find("\"left_behind\":0") != std::string::npos);
    // Every sandbox the API created (3 warm-ups and 5 measured) is gone from the host's list.
    const auto ids_at = report.find("\"serve_sandbox_ids\":[");
    REQUIRE(ids_at != std::string::npos);
    const auto ids_end = report.find(']', ids_at);
    REQUIRE(ids_end != std::string::npos);
    std::vector<std::string> ids;
    for (auto at = report.find('"', ids_at + 21); at < ids_end;
         at = report.find('"', report.find('"', at + 1) + 1)) {
        ids.push_back(report.substr(at + 1, report.find('"', at + 1) - at - 1));
    }
    CHECK(ids.size() == 8);
    const auto listed = run_shell(std::string(moat::test::moat_cli_path()) + " ls 2>&1", code);
    CHECK_MESSAGE(code == 0, listed);
    for (const auto& id : ids) {
        CHECK_MESSAGE(!id.empty(), report);
        CHECK_MESSAGE(listed.find(id) == std::string::npos, id, " is still listed:\n", listed);
    }
    std::remove(json.c_str());
}

TEST_CASE(
    "moat bench e2b compares the C++ e2b backend with the e2b JS SDK on one moat serve and "
    "leaves no sandbox behind" *
    moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const std::string sdk = moat::test::source_dir() + "/tests/e2b/node_modules/e2b";
    if (moat::test::read_file(sdk + "/package.json").empty()) {
        const char* required = std::getenv("MOAT_REQUIRE_NAMESPACES");
        REQUIRE_MESSAGE((required == nullptr || std::string(required) != "1"),
                        sdk << " is missing: run scripts/install-deps");
        MESSAGE("SKIPPED: " << sdk << " is missing (scripts/install-deps runs npm ci there)");
        return;
    }
    const std::string json = "/tmp/moat-bench-e2b-test.json";
    std::remove(json.c_str());
    int code = -1;
    const auto out =
        run_shell(std::string(moat::test::moat_cli_path()) +
                      " bench e2b --n 10 --concurrency 2 --lifecycle-n 2 --json " + json + " 2>&1",
                  code);
    CHECK_MESSAGE(code == 0, out);
    CHECK_MESSAGE(out.find("SDK / C++ client CPU per command: ") != std::string::npos, out);
    CHECK(out.find("e2b / local create + first exec: p50 ") != std::string::npos);
    const std::string report = moat::test::read_file(json);
    for (const char* side : {"\"cpp\":{\"ran\":true", "\"sdk\":{\"ran\":true"}) {
        CHECK_MESSAGE(report.find(side) != std::string::npos, side, "\n", report);
    }
    for (const char* series : {"e2b_create_exec", "local_create_exec"}) {
        const std::string expected = "\"" + std::string(series) + "\":{\"n\":2,\"failures\":0";
        CHECK_MESSAGE(report.find(expected) != std::string::npos, series, "\n", report);
    }
    CHECK(report.find("\"sdk_over_cpp_cpu_per_command\":0,") == std::string::npos);
    CHECK(report.find("\"serve_exit_code\":0") != std::string::npos);
    const auto listed = run_shell(std::string(moat::test::moat_cli_path()) + " ls 2>&1", code);
    CHECK_MESSAGE(code == 0, listed);
    CHECK_MESSAGE(listed.find("moat-bench-e2b") == std::string::npos, listed);
    std::remove(json.c_str());
}

namespace {

// Runs `moat bench <what> <args> --json FILE` and checks its report: exit 0, each of `lines` in
// its output, each of `keys` in its JSON, `json_check` in the JSON too, and no sandbox labelled
// moat.cli=bench-<what> left running.
void check_fetch_bench(const std::string& what, const std::string& args,
                       std::initializer_list<const char*> lines,
                       std::initializer_list<const char*> keys, const std::string& json_check) {
    const std::string json =
        "/tmp/moat-bench-" + what + "-test-" + std::to_string(::getpid()) + ".json";
    int code = -1;
    const auto out = run_shell(std::string(moat::test::moat_cli_path()) + " bench " + what + " " +
                                   args + " --json " + json + " 2>&1",
                               code);
    CAPTURE(out);
    CHECK(code == 0);
    for (const char* line : lines) CHECK_MESSAGE(out.find(line) != std::string::npos, line);
    std::ifstream file(json);
    const std::string text((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
    for (const char* key : keys) CHECK_MESSAGE(text.find(key) != std::string::npos, key);
    CHECK(text.find(json_check) != std::string::npos);
    std::remove(json.c_str());
    moat::test::local_fixture f;
    auto listed = f.run(f.local->async_list({{"moat.cli", "bench-" + what}}));
    REQUIRE(listed);
    for (const auto& info : *listed) CHECK(info.state != moat::sandbox_state::running);
}

}  // namespace

TEST_CASE(
    "moat bench egress downloads from the host and through a sandbox's egress proxy and reports "
    "the ratio" *
    moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    check_fetch_bench(
        "egress", "--n 2 --mb 2", {"throughput p50: host", "connection setup overhead"},
        {"\"host_download\"", "\"sandbox_download\"", "\"host_small\"", "\"sandbox_small\"",
         "\"throughput_ratio_p50\"", "\"setup_overhead_p50_ms\""},
        "\"failures\":0");
}

TEST_CASE(
    "moat bench ports downloads from a host server and through a forwarded port and reports the "
    "ratios" *
    moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    check_fetch_bench("ports", "--n 2 --mb 2 --setup-n 4",
                      {"throughput p50: host", "connection setup (connect to first byte): p50"},
                      {"\"host_download\"", "\"forward_download\"", "\"host_setup\"",
                       "\"forward_setup\"", "\"throughput_ratio_p50\"", "\"setup_ratio_p50\"",
                       "\"setup_ratio_p99\"", "\"setup_overhead_p50_ms\""},
                      "\"n\":4,\"failures\":0");
}
