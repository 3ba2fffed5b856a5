// The envd client (src/e2b/envd_client.hpp) against a real `moat serve` this file starts (the
// built binary, ports 0, an API key file, a fresh state directory): commands, streams, limits,
// cancellation, spawn, files. Sandboxes are made by POSTing /v2/sandboxes with moat's HTTP
// client, as the e2b backend does; processes left behind are looked for on this host, below the
// server's pid. The pure parsers (src/e2b_protocol) are tested on bytes first.
#include "core/base64.hpp"
#include "core/go_signals.hpp"
#include "e2b/envd_client.hpp"
#include "e2b_protocol/error_body.hpp"
#include "e2b_protocol/filesystem_messages.hpp"
#include "e2b_protocol/process_messages.hpp"

#include <moat/backend.hpp>
#include <moat/log.hpp>
#include <moat/task_group.hpp>
#include <moat/with_timeout.hpp>

#include "http/client.hpp"
#include "http/connect_envelope.hpp"
#include "support/async_test.hpp"
#include "support/host_inspect.hpp"
#include "support/loopback_peer.hpp"
#include "support/serve_api.hpp"
#include "support/serve_process.hpp"
#include "support/tcp_fault_proxy.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/parallel_group.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>
#include <simdjson.h>

#include <sys/socket.h>
#include <unistd.h>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

namespace moat::test {
namespace {

using namespace std::chrono_literals;
using e2b::envd_client;

// One `moat serve` for this file's tests (support/serve_process.hpp), started on first use.
serve_process& shared_serve() {
    static serve_process serve;
    return serve;
}

using sandbox_ref = serve_sandbox;

asio::awaitable<sandbox_ref> create_sandbox(http::client& client, const serve_process& serve) {
    auto made = co_await async_create_serve_sandbox(client, serve);
    REQUIRE_MESSAGE(made, made.error().to_string());
    co_return std::move(*made);
}

asio::awaitable<void> destroy_sandbox(http::client& client, const serve_process& serve,
                                      std::string id) {
    http::request request;
    request.method = "DELETE";
    request.url = serve.api_url() + "/sandboxes/" + id;
    request.headers.add("X-API-Key", serve.api_key());
    request.limit = deadline::after(60s);
    auto reply = co_await client.async_fetch(std::move(request), 1 << 20);
    CHECK(reply);
}

// One sandbox and an envd client for it, for one test.
struct envd_fixture {
    asio::io_context io;
    std::shared_ptr<http::client> http = std::make_shared<http::client>(io.get_executor());
    serve_process& serve = shared_serve();
    sandbox_ref sandbox;
    std::unique_ptr<envd_client> client;

    explicit envd_fixture(e2b::envd_options options = {}) {
        sandbox = run_async(io, create_sandbox(*http, serve));
        client = make_client(options);
    }
    ~envd_fixture() {
        client.reset();
        run_async(io, destroy_sandbox(*http, serve, sandbox.id));
    }
    std::unique_ptr<envd_client> make_client(e2b::envd_options options,
                                             std::string token_override = {},
                                             std::string envd_url = {}) {
        e2b::envd_endpoint endpoint;
        endpoint.base_url = envd_url.empty() ? serve.envd_url() : envd_url;
        endpoint.sandbox_id = sandbox.id;
        endpoint.access_token = token_override.empty() ? sandbox.token : token_override;
        return std::make_unique<envd_client>(http, endpoint, options);
    }
};

exec_request command(std::string shell) {
    exec_request r;
    r.shell = std::move(shell);
    r.wall_limit = 30s;
    return r;
}

asio::awaitable<result<exec_result>> run(envd_client& client, exec_request request) {
    const auto limits = request.output;
    auto stream = co_await client.async_exec_stream(std::move(request));
    if (!stream) co_return std::move(stream).error();
    co_return co_await async_collect(std::move(*stream), limits);
}

// Waits `delay`, then emits terminal cancellation to `op` and returns its result.
template <class T>
asio::awaitable<result<T>> cancel_after(asio::awaitable<result<T>> op,
                                        std::chrono::milliseconds delay) {
    auto executor = co_await asio::this_coro::executor;
    asio::steady_timer timer(executor, delay);
    auto task = asio::co_spawn(executor, std::move(op), asio::experimental::deferred);
    auto wait = timer.async_wait(asio::experimental::deferred);
    auto group = asio::experimental::make_parallel_group(std::move(task), std::move(wait));
    auto outcome =
        co_await group.async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
    auto& [order, failure, value, timer_error] = outcome;
    (void)order;
    (void)timer_error;
    if (failure) std::rethrow_exception(failure);
    co_return std::move(value);
}

// A command line in one of the server's sandboxes contains `needle`.
bool host_runs(const serve_process& serve, const std::string& needle) {
    return !serve.sandbox_processes_matching(needle).empty();
}

}  // namespace

// --- the parsers, on bytes ---

TEST_CASE("envd responses: process events parse, garbage is a protocol_error") {
    auto start = e2b_protocol::parse_process_event(R"({"event":{"start":{"pid":1000}}})");
    REQUIRE(start);
    CHECK(std::get<e2b_protocol::start_event>(*start).pid == 1000);
    auto data = e2b_protocol::parse_process_event(R"({"event":{"data":{"stderr":"aGkK"}},"x":1})");
    REQUIRE(data);
    CHECK(std::get<e2b_protocol::data_event>(*data).channel == output_channel::err);
    CHECK(std::get<e2b_protocol::data_event>(*data).bytes == "hi\n");
    auto end = e2b_protocol::parse_process_event(
        R"({"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}})");
    REQUIRE(end);
    CHECK(std::get<e2b_protocol::end_event>(*end).exit_code == 3);
    auto keepalive = e2b_protocol::parse_process_event(R"({"event":{"keepalive":{}}})");
    REQUIRE(keepalive);
    CHECK(std::holds_alternative<e2b_protocol::keepalive_event>(*keepalive));
    for (std::string_view garbage :
         {"", "{", "[]", R"({"event":{}})", R"({"event":{"start":{"pid":"x"}}})",
          R"({"event":{"data":{"stdout":"!!"}}})", R"({"event":{"data":{"pty":"aGkK"}}})",
          R"({"event":{"end":{"exitCode":"3.5"}}})", "\xff\xfe"}) {
        auto parsed = e2b_protocol::parse_process_event(garbage);
        REQUIRE_FALSE(parsed);
        CHECK(parsed.error().code == errc::protocol_error);
    }
}

TEST_CASE("envd responses: Go's ProcessState becomes moat's exit code and signal") {
    e2b_protocol::end_event exited{3, true, "exit status 3", "exit status 3"};
    auto r = e2b_protocol::result_from_end(exited);
    CHECK(r.exit_code == 3);
    CHECK(r.signal == 0);
    e2b_protocol::end_event killed{-1, false, "signal: killed", "signal: killed"};
    r = e2b_protocol::result_from_end(killed);
    CHECK(r.signal == SIGKILL);
    CHECK(r.exit_code == 128 + SIGKILL);
    e2b_protocol::end_event segv{-1, false, "signal: segmentation fault (core dumped)", ""};
    CHECK(e2b_protocol::result_from_end(segv).signal == SIGSEGV);
    CHECK(moat::detail::signal_from_go_name("terminated") == SIGTERM);
    CHECK(moat::detail::signal_from_go_name("signal 40") == 40);
    CHECK(moat::detail::signal_from_go_name("nonsense") == 0);
}

