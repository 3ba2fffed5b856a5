#include "cli/bench/serve_bench.hpp"

#include <moat/runtime.hpp>
#include <moat/task_group.hpp>

#include "cli/arguments.hpp"
#include "cli/bench/helper_process.hpp"
#include "cli/bench/iteration.hpp"
#include "cli/bench/latency_summary.hpp"
#include "cli/cli_runtime.hpp"
#include "core/json_writer.hpp"
#include "e2b_protocol/sandbox_replies.hpp"
#include "http/client.hpp"
#include "http/connect_envelope.hpp"
#include "serve/serve_host.hpp"

#include <simdjson.h>

#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace moat::cli {
namespace {

using clock_type = std::chrono::steady_clock;

constexpr auto request_budget = std::chrono::seconds(30);
constexpr auto start_budget = std::chrono::seconds(30);
constexpr auto stop_budget = std::chrono::seconds(60);
constexpr std::size_t warmup_iterations = 3;
constexpr std::size_t max_response_bytes = 1 << 20;

double ms_since(clock_type::time_point t) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

struct serve_bench_options {
    std::size_t n = 100;
    std::string json_path;
};

// What the in-process server announced and how it ended (written by its task's hooks).
struct serve_run_state {
    std::string api_url;
    std::string envd_url;
    bool has_finished = false;
    int code = -1;
    std::vector<std::string> problems;
};

struct serve_bench_results {
    latency_samples serve_create{"serve_create", {}, 0};
    latency_samples serve_command{"serve_command", {}, 0};
    latency_samples serve_kill{"serve_kill", {}, 0};
    latency_samples library_create{"library_create", {}, 0};
    latency_samples library_command{"library_command", {}, 0};
    latency_samples library_kill{"library_kill", {}, 0};
    std::set<std::string> created_ids;  // every sandboxID the API returned
    std::size_t left_behind = 0;
    std::string why;  // the first failure, for the report
    int serve_code = -1;
};

struct api_target {
    http::client* client;
    std::string api_url;
    std::string envd_url;
    std::string api_key;
};

asio::awaitable<void> run_serve_task(backend& b, serve::serve_options options,
                                     std::shared_ptr<serve_run_state> state) {
    serve::serve_hooks hooks;
    hooks.announce = [state](std::string_view line) {
        if (line.starts_with("api ")) state->api_url = std::string(line.substr(4));
        if (line.starts_with("envd ")) state->envd_url = std::string(line.substr(5));
    };
    hooks.report = [state](std::string_view line) { state->problems.emplace_back(line); };
    hooks.stop_grace = std::chrono::milliseconds(2000);
    const int code = co_await serve::async_run_serve(b, std::move(options), std::move(hooks));
    state->code = code;
    state->has_finished = true;
}

asio::awaitable<void> pause(std::chrono::milliseconds d) {
    asio::steady_timer timer(co_await asio::this_coro::executor, d);
    co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
}

void note_failure(serve_bench_results& r, latency_samples& series, const std::string& why) {
    ++series.failures;
    if (r.why.empty()) r.why = series.name + ": " + why;
}

struct created_sandbox {
    std::string id;
    std::string token;
};

// One call to the control plane with the bench's key, within request_budget: the response, or
// backend_failure naming `what` ("POST /sandboxes") when its status is not `expected`.
asio::awaitable<result<http::full_response>> api_call(api_target t, std::string method,
                                                      std::string path, std::string body,
                                                      int expected, std::string what) {
    http::request r;
    r.method = std::move(method);
    r.url = t.api_url + path;
    r.headers.add("X-API-Key", t.api_key);
    if (!body.empty()) r.headers.add("Content-Type", "application/json");
    r.body = std::move(body);
    r.limit = deadline::after(request_budget);
    auto fetched = co_await t.client->async_fetch(std::move(r), max_response_bytes);
    if (!fetched) co_return std::move(fetched).error();
    if (fetched->status() != expected) {
        co_return make_error(errc::backend_failure,
                             what + ": HTTP " + std::to_string(fetched->status()));
    }
    co_return std::move(*fetched);
}

asio::awaitable<result<created_sandbox>> api_create(api_target t) {
    auto fetched = co_await api_call(
        t, "POST", "/sandboxes", R"({"templateID":"base","timeout":120})", 201, "POST /sandboxes");
    if (!fetched) co_return std::move(fetched).error();
    auto reply = e2b_protocol::parse_sandbox_reply(fetched->body);
    if (!reply || reply->envd_access_token.empty()) {
        co_return make_error(errc::protocol_error,
                             "POST /sandboxes: no sandboxID and envdAccessToken in the 201 body");
    }
    created_sandbox box;
    box.id = std::move(reply->sandbox_id);
    box.token = std::move(reply->envd_access_token);
    co_return box;
}

// process.Process/Start of /bin/true, read to the end event and the end-stream message.
asio::awaitable<result<void>> api_first_command(api_target t, created_sandbox box) {
    http::request r;
    r.method = "POST";
    r.url = t.envd_url + "/process.Process/Start";
    r.headers.add("Content-Type", "application/connect+json");
    r.headers.add("E2b-Sandbox-Id", box.id);
    r.headers.add("X-Access-Token", box.token);
    r.body = http::connect::encode_envelope(0, R"({"process":{"cmd":"/bin/true"}})");
    r.limit = deadline::after(request_budget);
    auto sent = co_await t.client->async_send(std::move(r));
    if (!sent) co_return std::move(sent).error();
    if (sent->status() != 200) {
        co_return make_error(errc::backend_failure,
                             "process.Process/Start: HTTP " + std::to_string(sent->status()));
    }
    http::connect::envelope_decoder decoder(max_response_bytes);
    std::vector<http::connect::envelope> frames;
    bool has_end_event = false;
    simdjson::dom::parser parser;
    for (;;) {
        auto piece = co_await sent->async_read_some();
        if (!piece) co_return std::move(piece).error();
        if (piece->empty()) break;
        frames.clear();
        if (auto fed = decoder.feed(*piece, frames); !fed) co_return std::move(fed).error();
        for (const auto& frame : frames) {
            if (frame.is_end_stream()) {
                auto end = http::connect::parse_end_stream(frame.payload);
                if (!end) co_return std::move(end).error();
                if (end->error) co_return http::connect::to_error(*end->error);
                continue;
            }
            const simdjson::padded_string padded(frame.payload);
            simdjson::dom::element doc;
            simdjson::dom::element end_event;
            if (parser.parse(padded).get(doc) == simdjson::SUCCESS &&
                doc["event"]["end"].get(end_event) == simdjson::SUCCESS) {
                has_end_event = true;
            }
        }
    }
    if (auto finished = decoder.finish(); !finished) co_return std::move(finished).error();
    if (!has_end_event) {
        co_return make_error(errc::protocol_error, "process.Process/Start: no end event");
    }
    co_return result<void>();
}

asio::awaitable<result<void>> api_kill(api_target t, std::string id) {
    auto fetched =
        co_await api_call(t, "DELETE", "/sandboxes/" + id, "", 204, "DELETE /sandboxes/{id}");
    if (!fetched) co_return std::move(fetched).error();
    co_return result<void>();
}

// One create / first command / kill through the API; the sandbox is killed whatever the command
// did. `measured` false: a warm-up, nothing recorded but the id.
asio::awaitable<void> serve_iteration(api_target t, serve_bench_results* r, bool measured) {
    auto start = clock_type::now();
    auto created = co_await api_create(t);
    const double create_ms = ms_since(start);
    if (!created) {
        if (measured) note_failure(*r, r->serve_create, created.error().to_string());
        co_return;
    }
    r->created_ids.insert(created->id);
    if (measured) r->serve_create.ms.push_back(create_ms);
    start = clock_type::now();
    auto ran = co_await api_first_command(t, *created);
    const double command_ms = ms_since(start);
    if (measured && ran) r->serve_command.ms.push_back(command_ms);
    if (measured && !ran) note_failure(*r, r->serve_command, ran.error().to_string());
    start = clock_type::now();
    auto killed = co_await api_kill(t, created->id);
    const double kill_ms = ms_since(start);
    if (measured && killed) r->serve_kill.ms.push_back(kill_ms);
    if (measured && !killed) note_failure(*r, r->serve_kill, killed.error().to_string());
}

asio::awaitable<void> library_iteration(runtime& sandboxes, serve_bench_results* r, bool measured) {
    auto outcome = std::make_shared<iteration_outcome>();
    const std::chrono::milliseconds no_delay(0);
    co_await one_iteration(sandboxes, no_delay, outcome);
    if (!measured) co_return;
    if (!outcome->ok) {
        note_failure(*r, r->library_create, "create, exec of /bin/true or destroy failed");
        co_return;
    }
    r->library_create.ms.push_back(outcome->create_ms);
    r->library_command.ms.push_back(outcome->exec_ms);
    r->library_kill.ms.push_back(outcome->destroy_ms);
}

asio::awaitable<int> run_serve_bench(backend& b, serve_bench_options o, std::string state_dir,
                                     serve_bench_results* r) {
    const auto executor = co_await asio::this_coro::executor;
    serve::serve_options options;
    options.api_listen = asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0);
    options.envd_listen = asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0);
    options.api_key = random_api_key();
    options.state_dir = state_dir;
    options.destroy_on_exit = true;
    const std::string api_key = options.api_key;

    auto state = std::make_shared<serve_run_state>();
    task_group serve_task(executor, "bench serve host");
    serve_task.spawn(run_serve_task(b, std::move(options), state));
    const auto started_by = clock_type::now() + start_budget;
    while (!state->has_finished && state->envd_url.empty() && clock_type::now() < started_by) {
        co_await pause(std::chrono::milliseconds(5));
    }

    if (!state->envd_url.empty() && !state->api_url.empty()) {
        runtime sandboxes(b, bench_runtime_options(o.n, 1));
        http::client client(executor);
        const api_target target{&client, state->api_url, state->envd_url, api_key};
        for (std::size_t i = 0; i < warmup_iterations; ++i) {
            co_await serve_iteration(target, r, false);
            co_await library_iteration(sandboxes, r, false);
        }
        const bool interactive = ::isatty(STDERR_FILENO) != 0;
        for (std::size_t i = 0; i < o.n; ++i) {
            // Alternate which goes first, so neither always runs on a freshly warmed cache.
            if (i % 2 == 0) {
                co_await serve_iteration(target, r, true);
                co_await library_iteration(sandboxes, r, true);
            } else {
                co_await library_iteration(sandboxes, r, true);
                co_await serve_iteration(target, r, true);
            }
            if (interactive && ((i + 1) % 25 == 0 || i + 1 == o.n))
                std::fprintf(stderr, "\rmoat bench serve: %zu/%zu", i + 1, o.n);
        }
        if (interactive) std::fprintf(stderr, "\n");
    } else if (r->why.empty()) {
        r->why = "the serve host did not start";
        for (const auto& p : state->problems) r->why += ": " + p;
    }

    serve_task.cancel_all();
    const auto stopped_by = clock_type::now() + stop_budget;
    while (!state->has_finished && clock_type::now() < stopped_by) {
        co_await pause(std::chrono::milliseconds(5));
    }
    if (state->has_finished) co_await serve_task.async_wait_all();
    r->serve_code = state->code;
    if (!state->has_finished && r->why.empty()) r->why = "the serve host did not stop in time";

    // Nothing left behind: none of the ids the API returned is still known to the backend.
    const label_filter everything;
    auto listed = co_await b.async_list(everything);
    if (!listed) {
        if (r->why.empty()) r->why = "listing the backend: " + listed.error().to_string();
        r->left_behind = r->created_ids.size();
    } else {
        for (const auto& info : *listed) r->left_behind += r->created_ids.count(info.id);
    }
    co_return 0;
}

