// `moat serve` under load on loopback, driven by moat's own HTTP client (no SDK): the built binary
// with port 0 listeners, an API key file and a fresh state directory; 200 sandboxes alive at once;
// 500 streaming commands (process.Process/Start) over 200 envd connections, each printing random
// bytes and then, on stderr, how many it wrote and their SHA-256, which the test compares with what
// arrived; serve's RSS sampled throughout and bounded; then every sandbox killed, serve stopped
// with SIGTERM, and nothing of theirs left on the host. Dev build only (ctest label "load").
#include "core/base64.hpp"
#include "e2b_protocol/sandbox_replies.hpp"
#include "http/client.hpp"
#include "http/connect_envelope.hpp"
#include "support/async_test.hpp"
#include "support/async_wait.hpp"
#include "support/build_paths.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"

#include <moat/task_group.hpp>

#include <doctest/doctest.h>
#include <openssl/evp.h>
#include <simdjson.h>

#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t sandbox_count = 200;
constexpr std::size_t command_count = 500;
constexpr std::size_t envd_connections = 200;
constexpr std::size_t create_concurrency = 8;
constexpr std::size_t kill_concurrency = 8;
constexpr std::size_t max_unary_body = 1 << 20;
constexpr std::size_t max_frame = 4 << 20;
constexpr std::size_t max_stderr = 4096;
// Serve's resident set may not pass this at any sample. Why 768 MiB: at most 200 streams are
// attached at once (one per envd connection), and the process table holds each process's output
// up to 1 MiB while a subscription is behind, so the worst legitimate case is about 200 MiB of
// output buffers on top of a baseline of a few tens of MiB (200 sandbox records, their tables,
// the connections' buffers). A leak of even a few KiB per streamed chunk over the ~130 MB this
// test moves would pass it; a buffer held per command (500 x up to 516 KiB) would come close.
constexpr long rss_bound_bytes = 768L * 1024 * 1024;

// The payload size of command i: 4 KiB to 516 KiB, distinct per command.
std::size_t payload_size(std::size_t i) {
    return 4096 + (i * 131071) % (512 * 1024);
}

std::string hex(const unsigned char* bytes, std::size_t n) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (std::size_t i = 0; i < n; ++i) {
        out += digits[bytes[i] >> 4];
        out += digits[bytes[i] & 15];
    }
    return out;
}

// One kB-granular field of /proc/<pid>/status ("VmRSS", "VmHWM") in bytes; 0 if unreadable.
long status_bytes(pid_t pid, const std::string& field) {
    std::istringstream in(moat::test::read_file("/proc/" + std::to_string(pid) + "/status"));
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind(field + ":", 0) == 0) {
            std::istringstream values(line.substr(field.size() + 1));
            long kb = 0;
            values >> kb;
            return kb * 1024;
        }
    }
    return 0;
}

// Established TCP connections on this host whose local port is `port` (the server's side of the
// connections to a listener on that port), from /proc/net/tcp. Counted by peer address: the file
// is not a consistent snapshot, and a socket can appear twice in one read while the table changes.
std::size_t established_on_port(std::uint16_t port) {
    std::istringstream in(moat::test::read_file("/proc/net/tcp"));
    std::string line;
    std::getline(in, line);  // the header
    std::set<std::string> peers;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::string slot, local, remote, state;
        fields >> slot >> local >> remote >> state;
        const auto colon = local.find(':');
        if (colon == std::string::npos || state != "01") continue;
        if (std::stoul(local.substr(colon + 1), nullptr, 16) == port) peers.insert(remote);
    }
    return peers.size();
}

// Field 22 of /proc/<pid>/stat (start time in ticks): a pid and its start time name one process
// even after the pid is reused. 0 once it is gone.
unsigned long long start_time(pid_t pid) {
    const std::string stat = moat::test::read_file("/proc/" + std::to_string(pid) + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) return 0;
    std::istringstream fields(stat.substr(close + 2));
    std::string field;
    for (int i = 3; i <= 22; ++i) {
        if (!(fields >> field)) return 0;
    }
    return std::stoull(field);
}