TEST_CASE("envd responses: entries, listings and base64 round trips") {
    auto entry = e2b_protocol::parse_entry_response(
        R"({"entry":{"name":"a","type":"FILE_TYPE_FILE","path":"/home/user/a","size":"12","mode":420}})");
    REQUIRE(entry);
    CHECK(entry->type == file_type::regular);
    CHECK(entry->size == 12);
    CHECK(entry->mode == 0644);
    auto dir = e2b_protocol::parse_entry_response(
        R"({"entry":{"name":"d","type":"FILE_TYPE_DIRECTORY","path":"/d","mode":2147484141}})");
    REQUIRE(dir);
    CHECK(dir->type == file_type::directory);
    CHECK(dir->mode == 0755);
    auto listing = e2b_protocol::parse_list_dir_response(
        R"({"entries":[{"name":"a","path":"/a"},{"name":"b","path":"/b"},{"name":"c","path":"/c"}]})",
        2);
    REQUIRE_FALSE(listing);
    CHECK(listing.error().code == errc::too_large);
    CHECK_FALSE(e2b_protocol::parse_entry_response(R"({"entry":{"size":"-1"}})"));
    CHECK_FALSE(e2b_protocol::parse_entry_response(R"({})"));
    auto list =
        e2b_protocol::parse_list_response(R"({"processes":[{"pid":7,"tag":"t","config":{}}]})");
    REQUIRE(list);
    REQUIRE(list->size() == 1);
    CHECK((*list)[0].pid == 7);
    CHECK((*list)[0].tag == "t");
    std::string every;
    for (int i = 0; i < 256; ++i) every.push_back(static_cast<char>(i));
    for (std::size_t n = 0; n < 5; ++n) {
        const auto text = every.substr(0, n) + every;
        CHECK(moat::base64_decode(moat::base64_encode(text)) == text);
    }
    CHECK_FALSE(moat::base64_decode("a"));
    CHECK(e2b_protocol::parse_envd_error_message(
              R"({"code":404,"message":"path '/x' does not exist"})") ==
          "path '/x' does not exist");
    CHECK(e2b_protocol::parse_envd_error_message("<html>") == "");
}

// --- commands against moat serve ---

TEST_CASE(
    "envd client: exit codes, stdout, stderr, env, cwd and stdin come back as the local backend "
    "reports them") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto r = co_await run(*f.client, command("echo out; echo err >&2; exit 3"));
        REQUIRE(r);
        CHECK(r->exit_code == 3);
        CHECK(r->signal == 0);
        CHECK_FALSE(r->timed_out);
        CHECK(r->out.text() == "out\n");
        CHECK(r->err.text() == "err\n");

        auto killed = co_await run(*f.client, command("kill -TERM $$"));
        REQUIRE(killed);
        CHECK(killed->signal == SIGTERM);
        CHECK(killed->exit_code == 128 + SIGTERM);

        exec_request request;
        request.argv = {"sh", "-c", "pwd; echo \"$FOO\"; cat"};
        request.env["FOO"] = "bar baz";
        request.cwd = "/tmp";
        request.stdin_data = "from stdin";
        auto ran = co_await run(*f.client, std::move(request));
        REQUIRE(ran);
        CHECK(ran->exit_code == 0);
        CHECK(ran->out.text() == "/tmp\nbar baz\nfrom stdin");

        auto missing = co_await run(*f.client, command("exit 0"));
        REQUIRE(missing);
        CHECK(missing->exit_code == 0);

        exec_request bad_cwd = command("true");
        bad_cwd.cwd = "/no/such/dir";
        auto refused = co_await run(*f.client, std::move(bad_cwd));
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == errc::invalid_argument);
    }());
}

TEST_CASE("envd client: output past the caps keeps head and tail and counts the rest") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        exec_request request = command("head -c 3000000 /dev/zero | tr '\\0' a; echo -n END");
        request.output.head_bytes = 1000;
        request.output.tail_bytes = 1000;
        auto r = co_await run(*f.client, std::move(request));
        REQUIRE(r);
        CHECK(r->out.total_bytes == 3000003);
        CHECK(r->out.is_truncated());
        CHECK(r->out.head == std::string(1000, 'a'));
        CHECK(r->out.tail.size() == 1000);
        CHECK(r->out.tail.ends_with("aEND"));
        CHECK(r->out.omitted_bytes == 3000003 - 2000);
    }());
}

TEST_CASE(
    "envd client: a command past its wall limit ends as 124, timed_out, with no process left on "
    "the host") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        exec_request request = command("sleep 987001");
        request.wall_limit = 1500ms;
        auto r = co_await run(*f.client, std::move(request));
        REQUIRE(r);
        CHECK(r->timed_out);
        CHECK(r->exit_code == 124);
        CHECK(r->signal == SIGKILL);
        CHECK_FALSE(host_runs(f.serve, "sleep 987001"));
    }());
}

TEST_CASE("envd client: output streams in chunks before the command ends") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto stream =
            co_await f.client->async_exec_stream(command("echo first; exec sleep 987002.5"));
        REQUIRE(stream);
        auto first = co_await stream->async_next();
        REQUIRE(first);
        REQUIRE(std::holds_alternative<output_chunk>(*first));
        CHECK(std::get<output_chunk>(*first).data == "first\n");
        // The command is still running: the chunk came before its end.
        CHECK(host_runs(f.serve, "sleep 987002.5"));
    }());
    // Dropping the stream killed it; async_kill_all waits for that kill.
    run_async(f.io, f.client->async_kill_all());
    CHECK_FALSE(host_runs(f.serve, "sleep 987002.5"));
}

