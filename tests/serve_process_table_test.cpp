// The process table of `moat serve`'s envd process service, over real spawned processes in real
// sandboxes: the bounded output buffer, replay and live output, retained ends, signals, stdin,
// and the table's end with its sandbox.
#include "core/go_signals.hpp"
#include "e2b_protocol/process_messages.hpp"
#include "serve/process_table.hpp"

#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <functional>
#include <string>

namespace {

using moat::serve::process_event;
using moat::serve::process_selector;
using moat::serve::process_table;
using moat::serve::process_table_options;

process_selector by_pid(std::uint32_t pid) {
    process_selector s;
    s.pid = pid;
    return s;
}

moat::process spawn(moat::test::local_fixture& f, const std::string& id,
                    const std::string& command) {
    auto spawned = f.run(f.local->async_spawn(id, moat::test::shell(command)));
    REQUIRE(spawned);
    return std::move(*spawned);
}

std::uint32_t add(process_table& table, moat::process p, std::optional<std::string> tag = {}) {
    moat::serve::process_config config;
    config.cmd = "/bin/sh";
    auto pid = table.add(std::move(p), std::move(config), std::move(tag));
    REQUIRE(pid);
    return *pid;
}

// Runs the fixture's io_context until `condition` holds (bounded: eventually's 20 s).
bool settle(moat::test::local_fixture& f, const std::function<bool()>& condition) {
    return moat::test::eventually(
        [&] {
            f.io.run_for(std::chrono::milliseconds(10));
            if (f.io.stopped()) f.io.restart();
            return condition();
        },
        std::chrono::seconds(20));
}

bool has_ended(const process_table& table, std::uint32_t pid) {
    auto i = table.info(by_pid(pid));
    return i && i->end.has_value();
}

struct drained {
    std::string out;
    std::string err;
    std::optional<moat::serve::process_end> end;
    std::optional<moat::error> failure;
};

// Reads a subscription to its end (or first error).
asio::awaitable<drained> drain(process_table::subscription& sub) {
    drained d;
    for (;;) {
        const auto wake = moat::deadline::never();
        auto next = co_await sub.async_next(wake);
        if (!next) {
            d.failure = next.error();
            co_return d;
        }
        if (next->type == process_event::kind::end) {
            d.end = next->end;
            co_return d;
        }
        if (next->type == process_event::kind::output) {
            if (next->output.channel == moat::output_channel::out) {
                d.out += next->output.data;
            } else {
                d.err += next->output.data;
            }
        }
    }
}

asio::awaitable<moat::result<process_event>> next_within(process_table::subscription& sub,
                                                         std::chrono::milliseconds wake) {
    const auto limit = moat::deadline::after(wake);
    co_return co_await sub.async_next(limit);
}

}  // namespace