// Host processes whose cgroup path names one of `ids` (a sandbox's moat/<id> cgroups).
std::vector<pid_t> processes_in_cgroups_of(const std::set<std::string>& ids) {
    std::vector<pid_t> found;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
        const std::string name = entry.path().filename();
        if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
        const pid_t pid = std::stoi(name);
        if (!moat::test::is_running(pid)) continue;
        const std::string cgroups = moat::test::read_file("/proc/" + name + "/cgroup");
        for (const auto& id : ids) {
            if (cgroups.find("/" + id) != std::string::npos) {
                found.push_back(pid);
                break;
            }
        }
    }
    return found;
}

// The `moat serve` child: its pid, the URLs it printed, where its output went.
struct serve_process {
    pid_t pid = -1;
    std::string api_url;
    std::string envd_url;
    std::uint16_t envd_port = 0;
    std::string stderr_path;
};

std::uint16_t port_of(const std::string& url) {
    return static_cast<std::uint16_t>(std::stoul(url.substr(url.rfind(':') + 1)));
}

// Starts the built moat binary's `serve` and waits (at most 30 s) for its two listener lines.
serve_process start_serve(const std::string& work_dir, const std::string& key_file) {
    serve_process s;
    const std::string stdout_path = work_dir + "/serve.out";
    s.stderr_path = work_dir + "/serve.err";
    const std::string state_dir = work_dir + "/state";
    const std::string max_sandboxes = std::to_string(sandbox_count);
    s.pid = ::fork();
    REQUIRE(s.pid >= 0);
    if (s.pid == 0) {
        const int out = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        const int err = ::open(s.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(127);
        ::execl(moat::test::moat_cli_path(), moat::test::moat_cli_path(), "serve", "--listen",
                "127.0.0.1:0", "--envd-listen", "127.0.0.1:0", "--api-key-file", key_file.c_str(),
                "--state-dir", state_dir.c_str(), "--max-sandboxes", max_sandboxes.c_str(),
                nullptr);
        ::_exit(127);
    }
    const auto limit = clock_type::now() + 30s;
    while (clock_type::now() < limit) {
        std::istringstream lines(moat::test::read_file(stdout_path));
        std::string line;
        while (std::getline(lines, line)) {
            if (line.rfind("api ", 0) == 0) s.api_url = line.substr(4);
            if (line.rfind("envd ", 0) == 0) s.envd_url = line.substr(5);
        }
        if (!s.api_url.empty() && !s.envd_url.empty()) break;
        int status = 0;
        if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
            s.pid = -1;
            FAIL("moat serve exited before listening: " << moat::test::read_file(s.stderr_path));
        }
        std::this_thread::sleep_for(20ms);
    }
    if (s.api_url.empty() || s.envd_url.empty()) {
        ::kill(s.pid, SIGKILL);
        ::waitpid(s.pid, nullptr, 0);
        FAIL("moat serve printed no api/envd lines within 30 s: "
             << moat::test::read_file(s.stderr_path));
    }
    s.envd_port = port_of(s.envd_url);
    return s;
}