TEST_CASE(
    "envd client: cancelling or timing out an exec at several points leaves no process on the "
    "host") {
    envd_fixture f;
    for (const auto delay : {0ms, 50ms, 300ms, 1000ms}) {
        CAPTURE(delay.count());
        const std::string marker = "sleep 98700" + std::to_string(3 + delay.count() % 7) + "." +
                                   std::to_string(delay.count());
        run_async(f.io, [&]() -> asio::awaitable<void> {
            auto stream = co_await f.client->async_exec_stream(command("exec " + marker));
            REQUIRE(stream);
            auto next = stream->async_next();
            auto r = co_await cancel_after(std::move(next), delay);
            REQUIRE_FALSE(r);
            CHECK(r.error().code == errc::cancelled);
            CHECK_FALSE(host_runs(f.serve, marker));
            // The stream is finished.
            auto again = co_await stream->async_next();
            REQUIRE_FALSE(again);
            CHECK(again.error().code == errc::invalid_argument);
        }());
        run_async(f.io, [&]() -> asio::awaitable<void> {
            auto stream = co_await f.client->async_exec_stream(command("exec " + marker));
            REQUIRE(stream);
            auto next = stream->async_next();
            auto r = co_await with_timeout(std::move(next), deadline::after(delay));
            REQUIRE_FALSE(r);
            CHECK(r.error().code == errc::deadline_exceeded);
            CHECK_FALSE(host_runs(f.serve, marker));
        }());
    }
    // A deadline while the Start itself is in flight: the client waits for envd's answer, then
    // kills the command by its tag and confirms it gone before completing.
    for (const auto delay : {1ms, 5ms, 20ms, 60ms}) {
        CAPTURE(delay.count());
        run_async(f.io, [&]() -> asio::awaitable<void> {
            auto start = f.client->async_exec_stream(command("exec sleep 987020"));
            auto r = co_await with_timeout(std::move(start), deadline::after(delay));
            if (!r) {
                CHECK(r.error().code == errc::deadline_exceeded);
                CHECK_FALSE(host_runs(f.serve, "sleep 987020"));
            }
            // Otherwise it started in time; dropping the stream kills it.
        }());
        run_async(f.io, f.client->async_kill_all());
        CHECK_FALSE(host_runs(f.serve, "sleep 987020"));
    }
}

TEST_CASE("envd client: spawn takes stdin, reports its output and is signalled") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        exec_request cat;
        cat.argv = {"cat"};
        cat.wall_limit = 60s;
        auto p = co_await f.client->async_spawn(std::move(cat));
        REQUIRE(p);
        CHECK(p->id() != 0);
        auto written = co_await p->async_write_stdin("abc\n");
        REQUIRE(written);
        auto echoed = co_await p->async_next();
        REQUIRE(echoed);
        REQUIRE(std::holds_alternative<output_chunk>(*echoed));
        CHECK(std::get<output_chunk>(*echoed).data == "abc\n");
        auto closed = co_await p->async_close_stdin();
        REQUIRE(closed);
        auto end = co_await p->async_next();
        REQUIRE(end);
        REQUIRE(std::holds_alternative<exec_result>(*end));
        CHECK(std::get<exec_result>(*end).exit_code == 0);

        exec_request sleeper;
        sleeper.argv = {"sleep", "987010"};
        auto s = co_await f.client->async_spawn(std::move(sleeper));
        REQUIRE(s);
        auto unsupported = co_await s->async_signal(SIGUSR1);
        REQUIRE_FALSE(unsupported);
        CHECK(unsupported.error().code == errc::not_supported);
        auto term = co_await s->async_signal(SIGTERM);
        REQUIRE(term);
        auto ended = co_await s->async_next();
        REQUIRE(ended);
        REQUIRE(std::holds_alternative<exec_result>(*ended));
        CHECK(std::get<exec_result>(*ended).signal == SIGTERM);
        CHECK(std::get<exec_result>(*ended).exit_code == 128 + SIGTERM);

        exec_request other;
        other.argv = {"sleep", "987011"};
        auto o = co_await f.client->async_spawn(std::move(other));
        REQUIRE(o);
        auto killed = co_await f.client->async_signal(o->id(), SIGKILL);
        REQUIRE(killed);
        auto done = co_await o->async_next();
        REQUIRE(done);
        REQUIRE(std::holds_alternative<exec_result>(*done));
        CHECK(std::get<exec_result>(*done).signal == SIGKILL);
        auto gone = co_await f.client->async_signal(o->id(), SIGKILL);
        REQUIRE_FALSE(gone);
        CHECK(gone.error().code == errc::invalid_argument);
    }());
    CHECK_FALSE(host_runs(f.serve, "sleep 98701"));
}

TEST_CASE(
    "envd client: a frame over the client's cap is a protocol_error and the command is killed") {
    e2b::envd_options options;
    options.max_frame_bytes = 256;
    envd_fixture f(options);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto stream = co_await f.client->async_exec_stream(
            command("head -c 4096 /dev/zero | tr '\\0' x; exec sleep 987012"));
        REQUIRE(stream);
        result<std::variant<output_chunk, exec_result>> next =
            std::variant<output_chunk, exec_result>(output_chunk{});
        do {
            next = co_await stream->async_next();
        } while (next && std::holds_alternative<output_chunk>(*next));
        REQUIRE_FALSE(next);
        CHECK(next.error().code == errc::protocol_error);
        CHECK_FALSE(host_runs(f.serve, "sleep 987012"));
    }());
}

// --- files ---

TEST_CASE("envd client: 256 KiB of every byte value round-trips, with its mode") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        std::string content;
        for (int i = 0; i < 256 * 1024; ++i) content.push_back(static_cast<char>(i % 256));
        std::vector<file_write> files(2);
        files[0].path = "/home/user/bytes.bin";
        files[0].content = content;
        files[1].path = "/home/user/run.sh";
        files[1].content = "#!/bin/sh\necho ran\n";
        files[1].mode = 0755;
        auto written = co_await f.client->async_write_files(files);
        REQUIRE(written);
        REQUIRE(written->size() == 2);
        CHECK((*written)[0].outcome);
        CHECK((*written)[1].outcome);
        std::vector<std::string> paths = {"/home/user/bytes.bin", "/home/user/run.sh"};
        auto read = co_await f.client->async_read_files(paths);
        REQUIRE(read);
        REQUIRE((*read)[0].content);
        CHECK(*(*read)[0].content == content);
        auto st = co_await f.client->async_stat("/home/user/run.sh");
        REQUIRE(st);
        CHECK(st->mode == 0755);
        auto ran = co_await run(*f.client, command("/home/user/run.sh"));
        REQUIRE(ran);
        CHECK(ran->out.text() == "ran\n");
        // No temporary file is left beside them.
        auto listing = co_await f.client->async_list_dir("/home/user");
        REQUIRE(listing);
        for (const auto& e : *listing) CHECK_FALSE(e.name.starts_with(".moat-upload"));
    }());
}

namespace {
struct pattern_source {
    std::uint64_t total;
    std::shared_ptr<std::uint64_t> sent;
};
asio::awaitable<result<std::string>> next_pattern(pattern_source s) {
    constexpr std::size_t chunk = 1024 * 1024;
    if (*s.sent >= s.total) co_return std::string();
    std::string out(static_cast<std::size_t>(std::min<std::uint64_t>(chunk, s.total - *s.sent)),
                    '\0');
    for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = static_cast<char>((*s.sent + i) * 7 % 251);
    *s.sent += out.size();
    co_return out;
}
}  // namespace

// How much this process's RSS may grow while 20 MiB stream through it. ASan's quarantine keeps
// freed memory (every chunk) resident, so there the bound is the dev build's alone.
#if defined(__SANITIZE_ADDRESS__)
constexpr long rss_growth_bound = 1L << 40;
#else
constexpr long rss_growth_bound = 12L << 20;
#endif