std::string ratio(double a, double b) {
    if (a <= 0 || b <= 0) return "n/a";
    char text[32];
    std::snprintf(text, sizeof text, "%.2fx", a / b);
    return text;
}

std::string ratio_line(const char* what, const latency_samples& serve,
                       const latency_samples& library, const char* target) {
    std::string line = std::string("serve ") + what + " / library " + what + ": p50 " +
                       ratio(serve.percentile(0.5), library.percentile(0.5)) + ", p99 " +
                       ratio(serve.percentile(0.99), library.percentile(0.99));
    if (target != nullptr) line += std::string(" (target: ") + target + ")";
    return line + "\n";
}

}  // namespace

int bench_serve(int argc, char** argv) {
    serve_bench_options o;
    parse_flags(argc, argv,
                {count_flag("--n", o.n, 1, 100'000), string_flag("--json", o.json_path)});
    scratch_directory scratch("moat-bench-serve");
    const std::string state_dir = scratch.path();
    if (state_dir.empty()) {
        return report_error("bench serve",
                            make_error(errc::backend_failure,
                                       "cannot make a temporary state directory under /tmp"));
    }
    serve_bench_results r;
    const int code = run_with_backend(
        [&o, &state_dir, &r](backend& b) { return run_serve_bench(b, o, state_dir, &r); });
    if (code != 0) return code;

    std::string out;
    char line[256];
    std::snprintf(line, sizeof line,
                  "moat bench serve: %zu iterations of create, a first command (/bin/true) and "
                  "kill, through moat serve's HTTP API (127.0.0.1, keep-alive) and the library, "
                  "interleaved\n",
                  o.n);
    out += line;
    out += summary_header();
    for (const latency_samples* s : {&r.serve_create, &r.library_create, &r.serve_command,
                                     &r.library_command, &r.serve_kill, &r.library_kill}) {
        out += summary_line(*s);
    }
    out += ratio_line("create", r.serve_create, r.library_create, "p50 <= 1.5x");
    out += ratio_line("command", r.serve_command, r.library_command, nullptr);
    out += ratio_line("kill", r.serve_kill, r.library_kill, nullptr);
    std::snprintf(line, sizeof line, "sandboxes left behind: %zu\n", r.left_behind);
    out += line;
    if (!r.why.empty()) out += "first failure: " + r.why + "\n";
    const bool published = publish_report("bench serve", out, o.json_path, [&](json_writer& w) {
        w.key("n").value(static_cast<std::uint64_t>(o.n));
        for (const latency_samples* s : {&r.serve_create, &r.library_create, &r.serve_command,
                                         &r.library_command, &r.serve_kill, &r.library_kill}) {
            w.key(s->name);
            write_summary(w, *s);
        }
        w.key("create_p50_ratio")
            .value(r.library_create.percentile(0.5) > 0
                       ? r.serve_create.percentile(0.5) / r.library_create.percentile(0.5)
                       : 0.0);
        w.key("serve_sandbox_ids").begin_array();
        for (const auto& id : r.created_ids) w.value(id);
        w.end_array();
        w.key("left_behind").value(static_cast<std::uint64_t>(r.left_behind));
        w.key("serve_exit_code").value(r.serve_code);
    });
    const std::size_t failures = r.serve_create.failures + r.serve_command.failures +
                                 r.serve_kill.failures + r.library_create.failures;
    const bool ok =
        published && r.why.empty() && failures == 0 && r.left_behind == 0 && r.serve_code == 0;
    return ok ? 0 : exit_failure;
}

}  // namespace moat::cli