// SIGTERM, then the exit code within 60 s (SIGKILL and -1 past it).
int stop_serve(pid_t pid) {
    ::kill(pid, SIGTERM);
    const auto limit = clock_type::now() + 60s;
    while (clock_type::now() < limit) {
        int status = 0;
        if (::waitpid(pid, &status, WNOHANG) == pid) {
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        std::this_thread::sleep_for(20ms);
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
}

struct sandbox {
    std::string id;
    std::string token;
};

struct command_outcome {
    std::size_t expected_bytes = 0;
    std::size_t stdout_bytes = 0;
    std::string stdout_sha256;
    std::string stderr_text;  // at most max_stderr bytes
    bool has_start = false;
    bool has_end = false;
    int exit_code = -1;
    std::string failure;  // empty: the stream completed as the protocol says
};

struct rss_figures {
    long before = 0;
    long peak_sampled = 0;
    long hwm = 0;
    long after = 0;
    std::size_t samples = 0;
    std::size_t peak_envd_established = 0;
};

// Everything the coroutines share (one executor, no locks).
struct load_state {
    const serve_process* serve = nullptr;
    std::string api_key;
    moat::http::client* api = nullptr;
    moat::http::client* envd = nullptr;
    std::vector<sandbox> sandboxes;
    std::vector<std::string> create_failures;
    std::size_t next_create = 0;
    std::vector<command_outcome> commands;
    std::vector<std::string> kill_failures;
    std::size_t next_kill = 0;
    rss_figures rss;
    bool is_sampling = true;
    // Host processes below serve seen while sampling, with their start times.
    std::map<pid_t, unsigned long long> seen_processes;
    // What run_load measured; the test case asserts on it (no assertion runs inside a coroutine).
    double create_seconds = 0;
    double command_seconds = 0;
    double kill_seconds = 0;
    std::size_t listed_alive = 0;  // of ours, listed by GET /v2/sandboxes with all 200 alive
    int past_cap_status = 0;       // of a 201st create
    std::size_t commands_ok = 0;
    std::size_t stdout_bytes = 0;
    std::string first_command_problem;
    std::size_t listed_after_kills = 0;
};

asio::awaitable<moat::result<sandbox>> create_sandbox(load_state* s) {
    moat::http::request r;
    r.method = "POST";
    r.url = s->serve->api_url + "/v2/sandboxes";
    r.headers.add("X-API-Key", s->api_key);
    r.headers.add("Content-Type", "application/json");
    r.body = R"({"templateID":"base","timeout":900})";
    r.limit = moat::deadline::after(120s);
    auto fetched = co_await s->api->async_fetch(std::move(r), max_unary_body);
    if (!fetched) co_return std::move(fetched).error();
    if (fetched->status() != 201) {
        co_return moat::make_error(
            moat::errc::backend_failure,
            "POST /v2/sandboxes: HTTP " + std::to_string(fetched->status()) + ": " + fetched->body);
    }
    auto parsed = moat::e2b_protocol::parse_sandbox_reply(fetched->body);
    if (!parsed || parsed->envd_access_token.empty()) {
        co_return moat::make_error(moat::errc::protocol_error,
                                   "POST /v2/sandboxes: no sandboxID and envdAccessToken");
    }
    sandbox box;
    box.id = std::move(parsed->sandbox_id);
    box.token = std::move(parsed->envd_access_token);
    co_return box;
}

asio::awaitable<void> create_worker(load_state* s) {
    while (s->next_create < sandbox_count) {
        ++s->next_create;
        auto created = co_await create_sandbox(s);
        if (created) {
            s->sandboxes.push_back(*created);
        } else {
            s->create_failures.push_back(created.error().to_string());
        }
    }
}

// The status of one more create while `sandbox_count` are alive (--max-sandboxes).
asio::awaitable<int> create_past_cap_status(load_state* s) {
    moat::http::request r;
    r.method = "POST";
    r.url = s->serve->api_url + "/v2/sandboxes";
    r.headers.add("X-API-Key", s->api_key);
    r.headers.add("Content-Type", "application/json");
    r.body = R"({"templateID":"base","timeout":60})";
    r.limit = moat::deadline::after(60s);
    auto fetched = co_await s->api->async_fetch(std::move(r), max_unary_body);
    if (!fetched) co_return -1;
    co_return fetched->status();
}

// The running sandboxes GET /v2/sandboxes lists, page by page (at most 10 pages of 100).
asio::awaitable<std::set<std::string>> listed_sandboxes(load_state* s) {
    std::set<std::string> ids;
    std::string next_token;
    for (int page = 0; page < 10; ++page) {
        moat::http::request r;
        r.url = s->serve->api_url + "/v2/sandboxes?limit=100";
        if (!next_token.empty()) r.url += "&nextToken=" + next_token;
        r.headers.add("X-API-Key", s->api_key);
        r.limit = moat::deadline::after(60s);
        auto fetched = co_await s->api->async_fetch(std::move(r), max_unary_body);
        if (!fetched || fetched->status() != 200) break;
        simdjson::dom::parser parser;
        const simdjson::padded_string padded(fetched->body);
        simdjson::dom::array items;
        if (parser.parse(padded).get(items) != simdjson::SUCCESS) break;
        for (auto item : items) {
            std::string_view id;
            if (item["sandboxID"].get_string().get(id) == simdjson::SUCCESS) ids.emplace(id);
        }
        const auto token = fetched->head.headers.find("X-Next-Token");
        if (!token || token->empty()) break;
        next_token = std::string(*token);
    }
    co_return ids;
}

// Feeds one decoded event into the outcome; false (with outcome.failure) for a malformed one.
bool take_event(simdjson::dom::parser& parser, const std::string& payload, command_outcome& o,
                EVP_MD_CTX* digest) {
    const simdjson::padded_string padded(payload);
    simdjson::dom::element doc;
    simdjson::dom::element event;
    if (parser.parse(padded).get(doc) != simdjson::SUCCESS ||
        doc["event"].get(event) != simdjson::SUCCESS) {
        o.failure = "an event that is not {\"event\":{...}}: " + payload.substr(0, 200);
        return false;
    }
    simdjson::dom::element part;
    if (event["start"].get(part) == simdjson::SUCCESS) {
        o.has_start = true;
    } else if (event["data"].get(part) == simdjson::SUCCESS) {
        std::string_view text;
        const bool is_stdout = part["stdout"].get_string().get(text) == simdjson::SUCCESS;
        if (!is_stdout && part["stderr"].get_string().get(text) != simdjson::SUCCESS) {
            o.failure = "a data event with neither stdout nor stderr";
            return false;
        }
        auto bytes = moat::base64_decode(text);
        if (!bytes) {
            o.failure = "a data event whose bytes are not base64";
            return false;
        }
        if (is_stdout) {
            o.stdout_bytes += bytes->size();
            EVP_DigestUpdate(digest, bytes->data(), bytes->size());
        } else {
            o.stderr_text +=
                bytes->substr(0, max_stderr - std::min(max_stderr, o.stderr_text.size()));
        }
    } else if (event["end"].get(part) == simdjson::SUCCESS) {
        if (o.has_end) {
            o.failure = "a second end event";
            return false;
        }
        o.has_end = true;
        std::int64_t code = 0;
        if (part["exitCode"].get_int64().get(code) != simdjson::SUCCESS) code = 0;
        o.exit_code = static_cast<int>(code);
    }
    return true;
}

// Command i: process.Process/Start in sandbox i % sandbox_count, its stream read to the end.
asio::awaitable<void> run_command(load_state* s, std::size_t i) {
    command_outcome& o = s->commands[i];
    o.expected_bytes = payload_size(i);
    const sandbox& box = s->sandboxes[i % s->sandboxes.size()];
    const std::string size = std::to_string(o.expected_bytes);
    // Random bytes into a file, the file to stdout, then its size and hash to stderr: what the
    // command says it wrote, measured inside the sandbox.
    const std::string script =
        "f=$(mktemp -p \"$HOME\") && head -c " + size +
        " /dev/urandom > \"$f\" && cat \"$f\" && echo \"wrote $(wc -c < "
        "\"$f\") $(sha256sum < \"$f\" | cut -d' ' -f1)\" >&2 && rm -f \"$f\"";
    std::string json = R"({"process":{"cmd":"/bin/sh","args":["-c",")";
    for (char c : script) {
        if (c == '"' || c == '\\') json += '\\';
        json += c;
    }
    json += R"("]}})";
    moat::http::request r;
    r.method = "POST";
    r.url = s->serve->envd_url + "/process.Process/Start";
    r.headers.add("Content-Type", "application/connect+json");
    r.headers.add("E2b-Sandbox-Id", box.id);
    r.headers.add("X-Access-Token", box.token);
    r.body = moat::http::connect::encode_envelope(0, json);
    // Includes the wait for one of the 200 pooled connections.
    r.limit = moat::deadline::after(600s);
    auto sent = co_await s->envd->async_send(std::move(r));
    if (!sent) {
        o.failure = "Start: " + sent.error().to_string();
        co_return;
    }
    if (sent->status() != 200) {
        o.failure = "Start: HTTP " + std::to_string(sent->status());
        co_return;
    }
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> digest(EVP_MD_CTX_new(),
                                                                   &EVP_MD_CTX_free);
    EVP_DigestInit_ex(digest.get(), EVP_sha256(), nullptr);
    moat::http::connect::envelope_decoder decoder(max_frame);
    std::vector<moat::http::connect::envelope> frames;
    simdjson::dom::parser parser;
    for (;;) {
        auto piece = co_await sent->async_read_some();
        if (!piece) {
            o.failure = "reading the stream: " + piece.error().to_string();
            co_return;
        }
        if (piece->empty()) break;
        frames.clear();
        if (auto fed = decoder.feed(*piece, frames); !fed) {
            o.failure = "framing: " + fed.error().to_string();
            co_return;
        }
        for (const auto& frame : frames) {
            if (frame.is_end_stream()) {
                auto end = moat::http::connect::parse_end_stream(frame.payload);
                if (!end) {
                    o.failure = "end-stream: " + end.error().to_string();
                    co_return;
                }
                if (end->error) {
                    o.failure = "end-stream error: " +
                                moat::http::connect::to_error(*end->error).to_string();
                    co_return;
                }
                continue;
            }
            if (!take_event(parser, frame.payload, o, digest.get())) co_return;
        }
    }
    if (auto finished = decoder.finish(); !finished) {
        o.failure = "framing at the end: " + finished.error().to_string();
        co_return;
    }
    unsigned char sum[EVP_MAX_MD_SIZE];
    unsigned int sum_size = 0;
    EVP_DigestFinal_ex(digest.get(), sum, &sum_size);
    o.stdout_sha256 = hex(sum, sum_size);
}