TEST_CASE("envd client: 20 MiB streams in and out in bounded memory") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        constexpr std::uint64_t total = 20 * 1024 * 1024;
        pattern_source source{total, std::make_shared<std::uint64_t>(0)};
        byte_source pull = [source]() { return next_pattern(source); };
        const long before = resident_bytes();
        file_write_target target;
        target.path = "/home/user/big.bin";
        auto written = co_await f.client->async_write_file_stream(target, pull);
        REQUIRE(written);
        CHECK(written->outcome);
        auto stream = co_await f.client->async_read_file_stream("/home/user/big.bin");
        REQUIRE(stream);
        CHECK(stream->stat().size == total);
        std::uint64_t at = 0;
        bool same = true;
        std::size_t largest = 0;
        for (;;) {
            auto chunk = co_await stream->async_next();
            REQUIRE(chunk);
            if (chunk->empty()) break;
            largest = std::max(largest, chunk->size());
            for (std::size_t i = 0; i < chunk->size() && same; ++i)
                same = (*chunk)[i] == static_cast<char>((at + i) * 7 % 251);
            at += chunk->size();
        }
        CHECK(same);
        CHECK(at == total);
        CHECK(largest <= file_stream_chunk_bytes);
        const long grown = resident_bytes() - before;
        MESSAGE("resident growth over the 20 MiB round trip: " << grown / 1024 << " KiB");
        CHECK(grown < rss_growth_bound);
    }());
}

namespace {
// The first call yields a few bytes, the second waits (for a cancellation) for a minute.
asio::awaitable<result<std::string>> stalling_source(std::shared_ptr<int> calls) {
    if ((*calls)++ == 0) co_return std::string(4096, 's');
    auto executor = co_await asio::this_coro::executor;
    asio::steady_timer timer(executor, 60s);
    auto [ec] = co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (ec) co_return make_error(errc::cancelled, "the source was cancelled");
    co_return std::string();
}
}  // namespace

TEST_CASE(
    "envd client: a cancelled streamed write leaves neither the target nor a temporary file") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto calls = std::make_shared<int>(0);
        byte_source source = [calls]() { return stalling_source(calls); };
        file_write_target target;
        target.path = "/tmp/cancelled.bin";
        auto write = f.client->async_write_file_stream(target, source);
        auto r = co_await cancel_after(std::move(write), 300ms);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == errc::cancelled);
        CHECK(*calls == 2);
        auto listing = co_await f.client->async_list_dir("/tmp");
        REQUIRE(listing);
        for (const auto& e : *listing) {
            CHECK(e.name != "cancelled.bin");
            CHECK_FALSE(e.name.starts_with(".moat-upload"));
        }
    }());
}

TEST_CASE(
    "envd client: a symlink to a host path is resolved inside the sandbox, never on the host") {
    envd_fixture f;
    const std::string host_file = "/tmp/moat-envd-host-secret-" + std::to_string(::getpid());
    {
        std::ofstream out(host_file);
        out << "HOST SECRET";
    }
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto made = co_await run(
            *f.client, command("ln -s " + host_file + " /home/user/escape && ln -s ../../.." +
                               host_file + " /home/user/relative"));
        REQUIRE(made);
        REQUIRE(made->exit_code == 0);
        std::vector<std::string> paths = {"/home/user/escape", "/home/user/relative",
                                          "/home/user/../../.." + host_file};
        auto read = co_await f.client->async_read_files(paths);
        REQUIRE(read);
        for (const auto& r : *read) {
            CAPTURE(r.path);
            REQUIRE_FALSE(r.content);
            CHECK(r.content.error().code == errc::file_not_found);
        }
        std::vector<file_write> writes(1);
        writes[0].path = "/home/user/escape";
        writes[0].content = "overwritten";
        auto written = co_await f.client->async_write_files(writes);
        REQUIRE(written);
        // The link itself was replaced (files.hpp), the host file never touched.
        CHECK((*written)[0].outcome);
        auto st = co_await f.client->async_stat("/home/user/escape");
        REQUIRE(st);
        CHECK(st->type == file_type::regular);
    }());
    CHECK(read_file(host_file) == "HOST SECRET");
    std::filesystem::remove(host_file);
}

TEST_CASE("envd client: missing paths, directories and bad paths get moat's per-path errors") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        std::vector<std::string> paths = {"/home/user/nope", "/home/user", "relative/path", ""};
        auto read = co_await f.client->async_read_files(paths);
        REQUIRE(read);
        REQUIRE(read->size() == 4);
        CHECK((*read)[0].content.error().code == errc::file_not_found);
        CHECK((*read)[0].content.error().detail.find("/home/user/nope") != std::string::npos);
        CHECK((*read)[1].content.error().code == errc::is_directory);
        CHECK((*read)[2].content.error().code == errc::invalid_path);
        CHECK((*read)[3].content.error().code == errc::invalid_path);

        std::vector<file_write> writes(3);
        writes[0].path = "/home/user/no/such/dir/file";
        writes[1].path = "/home/user";
        writes[2].path = "/usr/moat-not-writable";
        auto written = co_await f.client->async_write_files(writes);
        REQUIRE(written);
        CHECK((*written)[0].outcome.error().code == errc::file_not_found);
        CHECK((*written)[1].outcome.error().code == errc::is_directory);
        CHECK((*written)[2].outcome.error().code == errc::permission_denied);
        auto missing = co_await f.client->async_stat("/home/user/nope");
        REQUIRE_FALSE(missing);
        CHECK(missing.error().code == errc::file_not_found);
        auto no_dir = co_await f.client->async_list_dir("/home/user/nope");
        REQUIRE_FALSE(no_dir);
        CHECK(no_dir.error().code == errc::file_not_found);
        auto plain = co_await run(*f.client, command("echo x > /tmp/plain"));
        REQUIRE(plain);
        auto not_dir = co_await f.client->async_list_dir("/tmp/plain");
        REQUIRE_FALSE(not_dir);
        CHECK(not_dir.error().code == errc::invalid_path);
        // With create_parents, the streamed write makes the directories.
        file_write_target target;
        target.path = "/home/user/made/by/upload.txt";
        target.create_parents = true;
        pattern_source five{5, std::make_shared<std::uint64_t>(0)};
        byte_source once = [five]() { return next_pattern(five); };
        auto made = co_await f.client->async_write_file_stream(target, once);
        REQUIRE(made);
        CHECK(made->outcome);
    }());
}