TEST_CASE("a process's end carries Go's ProcessState values") {
    moat::exec_result ok;
    auto end = moat::serve::end_from_result(ok);
    CHECK(end.exit_code == 0);
    CHECK(end.exited);
    CHECK(end.status == "exit status 0");
    CHECK_FALSE(end.error.has_value());

    moat::exec_result three;
    three.exit_code = 3;
    end = moat::serve::end_from_result(three);
    CHECK(end.exit_code == 3);
    CHECK(end.status == "exit status 3");
    CHECK(end.error == "exit status 3");

    moat::exec_result killed;
    killed.signal = SIGKILL;
    killed.exit_code = 128 + SIGKILL;
    end = moat::serve::end_from_result(killed);
    CHECK(end.exit_code == -1);
    CHECK_FALSE(end.exited);
    CHECK(end.status == "signal: killed");
    CHECK(end.error == "signal: killed");

    moat::exec_result timed_out;
    timed_out.timed_out = true;
    timed_out.signal = SIGKILL;
    timed_out.exit_code = 124;
    end = moat::serve::end_from_result(timed_out);
    CHECK(end.timed_out);
    CHECK(end.status == "signal: killed");
    CHECK(moat::detail::go_signal_name(SIGTERM) == "terminated");
    CHECK(moat::detail::go_signal_name(SIGSEGV) == "segmentation fault");
    CHECK(moat::detail::go_signal_name(40) == "signal 40");
    // What serve writes, the e2b backend reads back.
    for (int n = 1; n <= 64; ++n)
        CHECK(moat::detail::signal_from_go_name(moat::detail::go_signal_name(n)) == n);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a process nobody reads runs to its end, and its buffer keeps the newest output "
                  "up to its cap and counts what it dropped") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    process_table_options options;
    options.output_buffer_bytes = 64 * 1024;
    process_table table(io.get_executor(), options);
    // 1 MiB with nobody reading: if the table pushed back, the pipe would fill and this would
    // never end.
    const auto pid =
        add(table, spawn(*this, box.id, "head -c 1048576 /dev/zero | tr '\\0' a; echo; echo LAST"));
    REQUIRE(settle(*this, [&] { return has_ended(table, pid); }));
    const auto info = table.info(by_pid(pid));
    REQUIRE(info);
    // The newest output, up to the cap (each chunk also costs a little bookkeeping).
    CHECK(info->buffered_bytes <= options.output_buffer_bytes);
    CHECK(info->buffered_bytes > options.output_buffer_bytes / 2);
    CHECK(info->dropped_bytes + info->buffered_bytes == 1048576 + 1 + 5);
    CHECK(table.list().empty());  // finished: no longer listed

    auto sub = table.subscribe(by_pid(pid));
    REQUIRE(sub);
    const auto d = run(drain(*sub));
    CHECK(d.out.size() == info->buffered_bytes);
    CHECK(d.out.ends_with("aaa\nLAST\n"));
    REQUIRE(d.end);
    CHECK(d.end->status == "exit status 0");
    run(table.async_shutdown());
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "the process tables of a server hold at most their shared output budget "
                  "together, each process keeping its minimum share") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    auto budget = std::make_shared<moat::serve::output_budget>();
    budget->capacity_bytes = 256 * 1024;
    budget->min_share_bytes = 16 * 1024;
    process_table_options options;
    options.output_buffer_bytes = 1024 * 1024;  // each alone would keep a whole MiB
    options.budget = budget;
    const std::size_t bound = budget->capacity_bytes + 2 * budget->min_share_bytes;
    {
        process_table first(io.get_executor(), options);
        process_table second(io.get_executor(), options);
        const auto a = add(first, spawn(*this, box.id, "head -c 1048576 /dev/zero | tr '\\0' a"));
        REQUIRE(settle(*this, [&] { return has_ended(first, a); }));
        const auto b = add(second, spawn(*this, box.id, "head -c 1048576 /dev/zero | tr '\\0' b"));
        REQUIRE(settle(*this, [&] { return has_ended(second, b); }));
        const auto held_a = first.info(by_pid(a))->buffered_bytes;
        const auto held_b = second.info(by_pid(b))->buffered_bytes;
        CAPTURE(held_a);
        CAPTURE(held_b);
        CHECK(held_a + held_b <= bound);
        CHECK(budget->used_bytes <= bound);
        CHECK(held_b >= budget->min_share_bytes / 2);  // the later one is not starved
        // What was cut is counted as dropped, as from a full buffer.
        CHECK(first.info(by_pid(a))->dropped_bytes + held_a == 1048576);
        CHECK(second.info(by_pid(b))->dropped_bytes + held_b == 1048576);
        run(first.async_shutdown());
        run(second.async_shutdown());
    }
    // Gone with the tables.
    CHECK(budget->used_bytes == 0);
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "an attached subscription gets every byte of a process that prints many times "
                  "its buffer, in order") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    process_table_options options;
    options.output_buffer_bytes = 64 * 1024;
    process_table table(io.get_executor(), options);
    const auto pid = add(table, spawn(*this, box.id, "seq 1 200000"));
    auto sub = table.subscribe(by_pid(pid));
    REQUIRE(sub);
    const auto d = run(drain(*sub));
    std::string expected;
    for (int i = 1; i <= 200000; ++i) expected += std::to_string(i) + "\n";
    CHECK(d.out.size() == expected.size());
    CHECK(d.out == expected);
    REQUIRE(d.end);
    CHECK(d.end->exit_code == 0);
    CHECK(table.info(by_pid(pid))->dropped_bytes == 0);
    run(table.async_shutdown());
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a subscription replays what arrived while nobody listened, then follows live "
                  "output and stdin, and a late one replays the buffered output and the end") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    process_table table(io.get_executor());
    const auto pid = add(table, spawn(*this, box.id, "echo one; read line; echo \"got $line\" >&2"),
                         std::string("job"));
    REQUIRE(settle(*this, [&] {
        auto i = table.info(by_pid(pid));
        return i && i->buffered_bytes == 4;
    }));
    const auto listed = table.list();
    REQUIRE(listed.size() == 1);
    CHECK(listed[0].pid == pid);
    CHECK(listed[0].tag == "job");

    process_selector tagged;
    tagged.tag = "job";
    auto sub = table.subscribe(tagged);
    REQUIRE(sub);
    CHECK(sub->pid() == pid);
    auto first = run(next_within(*sub, std::chrono::seconds(10)));
    REQUIRE(first);
    REQUIRE(first->type == process_event::kind::output);
    CHECK(first->output.data == "one\n");
    CHECK(table.info(by_pid(pid))->buffered_bytes == 4);  // read, and still kept for a replay

    // Nothing more until the process gets its line: the wait ends idle (a keepalive's turn).
    auto quiet = run(next_within(*sub, std::chrono::milliseconds(50)));
    REQUIRE(quiet);
    CHECK(quiet->type == process_event::kind::idle);

    auto wrote = run(table.async_write_stdin(by_pid(pid), "x\n",
                                             moat::deadline::after(std::chrono::seconds(10))));
    REQUIRE(wrote);
    const auto rest = run(drain(*sub));
    CHECK(rest.err == "got x\n");
    REQUIRE(rest.end);
    CHECK(rest.end->exit_code == 0);

    auto late = table.subscribe(by_pid(pid));
    REQUIRE(late);
    const auto replay = run(drain(*late));
    CHECK(replay.out == "one\n");
    CHECK(replay.err == "got x\n");
    REQUIRE(replay.end);
    CHECK(replay.end->status == "exit status 0");
    run(table.async_shutdown());
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "retained ends are bounded in number and in age, and unknown pids are not "
                  "found with envd's message") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    auto now = std::chrono::steady_clock::now();
    process_table_options options;
    options.max_retained_ends = 2;
    options.retained_end_age = std::chrono::seconds(30);
    options.clock = [&] { return now; };
    process_table table(io.get_executor(), options);
    std::vector<std::uint32_t> pids;
    for (int i = 0; i < 3; ++i) {
        pids.push_back(add(table, spawn(*this, box.id, "exit " + std::to_string(i))));
        REQUIRE(settle(*this, [&] { return has_ended(table, pids.back()); }));
        now += std::chrono::seconds(10);
    }
    // The oldest of three went for the count.
    auto oldest = table.subscribe(by_pid(pids[0]));
    REQUIRE_FALSE(oldest);
    CHECK(oldest.error().code == moat::errc::file_not_found);
    CHECK(oldest.error().detail == "process with pid " + std::to_string(pids[0]) + " not found");
    auto second = table.subscribe(by_pid(pids[1]));
    REQUIRE(second);
    const auto d = run(drain(*second));
    REQUIRE(d.end);
    CHECK(d.end->exit_code == 1);
    CHECK(d.end->error == "exit status 1");
    // The second ended 20 s ago and the third 10 s ago: 15 s later only the third is left.
    now += std::chrono::seconds(15);
    CHECK_FALSE(table.info(by_pid(pids[1])));
    CHECK(table.info(by_pid(pids[2])));
    // A finished process takes no signal (envd: not found), and neither does an unknown one.
    auto signalled = run(table.async_signal(by_pid(pids[2]), SIGKILL));
    REQUIRE_FALSE(signalled);
    CHECK(signalled.error().code == moat::errc::file_not_found);
    process_selector unknown_tag;
    unknown_tag.tag = "nope";
    auto unknown = table.subscribe(unknown_tag);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().detail == "process with tag nope not found");
    run(table.async_shutdown());
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "a killed process ends with signal: killed, and the table refuses a process "
                  "past its cap") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    process_table_options options;
    options.max_processes = 1;
    process_table table(io.get_executor(), options);
    const auto pid = add(table, spawn(*this, box.id, "exec sleep 4343"));
    CHECK(moat::test::eventually(
        [&] { return moat::test::find_descendant(*box.host_pid, "sleep 4343") > 0; }));
    auto full = table.check_capacity();
    REQUIRE_FALSE(full);
    CHECK(full.error().code == moat::errc::limit_exceeded);

    auto sub = table.subscribe(by_pid(pid));
    REQUIRE(sub);
    auto killed = run(table.async_signal(by_pid(pid), SIGKILL));
    REQUIRE(killed);
    const auto d = run(drain(*sub));
    REQUIRE(d.end);
    CHECK(d.end->exit_code == -1);
    CHECK_FALSE(d.end->exited);
    CHECK(d.end->status == "signal: killed");
    CHECK(d.end->error == "signal: killed");
    CHECK(table.check_capacity());
    CHECK(moat::test::find_descendant(*box.host_pid, "sleep 4343") < 0);
    run(table.async_shutdown());
}