asio::awaitable<void> kill_worker(load_state* s) {
    while (s->next_kill < s->sandboxes.size()) {
        const std::string id = s->sandboxes[s->next_kill++].id;
        moat::http::request r;
        r.method = "DELETE";
        r.url = s->serve->api_url + "/sandboxes/" + id;
        r.headers.add("X-API-Key", s->api_key);
        r.limit = moat::deadline::after(120s);
        auto fetched = co_await s->api->async_fetch(std::move(r), max_unary_body);
        if (!fetched) {
            s->kill_failures.push_back(id + ": " + fetched.error().to_string());
        } else if (fetched->status() != 204) {
            s->kill_failures.push_back(id + ": HTTP " + std::to_string(fetched->status()));
        }
    }
}

// Every 100 ms until told to stop: serve's VmRSS and VmHWM, the server side's established envd
// connections and (every 500 ms) the host processes below serve.
asio::awaitable<void> sample(load_state* s) {
    for (std::size_t tick = 0; s->is_sampling; ++tick) {
        const long rss = status_bytes(s->serve->pid, "VmRSS");
        s->rss.peak_sampled = std::max(s->rss.peak_sampled, rss);
        s->rss.hwm = std::max(s->rss.hwm, status_bytes(s->serve->pid, "VmHWM"));
        ++s->rss.samples;
        s->rss.peak_envd_established =
            std::max(s->rss.peak_envd_established, established_on_port(s->serve->envd_port));
        if (tick % 5 == 0) {
            for (pid_t p : moat::test::descendants(s->serve->pid)) {
                if (!s->seen_processes.count(p)) s->seen_processes[p] = start_time(p);
            }
        }
        co_await moat::test::pause(100ms);
    }
}