TEST_CASE("envd client: batch, file, stream and listing limits are enforced") {
    e2b::envd_options options;
    options.files.max_files = 3;
    options.files.max_file_bytes = 1000;
    options.files.max_batch_bytes = 2500;
    options.files.max_dir_entries = 5;
    envd_fixture f(options);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        std::vector<file_write> four(4);
        for (std::size_t i = 0; i < four.size(); ++i) four[i].path = "/tmp/f" + std::to_string(i);
        auto too_many = co_await f.client->async_write_files(four);
        REQUIRE_FALSE(too_many);
        CHECK(too_many.error().code == errc::too_large);

        std::vector<file_write> big(3);
        for (std::size_t i = 0; i < big.size(); ++i) {
            big[i].path = "/tmp/b" + std::to_string(i);
            big[i].content = std::string(900, 'b');
        }
        auto over_batch = co_await f.client->async_write_files(big);
        REQUIRE_FALSE(over_batch);
        CHECK(over_batch.error().code == errc::too_large);

        std::vector<file_write> one(1);
        one[0].path = "/tmp/one";
        one[0].content = std::string(1001, 'x');
        auto over_file = co_await f.client->async_write_files(one);
        REQUIRE(over_file);
        CHECK((*over_file)[0].outcome.error().code == errc::too_large);

        auto made = co_await run(*f.client, command("head -c 5000 /dev/zero > /tmp/large"));
        REQUIRE(made);
        std::vector<std::string> large = {"/tmp/large"};
        auto read_large = co_await f.client->async_read_files(large);
        REQUIRE(read_large);
        CHECK((*read_large)[0].content.error().code == errc::too_large);

        file_write_target target;
        target.path = "/tmp/streamed";
        target.max_bytes = 3 * 1024 * 1024;
        pattern_source source{8 * 1024 * 1024, std::make_shared<std::uint64_t>(0)};
        byte_source pull = [source]() { return next_pattern(source); };
        auto capped = co_await f.client->async_write_file_stream(target, pull);
        REQUIRE(capped);
        REQUIRE_FALSE(capped->outcome);
        CHECK(capped->outcome.error().code == errc::too_large);
        auto listing = co_await f.client->async_list_dir("/tmp");
        REQUIRE(listing);
        for (const auto& e : *listing) {
            CHECK(e.name != "streamed");
            CHECK_FALSE(e.name.starts_with(".moat-upload"));
        }

        auto many = co_await run(*f.client,
                                 command("mkdir /tmp/many && cd /tmp/many && touch a b c d e f"));
        REQUIRE(many);
        auto over = co_await f.client->async_list_dir("/tmp/many");
        REQUIRE_FALSE(over);
        CHECK(over.error().code == errc::too_large);
    }());
}

TEST_CASE(
    "envd client: stat and list_dir report types, sizes and modes, sorted, links not followed") {
    envd_fixture f;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto made = co_await run(
            *f.client,
            command("mkdir -p /tmp/d/sub && printf 12345 > /tmp/d/c && touch /tmp/d/a && "
                    "chmod 600 /tmp/d/a && ln -s /tmp/d/sub /tmp/d/b"));
        REQUIRE(made);
        REQUIRE(made->exit_code == 0);
        auto listing = co_await f.client->async_list_dir("/tmp/d");
        REQUIRE(listing);
        REQUIRE(listing->size() == 4);
        CHECK((*listing)[0].name == "a");
        CHECK((*listing)[1].name == "b");
        CHECK((*listing)[1].type == file_type::symlink);
        CHECK((*listing)[2].name == "c");
        CHECK((*listing)[2].type == file_type::regular);
        CHECK((*listing)[2].size == 5);
        CHECK((*listing)[3].name == "sub");
        CHECK((*listing)[3].type == file_type::directory);
        auto a = co_await f.client->async_stat("/tmp/d/a");
        REQUIRE(a);
        CHECK(a->mode == 0600);
        auto b = co_await f.client->async_stat("/tmp/d/b");
        REQUIRE(b);
        CHECK(b->type == file_type::symlink);
        auto sub = co_await f.client->async_stat("/tmp/d/sub");
        REQUIRE(sub);
        CHECK(sub->type == file_type::directory);
    }());
}

TEST_CASE("envd client: the access token never appears in an error detail or a log line") {
    envd_fixture f;
    std::vector<std::string> logged;
    std::mutex mutex;
    set_log_sink([&](const log_record& r) {
        std::lock_guard lock(mutex);
        logged.emplace_back(r.message);
    });
    const std::string wrong = "wrong-token-0123456789-secret";
    auto bad = f.make_client({}, wrong);
    std::vector<std::string> details;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto r = co_await run(*bad, command("true"));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == errc::unauthorized);
        details.push_back(r.error().detail);
        auto st = co_await bad->async_stat("/tmp");
        REQUIRE_FALSE(st);
        details.push_back(st.error().detail);
        std::vector<std::string> paths = {"/tmp/x"};
        auto read = co_await bad->async_read_files(paths);
        if (!read) details.push_back(read.error().detail);
        auto health = co_await bad->async_health();
        if (!health) details.push_back(health.error().detail);
        auto missing = co_await f.client->async_stat("/nope");
        REQUIRE_FALSE(missing);
        details.push_back(missing.error().detail);
        auto signal = co_await f.client->async_signal(999999, SIGKILL);
        REQUIRE_FALSE(signal);
        details.push_back(signal.error().detail);
    }());
    set_log_sink({});
    for (const auto& d : details) {
        CAPTURE(d);
        CHECK(d.find(wrong) == std::string::npos);
        CHECK(d.find(f.sandbox.token) == std::string::npos);
    }
    for (const auto& line : logged) {
        CHECK(line.find(wrong) == std::string::npos);
        CHECK(line.find(f.sandbox.token) == std::string::npos);
    }
}

}  // namespace moat::test

// --- faults between the client and envd, through a TCP proxy on loopback ---