TEST_CASE_FIXTURE(moat::test::local_fixture,
                  "closing the table ends its live subscriptions at once and kills its "
                  "processes") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    process_table table(io.get_executor());
    const auto pid = add(table, spawn(*this, box.id, "exec sleep 4444"));
    CHECK(moat::test::eventually(
        [&] { return moat::test::find_descendant(*box.host_pid, "sleep 4444") > 0; }));
    auto sub = table.subscribe(by_pid(pid));
    REQUIRE(sub);
    table.close("the sandbox was killed");
    const auto d = run(drain(*sub));
    REQUIRE(d.failure);
    CHECK(d.failure->code == moat::errc::sandbox_unavailable);
    CHECK(d.failure->detail == "the sandbox was killed");
    CHECK(table.list().empty());
    CHECK_FALSE(table.check_capacity());
    run(table.async_shutdown());
    CHECK(moat::test::eventually(
        [&] { return moat::test::find_descendant(*box.host_pid, "sleep 4444") < 0; }));
}

TEST_CASE("envd process requests parse as proto3 JSON, and bad ones name the field") {
    auto start = moat::e2b_protocol::parse_start_request(
        R"({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},)"
        R"("cwd":null},"stdin":false,"tag":"t","unknown":1})");
    REQUIRE(start);
    CHECK(start->process.cmd == "/bin/bash");
    CHECK(start->process.args.size() == 3);
    CHECK(start->process.envs.at("A") == "1");
    CHECK(start->process.cwd.empty());
    CHECK_FALSE(start->stdin_open);
    CHECK(start->tag == "t");
    CHECK_FALSE(start->has_pty);
    auto legacy = moat::e2b_protocol::parse_start_request(R"({"process":{"cmd":"ls"},"pty":{}})");
    REQUIRE(legacy);
    CHECK(legacy->stdin_open);  // absent means true
    CHECK(legacy->has_pty);

    auto no_cmd = moat::e2b_protocol::parse_start_request(R"({"process":{"args":[]}})");
    REQUIRE_FALSE(no_cmd);
    CHECK(no_cmd.error().code == moat::errc::invalid_argument);
    CHECK(no_cmd.error().detail == "process.cmd must be a non-empty string");
    auto bad_env =
        moat::e2b_protocol::parse_start_request(R"({"process":{"cmd":"x","envs":{"A":1}}})");
    REQUIRE_FALSE(bad_env);
    CHECK(bad_env.error().detail == "process.envs.A must be a string");
    CHECK_FALSE(moat::e2b_protocol::parse_start_request("[1]"));
    CHECK_FALSE(
        moat::e2b_protocol::parse_start_request(R"({"process":{"cmd":"x","envs":{"A=B":"1"}}})"));

    auto by_string_pid = moat::e2b_protocol::parse_selector_request(R"({"process":{"pid":"42"}})");
    REQUIRE(by_string_pid);
    CHECK(by_string_pid->pid == 42u);
    auto by_tag = moat::e2b_protocol::parse_selector_request(R"({"process":{"tag":"job"}})");
    REQUIRE(by_tag);
    CHECK(by_tag->tag == "job");
    CHECK_FALSE(moat::e2b_protocol::parse_selector_request(R"({"process":{}})"));
    CHECK_FALSE(moat::e2b_protocol::parse_selector_request(R"({"process":{"pid":-1}})"));

    auto input = moat::e2b_protocol::parse_send_input_request(
        R"({"process":{"pid":7},"input":{"stdin":"aGkK"}})");
    REQUIRE(input);
    CHECK(input->bytes == "hi\n");
    CHECK_FALSE(input->is_pty);
    auto not_b64 = moat::e2b_protocol::parse_send_input_request(
        R"({"process":{"pid":7},"input":{"stdin":"!"}})");
    REQUIRE_FALSE(not_b64);
    CHECK(not_b64.error().detail == "input.stdin is not base64");

    auto kill = moat::e2b_protocol::parse_send_signal_request(
        R"({"process":{"pid":7},"signal":"SIGNAL_SIGKILL"})");
    REQUIRE(kill);
    CHECK(kill->signal == SIGKILL);
    auto term =
        moat::e2b_protocol::parse_send_signal_request(R"({"process":{"pid":7},"signal":15})");
    REQUIRE(term);
    CHECK(term->signal == SIGTERM);
    auto other =
        moat::e2b_protocol::parse_send_signal_request(R"({"process":{"pid":7},"signal":2})");
    REQUIRE(other);
    CHECK(other->signal == 0);
    CHECK(other->name == "2");
}