double seconds_since(clock_type::time_point t) {
    return std::chrono::duration<double>(clock_type::now() - t).count();
}

asio::awaitable<void> run_load(load_state* s) {
    const auto executor = co_await asio::this_coro::executor;
    moat::task_group sampler(executor, "load test sampler");
    s->rss.before = status_bytes(s->serve->pid, "VmRSS");
    sampler.spawn(sample(s));

    // 200 sandboxes, 8 creates at a time.
    const auto create_start = clock_type::now();
    {
        moat::task_group creators(executor, "load test creates");
        for (std::size_t w = 0; w < create_concurrency; ++w) creators.spawn(create_worker(s));
        co_await creators.async_wait_all();
    }
    s->create_seconds = seconds_since(create_start);

    if (s->create_failures.empty()) {
        // All 200 alive at once: listed by the server, and one more is refused (--max-sandboxes).
        const auto listed = co_await listed_sandboxes(s);
        for (const auto& box : s->sandboxes) s->listed_alive += listed.count(box.id);
        s->past_cap_status = co_await create_past_cap_status(s);

        // 500 streaming commands at once over at most 200 envd connections.
        s->commands.resize(command_count);
        const auto command_start = clock_type::now();
        {
            moat::task_group commands(executor, "load test commands");
            for (std::size_t i = 0; i < command_count; ++i) commands.spawn(run_command(s, i));
            co_await commands.async_wait_all();
        }
        s->command_seconds = seconds_since(command_start);
    }

    // Kill every sandbox created, 8 at a time.
    const auto kill_start = clock_type::now();
    {
        moat::task_group killers(executor, "load test kills");
        for (std::size_t w = 0; w < kill_concurrency; ++w) killers.spawn(kill_worker(s));
        co_await killers.async_wait_all();
    }
    s->kill_seconds = seconds_since(kill_start);
    const auto listed_after = co_await listed_sandboxes(s);
    for (const auto& box : s->sandboxes) s->listed_after_kills += listed_after.count(box.id);

    s->rss.after = status_bytes(s->serve->pid, "VmRSS");
    s->is_sampling = false;
    co_await sampler.async_wait_all();
}