namespace moat::test {

namespace {
// A start event's chunk is at most this long (its pid has at most 6 digits).
constexpr std::size_t start_chunk_bytes = 45;
}  // namespace

TEST_CASE(
    "envd client: a stream cut mid-frame or reset is an error and the command is still killed") {
    envd_fixture f;
    tcp_fault_proxy proxy("127.0.0.1", f.serve.envd_port());
    auto through = f.make_client({}, {}, proxy.url());
    for (const bool reset : {false, true}) {
        CAPTURE(reset);
        if (reset)
            proxy.arm(tcp_fault_proxy::reset_after(start_chunk_bytes + 8, "Process/Start", true));
        else
            proxy.arm(
                tcp_fault_proxy::truncate_after(start_chunk_bytes + 8, "Process/Start", true));
        run_async(f.io, [&]() -> asio::awaitable<void> {
            auto stream = co_await through->async_exec_stream(
                command("head -c 3000 /dev/zero | tr '\\0' y; exec sleep 987030"));
            // A reset can discard what the client had not read yet, the start event included:
            // then Start itself fails, and the command is killed by its tag.
            std::optional<error> failed;
            if (!stream) failed = stream.error();
            while (!failed) {
                auto next = co_await stream->async_next();
                if (!next)
                    failed = next.error();
                else
                    REQUIRE(std::holds_alternative<output_chunk>(*next));
            }
            CAPTURE(failed->detail);
            if (reset)
                CHECK(failed->code == errc::backend_failure);
            else
                CHECK(failed->code == errc::protocol_error);
        }());
        run_async(f.io, through->async_kill_all());
        CHECK_FALSE(host_runs(f.serve, "sleep 987030"));
        CHECK(proxy.fired() >= 1);
    }
}

TEST_CASE(
    "envd client: garbage or an oversized frame before the start event is a protocol_error, and "
    "the command is killed") {
    envd_fixture f;
    tcp_fault_proxy proxy("127.0.0.1", f.serve.envd_port());
    auto through = f.make_client({}, {}, proxy.url());
    const std::string garbage =
        tcp_fault_proxy::chunk(tcp_fault_proxy::envelope_header(0, 5) + "garbg");
    const std::string oversized =
        tcp_fault_proxy::chunk(tcp_fault_proxy::envelope_header(0, 100 * 1024 * 1024) + "{");
    for (const auto& injected : {garbage, oversized}) {
        proxy.arm(tcp_fault_proxy::inject_after(0, injected, "Process/Start", true));
        run_async(f.io, [&]() -> asio::awaitable<void> {
            auto stream = co_await through->async_exec_stream(command("exec sleep 987031"));
            REQUIRE_FALSE(stream);
            CHECK(stream.error().code == errc::protocol_error);
        }());
        run_async(f.io, through->async_kill_all());
        CHECK_FALSE(host_runs(f.serve, "sleep 987031"));
    }
}

TEST_CASE(
    "envd client: a stream that stalls past the wall limit is ended by the client itself, as 124") {
    envd_fixture f;
    tcp_fault_proxy proxy("127.0.0.1", f.serve.envd_port());
    auto through = f.make_client({}, {}, proxy.url());
    // Only the start event gets through; envd's end of the stream at the limit never arrives.
    proxy.arm(tcp_fault_proxy::stall_after(start_chunk_bytes, "Process/Start", true));
    run_async(f.io, [&]() -> asio::awaitable<void> {
        exec_request request = command("exec sleep 987032");
        request.wall_limit = 1500ms;
        auto r = co_await run(*through, std::move(request));
        REQUIRE(r);
        CHECK(r->timed_out);
        CHECK(r->exit_code == 124);
        CHECK_FALSE(host_runs(f.serve, "sleep 987032"));
    }());
    proxy.resume();
}

TEST_CASE(
    "moat serve: a download whose client stopped reading does not hold up a Stat on its "
    "sandbox") {
    envd_fixture f;
    constexpr std::size_t size = 64 * 1024 * 1024;
    std::string path;
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto made = co_await run(*f.client, command("head -c " + std::to_string(size) +
                                                    " /dev/zero > \"$HOME/big\" && "
                                                    "printf %s \"$HOME/big\""));
        REQUIRE(made);
        REQUIRE(made->exit_code == 0);
        path = made->out.head;
    }());
    REQUIRE(path.rfind('/', 0) == 0);
    // A download nobody reads: the server's writes fill both sockets' buffers and block.
    const int fd = connect_loopback(f.serve.envd_port(), std::chrono::seconds(120), 4096);
    const std::string head = "GET /files?path=" + path +
                             " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(f.serve.envd_port()) +
                             "\r\nE2b-Sandbox-Id: " + f.sandbox.id +
                             "\r\nX-Access-Token: " + f.sandbox.token + "\r\n\r\n";
    REQUIRE(::send(fd, head.data(), head.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(head.size()));
    // The response has begun: the file is open and being sent.
    char first[64];
    REQUIRE(::recv(fd, first, sizeof first, MSG_PEEK) > 0);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto st = co_await f.client->async_stat(path);
        if (!st) FAIL("Stat failed: " << st.error().to_string());
        CHECK(st->size == size);
    }());
    // The download was still held open while the Stat ran: read now, it arrives whole (the server
    // drops a client that reads nothing for its write timeout, and the body would end short).
    std::string tail;
    std::size_t received = 0;
    char buffer[1 << 16];
    while (true) {
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        received += static_cast<std::size_t>(n);
        tail.append(buffer, static_cast<std::size_t>(n));
        if (tail.size() > 64) tail.erase(0, tail.size() - 64);
        if (tail.size() >= 5 && tail.compare(tail.size() - 5, 5, "0\r\n\r\n") == 0) break;
    }
    ::close(fd);
    CHECK(received > size);
    REQUIRE(tail.size() >= 7);
    CHECK(tail.substr(tail.size() - 7) == "\r\n0\r\n\r\n");
}

struct listing_outcome {
    std::size_t entries = 0;
    std::string failure;
};

asio::awaitable<void> list_into(envd_client* client, std::string path, listing_outcome* out) {
    auto listed = co_await client->async_list_dir(std::move(path));
    if (listed) {
        out->entries = listed->size();
    } else {
        out->failure = listed.error().to_string();
    }
}

TEST_CASE(
    "moat serve: directory listings across sandboxes run at most 8 at once, server-wide, and "
    "every one completes") {
    asio::io_context io;
    auto http = std::make_shared<http::client>(io.get_executor());
    auto& serve = shared_serve();
    std::vector<sandbox_ref> boxes;
    std::vector<std::unique_ptr<envd_client>> clients;
    for (int i = 0; i < 3; ++i) {
        boxes.push_back(run_async(io, create_sandbox(*http, serve)));
        e2b::envd_endpoint endpoint;
        endpoint.base_url = serve.envd_url();
        endpoint.sandbox_id = boxes.back().id;
        endpoint.access_token = boxes.back().token;
        clients.push_back(std::make_unique<envd_client>(http, endpoint, e2b::envd_options{}));
        run_async(io, [&]() -> asio::awaitable<void> {
            auto made =
                co_await run(*clients.back(), command("mkdir -p /tmp/many && cd /tmp/many && "
                                                      "seq 1 9000 | xargs touch"));
            REQUIRE(made);
            REQUIRE(made->exit_code == 0);
        }());
    }
    // 8 listings in each sandbox at once (each sandbox's side lane runs 8): 24 without a
    // server-wide bound.
    std::vector<listing_outcome> outcomes(24);
    moat::task_group listings(io.get_executor(), "listings");
    for (std::size_t i = 0; i < outcomes.size(); ++i)
        listings.spawn(list_into(clients[i % 3].get(), "/tmp/many", &outcomes[i]));
    std::size_t most = 0;
    std::thread runner([&] { io.run_for(120s); });
    const auto until = std::chrono::steady_clock::now() + 120s;
    auto finished = [&] {
        for (const auto& o : outcomes)
            if (o.entries == 0 && o.failure.empty()) return false;
        return true;
    };
    while (!finished() && std::chrono::steady_clock::now() < until) {
        most = std::max(most, serve.sandbox_processes_matching("-mindepth 1").size());
        std::this_thread::sleep_for(2ms);
    }
    io.stop();
    runner.join();
    io.restart();
    CAPTURE(most);
    CHECK(most >= 1);
    CHECK(most <= 8);
    for (const auto& o : outcomes) {
        CHECK_MESSAGE(o.failure.empty(), o.failure);
        CHECK(o.entries == 9000);
    }
    clients.clear();
    for (const auto& b : boxes) run_async(io, destroy_sandbox(*http, serve, b.id));
}