TEST_CASE("envd process events are written as the SDK reads them") {
    CHECK(moat::e2b_protocol::encode_start_event(1000) == R"({"event":{"start":{"pid":1000}}})");
    CHECK(moat::e2b_protocol::encode_data_event(moat::output_channel::out, "hi\n") ==
          R"({"event":{"data":{"stdout":"aGkK"}}})");
    CHECK(moat::e2b_protocol::encode_data_event(moat::output_channel::err,
                                                std::string("\0\xff", 2)) ==
          R"({"event":{"data":{"stderr":"AP8="}}})");
    moat::exec_result three;
    three.exit_code = 3;
    CHECK(moat::e2b_protocol::encode_end_event(moat::serve::end_from_result(three)) ==
          R"({"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3",)"
          R"("error":"exit status 3"}}})");
    CHECK(moat::e2b_protocol::encode_end_event(moat::serve::end_from_result(moat::exec_result{})) ==
          R"({"event":{"end":{"exited":true,"status":"exit status 0"}}})");
    moat::exec_result killed;
    killed.signal = SIGKILL;
    CHECK(
        moat::e2b_protocol::encode_end_event(moat::serve::end_from_result(killed)) ==
        R"({"event":{"end":{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}}})");
    moat::serve::process_info info;
    info.pid = 5;
    info.config.cmd = "/bin/bash";
    info.config.args = {"-c", "x"};
    info.tag = "t";
    CHECK(moat::e2b_protocol::encode_list_response({info}) ==
          R"({"processes":[{"config":{"cmd":"/bin/bash","args":["-c","x"],"envs":{}},"pid":5,)"
          R"("tag":"t"}]})");
}