// Accounts for every command: start and end events, exit 0, and the bytes that arrived (count and
// SHA-256) equal to what the command said on stderr it wrote.
void account_commands(load_state& s) {
    for (std::size_t i = 0; i < s.commands.size(); ++i) {
        const command_outcome& o = s.commands[i];
        s.stdout_bytes += o.stdout_bytes;
        std::string problem = o.failure;
        const std::string arrived =
            "wrote " + std::to_string(o.expected_bytes) + " " + o.stdout_sha256 + "\n";
        if (problem.empty() && (!o.has_start || !o.has_end)) problem = "no start or no end event";
        if (problem.empty() && o.exit_code != 0) {
            problem = "exit code " + std::to_string(o.exit_code) + ", stderr: " + o.stderr_text;
        }
        if (problem.empty() && o.stdout_bytes != o.expected_bytes) {
            problem = std::to_string(o.stdout_bytes) + " bytes arrived of " +
                      std::to_string(o.expected_bytes);
        }
        if (problem.empty() && o.stderr_text != arrived) {
            problem =
                "the command said '" + o.stderr_text + "', what arrived was '" + arrived + "'";
        }
        if (problem.empty()) {
            ++s.commands_ok;
        } else if (s.first_command_problem.empty()) {
            s.first_command_problem = "command " + std::to_string(i) + ": " + problem;
        }
    }
}

// Whatever happens to the test case (a failed REQUIRE, the watchdog), serve is stopped and the
// sandboxes it created are destroyed: they survive their owner, and would otherwise hold the host
// for their whole 15 min timeout.
struct cleanup_guard {
    const serve_process* serve = nullptr;
    const load_state* state = nullptr;
    bool is_serve_reaped = false;
    std::string work_dir;
    ~cleanup_guard() {
        if (serve != nullptr && serve->pid > 0 && !is_serve_reaped) {
            ::kill(serve->pid, SIGKILL);
            ::waitpid(serve->pid, nullptr, 0);
        }
        if (state != nullptr && !state->sandboxes.empty()) {
            // Ids already gone make `moat destroy` report them; nothing here is asserted.
            std::string ids;
            for (const auto& box : state->sandboxes) ids += " " + box.id;
            const std::string command =
                std::string(moat::test::moat_cli_path()) + " destroy" + ids + " > /dev/null 2>&1";
            [[maybe_unused]] const int ignored = std::system(command.c_str());
        }
        std::error_code removed;
        if (!work_dir.empty()) std::filesystem::remove_all(work_dir, removed);
    }
};

}  // namespace