TEST_CASE("envd client: a stalled envd fails a unary call at request_timeout instead of hanging") {
    envd_fixture f;
    tcp_fault_proxy proxy("127.0.0.1", f.serve.envd_port());
    e2b::envd_options options;
    options.request_timeout = 500ms;
    auto through = f.make_client(options, {}, proxy.url());
    proxy.stall();
    run_async(f.io, [&]() -> asio::awaitable<void> {
        auto st = co_await through->async_stat("/tmp");
        REQUIRE_FALSE(st);
        CHECK(st.error().code == errc::deadline_exceeded);
        CHECK(st.error().detail.find("/tmp") != std::string::npos);
    }());
    proxy.resume();
}

// --- a file that changes between the Stat and the GET ---

// Writes `content` to `path` through `writer` (straight to the server).
asio::awaitable<void> write_text(envd_client* writer, std::string path, std::string content) {
    std::vector<file_write> files(1);
    files[0].path = std::move(path);
    files[0].content = std::move(content);
    auto written = co_await writer->async_write_files(files);
    REQUIRE_MESSAGE(written, written.error().to_string());
    REQUIRE_MESSAGE(written->front().outcome, written->front().outcome.error().to_string());
}

// Once the proxy holds the server's answer to the read's Stat (its fault fired), replaces the file
// and lets the answer through: the GET that follows finds the new file.
asio::awaitable<void> replace_once_stat_held(tcp_fault_proxy* proxy, std::uint64_t fired_before,
                                             envd_client* writer, std::string path,
                                             std::string content) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    while (proxy->fired() == fired_before) {
        timer.expires_after(5ms);
        co_await timer.async_wait(asio::use_awaitable);
    }
    co_await write_text(writer, std::move(path), std::move(content));
    proxy->resume();
}

// Runs `read` (through `proxy`) while the file at `path` is replaced by `content` between its
// Stat and its GET: the race a real envd loses when the sandbox writes the file meanwhile.
template <class T>
asio::awaitable<result<T>> read_while_replaced(asio::awaitable<result<T>> read,
                                               tcp_fault_proxy* proxy, envd_client* writer,
                                               std::string path, std::string content) {
    auto executor = co_await asio::this_coro::executor;
    const auto fired_before = proxy->fired();
    proxy->arm(tcp_fault_proxy::stall_after(0, "Filesystem/Stat"));
    auto reading = asio::co_spawn(executor, std::move(read), asio::experimental::deferred);
    auto replacing =
        asio::co_spawn(executor, replace_once_stat_held(proxy, fired_before, writer, path, content),
                       asio::experimental::deferred);
    auto group = asio::experimental::make_parallel_group(std::move(reading), std::move(replacing));
    auto outcome =
        co_await group.async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
    auto& [order, read_failure, value, replace_failure] = outcome;
    (void)order;
    if (read_failure) std::rethrow_exception(read_failure);
    if (replace_failure) std::rethrow_exception(replace_failure);
    co_return std::move(value);
}

// The fixture's sandbox, also reached through a fault proxy in front of the server's envd.
struct proxied_envd_fixture : envd_fixture {
    tcp_fault_proxy proxy{"127.0.0.1", serve.envd_port()};
    std::unique_ptr<envd_client> through = make_client({}, {}, proxy.url());
};

bool is_changed_error(const error& e, const std::string& path, const std::string& said) {
    return e.code == errc::backend_failure &&
           e.detail.find("file " + path + " changed while it was read (stat said " + said) == 0;
}

TEST_CASE(
    "envd client: a file that grows, shrinks or is replaced between its Stat and its GET fails "
    "the read, never comes back cut to the Stat's size") {
    proxied_envd_fixture f;
    const std::string path = "/home/user/race.txt";
    run_async(f.io, [&]() -> asio::awaitable<void> {
        // Grown: the Stat said 5 bytes, the body has 26.
        co_await write_text(f.client.get(), path, "short");
        std::vector<std::string> paths{path};
        auto grown =
            co_await read_while_replaced(f.through->async_read_files(paths), &f.proxy,
                                         f.client.get(), path, "a much longer replacement!");
        REQUIRE_MESSAGE(grown, grown.error().to_string());
        REQUIRE(grown->size() == 1);
        const auto& grown_content = grown->front().content;
        REQUIRE_MESSAGE(!grown_content, "read as whole: '" << *grown_content << "'");
        CHECK_MESSAGE(is_changed_error(grown_content.error(), path, "5 bytes, the read returned"),
                      grown_content.error().detail);

        // Shrunk: the Stat said 23 bytes, the body ends after 4.
        co_await write_text(f.client.get(), path, "a long original content");
        auto shrunk = co_await read_while_replaced(f.through->async_read_files(paths), &f.proxy,
                                                   f.client.get(), path, "tiny");
        REQUIRE_MESSAGE(shrunk, shrunk.error().to_string());
        const auto& shrunk_content = shrunk->front().content;
        REQUIRE_MESSAGE(!shrunk_content, "read as whole: '" << *shrunk_content << "'");
        CHECK_MESSAGE(
            is_changed_error(shrunk_content.error(), path, "23 bytes, the read returned 4)"),
            shrunk_content.error().detail);

        // The streamed read: no pull completes the file; the pull that would fails.
        co_await write_text(f.client.get(), path, "short");
        auto stream =
            co_await read_while_replaced(f.through->async_read_file_stream(path), &f.proxy,
                                         f.client.get(), path, "a much longer replacement!");
        REQUIRE_MESSAGE(stream, stream.error().to_string());
        CHECK(stream->stat().size == 5);
        std::string delivered;
        result<std::string> pulled = std::string();
        for (int i = 0; i < 10; ++i) {
            pulled = co_await stream->async_next();
            if (!pulled || pulled->empty()) break;
            delivered += *pulled;
        }
        REQUIRE_MESSAGE(!pulled, "the stream ended after '" << delivered << "'");
        CHECK_MESSAGE(is_changed_error(pulled.error(), path, "5 bytes, the read returned"),
                      pulled.error().detail);
        CHECK(delivered.empty());

        // Unchanged, through the same proxy: read whole.
        auto same = co_await f.through->async_read_files(paths);
        REQUIRE(same);
        REQUIRE(same->front().content);
        CHECK(*same->front().content == "a much longer replacement!");
    }());
}

TEST_CASE(
    "envd client: a GET whose Content-Length differs from the Stat's size fails the read before "
    "any byte is handed out") {
    proxied_envd_fixture f;
    const std::string path = "/home/user/length.txt";
    // E2B's envd answers a GET with a Content-Length (moat serve streams it chunked): that of a
    // file replaced after the Stat, standing in for envd.
    const std::string reply =
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 12\r\n"
        "Connection: close\r\n\r\nhello world!";
    run_async(f.io, [&]() -> asio::awaitable<void> {
        co_await write_text(f.client.get(), path, "short");
        f.proxy.arm(tcp_fault_proxy::answer(reply, "GET /files"));
        auto stream = co_await f.through->async_read_file_stream(path);
        REQUIRE_FALSE(stream);
        CHECK_MESSAGE(is_changed_error(stream.error(), path, "5 bytes, the read returned 12)"),
                      stream.error().detail);
        f.proxy.arm(tcp_fault_proxy::answer(reply, "GET /files"));
        std::vector<std::string> paths{path};
        auto batch = co_await f.through->async_read_files(paths);
        REQUIRE(batch);
        REQUIRE_FALSE(batch->front().content);
        CHECK_MESSAGE(is_changed_error(batch->front().content.error(), path,
                                       "5 bytes, the read returned 12)"),
                      batch->front().content.error().detail);
        CHECK(f.proxy.fired() == 2);
    }());
}

// What one streamed Start that runs until its Connect-Timeout-Ms delivered.
struct keepalive_count {
    int status = 0;
    std::size_t frames = 0;
    std::size_t keepalives = 0;
    std::string failure;
};

// Starts `sleep 987040` with `Keepalive-Ping-Interval: <interval>` and a 1500 ms
// Connect-Timeout-Ms (which ends the stream and kills it), and counts the stream's frames.
asio::awaitable<keepalive_count> count_keepalives(http::client& client, const serve_process& serve,
                                                  sandbox_ref sandbox, std::string interval) {
    keepalive_count out;
    http::request r;
    r.method = "POST";
    r.url = serve.envd_url() + "/process.Process/Start";
    r.headers.add("Content-Type", "application/connect+json");
    r.headers.add("E2b-Sandbox-Id", sandbox.id);
    r.headers.add("X-Access-Token", sandbox.token);
    r.headers.add("Keepalive-Ping-Interval", interval);
    r.headers.add("Connect-Timeout-Ms", "1500");
    r.body = http::connect::encode_envelope(
        0, R"({"process":{"cmd":"/bin/sleep","args":["987040"]},"stdin":false})");
    r.limit = deadline::after(60s);
    auto sent = co_await client.async_send(std::move(r));
    if (!sent) {
        out.failure = sent.error().to_string();
        co_return out;
    }
    out.status = sent->status();
    http::connect::envelope_decoder decoder(1 << 20);
    std::vector<http::connect::envelope> frames;
    for (;;) {
        auto piece = co_await sent->async_read_some();
        if (!piece) {
            out.failure = piece.error().to_string();
            co_return out;
        }
        if (piece->empty()) break;
        frames.clear();
        if (auto fed = decoder.feed(*piece, frames); !fed) {
            out.failure = fed.error().to_string();
            co_return out;
        }
        for (const auto& frame : frames) {
            ++out.frames;
            if (frame.payload.find("\"keepalive\"") != std::string::npos) ++out.keepalives;
        }
    }
    co_return out;
}

TEST_CASE(
    "a huge Keepalive-Ping-Interval is clamped: a quiet stream gets no flood of keep-alives") {
    envd_fixture f;
    // Ten digits overflowed the deadline into the past (a keep-alive per loop turn: hundreds of
    // thousands in a second); twenty digits are past any integer. Clamped to an hour, the 1.5 s
    // stream has none; the bound leaves room for one.
    for (const std::string interval : {"9999999999", "99999999999999999999"}) {
        CAPTURE(interval);
        const auto counted =
            run_async(f.io, count_keepalives(*f.http, f.serve, f.sandbox, interval));
        REQUIRE_MESSAGE(counted.failure.empty(), counted.failure);
        CHECK(counted.status == 200);
        CHECK(counted.keepalives <= 1);
        CHECK(counted.frames <= 4);  // start, at most one keep-alive, the end-stream
    }
}

// GET /health on `serve`'s envd with `host` as the Host header and the sandbox's token: the status.
asio::awaitable<int> health_status_as(http::client& client, const serve_process& serve,
                                      sandbox_ref sandbox, std::string host, bool with_id) {
    http::request r;
    r.method = "GET";
    r.url = serve.envd_url() + "/health";
    r.headers.add("Host", host);
    r.headers.add("X-Access-Token", sandbox.token);
    if (with_id) r.headers.add("E2b-Sandbox-Id", sandbox.id);
    r.limit = deadline::after(30s);
    auto reply = co_await client.async_fetch(std::move(r), 1 << 20);
    if (!reply) co_return -1;
    co_return reply->status();
}

TEST_CASE(
    "envd takes a 49983-<id> Host only under the configured --domain (other ports there are the "
    "sandbox's): other names are misdirected (DNS rebinding)") {
    struct ask {
        std::string host;
        bool with_id;
        int status;
    };
    {
        // No --domain: the loopback names only; the SDK names the sandbox in E2b-Sandbox-Id.
        envd_fixture f;
        const std::string port = std::to_string(f.serve.envd_port());
        for (const auto& [host, with_id, status] : std::vector<ask>{
                 {"127.0.0.1:" + port, true, 204},
                 {"localhost", true, 204},
                 {"49983-" + f.sandbox.id + ".evil.example", false, 421},
                 {"49983-" + f.sandbox.id + ".evil.example:" + port, true, 421},
                 {"49983-" + f.sandbox.id + ".moat.local", false, 421},
             }) {
            CAPTURE(host);
            CHECK(run_async(f.io, health_status_as(*f.http, f.serve, f.sandbox, host, with_id)) ==
                  status);
        }
    }
    serve_process_options options;
    options.extra_args = {"--domain", "Sandbox.Test"};
    serve_process serve(options);
    asio::io_context io;
    http::client client(io.get_executor());
    const auto sandbox = run_async(io, create_sandbox(client, serve));
    const std::string port = std::to_string(serve.envd_port());
    const std::string prefix = "49983-" + sandbox.id;
    for (const auto& [host, with_id, status] : std::vector<ask>{
             {prefix + ".sandbox.test", false, 204},
             {prefix + ".SANDBOX.test.:" + port, false, 204},  // case, a trailing dot, a port
             {"localhost:" + port, true, 204},
             {prefix + ".evil.example", false, 421},
             {prefix + ".evil.example", true, 421},
             {prefix + ".sandbox.test.evil.example", false, 421},
             {prefix + ".evil.sandbox.test", false, 421},
             {"49983-.sandbox.test", true, 421},
             {"sandbox.test", true, 421},
             // Another port of the sandbox is the sandbox's port, not envd (docs/serve.md,
             // "Ports"): nothing listens on 3000 there, so E2B's proxy's 502.
             {"3000-" + sandbox.id + ".sandbox.test", true, 502},
             {"3000-" + sandbox.id + ".evil.example", true, 421},
         }) {
        CAPTURE(host);
        CHECK(run_async(io, health_status_as(client, serve, sandbox, host, with_id)) == status);
    }
    // A sandbox that is not this server's, named by a well-formed host: as E2B's proxy, 502.
    CHECK(run_async(io, health_status_as(client, serve, sandbox,
                                         "49983-sb-00000000000000000000.sandbox.test", false)) ==
          502);
    run_async(io, destroy_sandbox(client, serve, sandbox.id));
}

}  // namespace moat::test