TEST_CASE(
    "moat serve holds 200 sandboxes and 500 streamed commands over 200 connections, every byte "
    "accounted for, its RSS bounded, nothing left after") {
    MOAT_REQUIRE_NAMESPACES();
    const auto wall_start = clock_type::now();
    char dir_template[] = "/tmp/moat-serve-load-XXXXXX";
    REQUIRE(::mkdtemp(dir_template) != nullptr);
    // Declared before the guard, so they outlive its destructor.
    serve_process serve;
    load_state state;
    cleanup_guard guard;
    guard.work_dir = dir_template;
    guard.serve = &serve;
    guard.state = &state;
    const std::string key_file = guard.work_dir + "/api-key";
    std::random_device device;
    std::string key = "e2b_";
    for (int i = 0; i < 40; ++i) key += "0123456789abcdef"[device() % 16];
    {
        std::ofstream out(key_file);
        out << key << "\n";
    }
    ::chmod(key_file.c_str(), 0600);

    serve = start_serve(guard.work_dir, key_file);
    state.serve = &serve;
    state.api_key = key;
    std::uint64_t envd_connections_opened = 0;
    {
        asio::io_context io;
        moat::http::client api(io.get_executor());
        moat::http::client_options envd_options;
        envd_options.max_connections_per_origin = envd_connections;
        moat::http::client envd(io.get_executor(), envd_options);
        state.api = &api;
        state.envd = &envd;
        moat::test::run_async(io, run_load(&state), std::chrono::seconds(780));
        envd_connections_opened = envd.connections_opened();
    }
    const int code = stop_serve(serve.pid);
    guard.is_serve_reaped = true;
    const double wall_seconds = seconds_since(wall_start);
    account_commands(state);

    const double mib = 1024.0 * 1024.0;
    MESSAGE("sandboxes: " << state.sandboxes.size() << " created in " << state.create_seconds
                          << " s (" << create_concurrency << " at a time), " << state.listed_alive
                          << " listed alive at once, a 201st create answered "
                          << state.past_cap_status);
    MESSAGE("commands: " << command_count << " in " << state.command_seconds << " s, "
                         << state.commands_ok << " with every byte and its SHA-256 matching, "
                         << state.stdout_bytes << " stdout bytes; envd connections opened by the "
                         << "client " << envd_connections_opened
                         << ", peak established on the server's side "
                         << state.rss.peak_envd_established);
    MESSAGE("serve RSS: before " << state.rss.before / mib << " MiB, peak sampled "
                                 << state.rss.peak_sampled / mib << " MiB (VmHWM "
                                 << state.rss.hwm / mib << " MiB, " << state.rss.samples
                                 << " samples), after the kills " << state.rss.after / mib
                                 << " MiB; kills " << state.kill_seconds << " s; wall time "
                                 << wall_seconds << " s");

    const std::string first_create_failure =
        state.create_failures.empty() ? std::string() : state.create_failures.front();
    CHECK_MESSAGE(state.create_failures.empty(), first_create_failure);
    CHECK(state.sandboxes.size() == sandbox_count);
    CHECK(state.listed_alive == sandbox_count);
    CHECK(state.past_cap_status == 429);
    CHECK_MESSAGE(state.commands_ok == command_count, state.first_command_problem);
    CHECK(state.stdout_bytes > 0);
    CHECK(envd_connections_opened == envd_connections);
    CHECK(state.rss.peak_envd_established <= envd_connections);
    const std::string first_kill_failure =
        state.kill_failures.empty() ? std::string() : state.kill_failures.front();
    CHECK_MESSAGE(state.kill_failures.empty(), first_kill_failure);
    CHECK(state.listed_after_kills == 0);
    CHECK(code == 0);
    if (code != 0) MESSAGE("serve's stderr: " << moat::test::read_file(serve.stderr_path));
    CHECK(state.rss.hwm > 0);
    CHECK(state.rss.hwm <= rss_bound_bytes);

    // Nothing left: no process seen below serve is still running (same pid and start time), and
    // no host process sits in one of the sandboxes' cgroups.
    std::vector<pid_t> left;
    const bool is_clean = moat::test::eventually(
        [&] {
            left.clear();
            for (const auto& [pid, started] : state.seen_processes) {
                if (moat::test::is_running(pid) && start_time(pid) == started) left.push_back(pid);
            }
            return left.empty();
        },
        std::chrono::seconds(10));
    std::string left_example;
    if (!left.empty()) {
        left_example =
            "pid " + std::to_string(left.front()) + ": " + moat::test::command_line(left.front());
    }
    MESSAGE(state.seen_processes.size() << " host processes seen below serve during the run");
    CHECK_MESSAGE(is_clean, left.size() << " still running, e.g. " << left_example);
    std::set<std::string> ids;
    for (const auto& box : state.sandboxes) ids.insert(box.id);
    const std::size_t in_cgroups = processes_in_cgroups_of(ids).size();
    CHECK_MESSAGE(in_cgroups == 0, in_cgroups << " host processes in the sandboxes' cgroups");
}
