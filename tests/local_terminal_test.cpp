// Terminals in a local sandbox (terminal.hpp): a command on a pseudo-terminal of the sandbox's own
// devpts sees a tty of the requested size and a resize, gets its input (a REPL, ^C as a byte),
// can be reattached by its pid from another backend while it runs, and is killed; the sandbox's
// devpts is its own, and nothing is left behind.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>
#include <moat/terminal.hpp>
#include <moat/with_timeout.hpp>

#include "support/async_wait.hpp"
#include "support/host_sharing.hpp"
#include "support/local_fixture.hpp"

#include <dirent.h>
#include <csignal>
#include <optional>
#include <string>

using moat::test::local_fixture;
using namespace std::chrono_literals;

namespace {

// What a terminal printed so far, and its result once it ended.
struct screen {
    std::string text;
    std::optional<moat::exec_result> end;
    std::optional<moat::error> failure;
};

// Pulls output until `needle` appears after `from` in the text (true), the terminal ends, a pull
// fails or 20 s pass (false).
asio::awaitable<bool> read_until(moat::terminal& t, screen& s, std::string needle,
                                 std::size_t from = 0) {
    const auto limit = moat::deadline::after(20s);
    while (s.text.find(needle, from) == std::string::npos) {
        if (s.end || s.failure) co_return false;
        auto next = co_await moat::with_timeout(t.async_next(), limit);
        if (!next) {
            s.failure = next.error();
            co_return false;
        }
        if (auto* chunk = std::get_if<moat::output_chunk>(&*next)) {
            CHECK(chunk->channel == moat::output_channel::out);
            s.text += chunk->data;
        } else {
            s.end = std::get<moat::exec_result>(*next);
        }
    }
    co_return true;
}

// Pulls until the terminal ends (true) or 20 s pass.
asio::awaitable<bool> read_to_end(moat::terminal& t, screen& s) {
    co_return !co_await read_until(t, s, std::string(1, '\x01') + "never printed") &&
        s.end.has_value();
}

// Types `line` and waits for `expect` to appear in what follows.
asio::awaitable<bool> type(moat::terminal& t, screen& s, std::string line, std::string expect) {
    const std::size_t from = s.text.size();
    auto written = co_await t.async_write(line);
    if (!written) {
        s.failure = written.error();
        co_return false;
    }
    co_return co_await read_until(t, s, expect, from);
}

moat::exec_request shell_request(bool resident = false) {
    moat::exec_request request;
    request.argv = {"/bin/bash", "--norc", "--noprofile", "-i"};
    request.env = {{"PS1", "$ "}};
    request.wall_limit = 120s;
    request.resident = resident;
    return request;
}

// Waits up to 10 s for the sandbox to run `count` processes whose command matches the extended
// regex `names` (anchored).
bool count_within(local_fixture& f, const std::string& id, const std::string& names,
                  const std::string& count) {
    const std::string command = "ps -e -o comm= | grep -c -E '^(" + names + ")$' || true";
    for (int i = 0; i < 200; ++i) {
        if (f.sh(id, command).out.text() == count + "\n") return true;
        f.run(moat::test::pause(50ms));
    }
    return false;
}

// Descriptors this process has open.
int open_descriptors() {
    int count = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d) != nullptr) ++count;
        ::closedir(d);
    }
    return count;
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a terminal command sees a tty of its size, a resize, its input and ^C" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const int descriptors_before = open_descriptors();
    auto opened = run(local->async_open_terminal(box.id, shell_request(), {30, 100}));
    REQUIRE_MESSAGE(opened, opened.error().to_string());
    auto& t = *opened;
    CHECK(t.pid() > 1);
    screen s;
    REQUIRE(run(read_until(t, s, "$ ")));
    // (Expected text the typed line's own echo does not contain.)
    CHECK(run(type(t, s, "test -t 0 && test -t 1 && echo IS-A-$((1+1))\n", "IS-A-2\r\n")));
    CHECK(run(type(t, s, "tty | tr / :\n", ":dev:pts:")));
    CHECK(run(type(t, s, "echo $TERM\n", "xterm-256color\r\n")));
    CHECK(run(type(t, s, "stty size\n", "30 100\r\n")));
    REQUIRE(run(t.async_resize({40, 132})));
    CHECK(run(type(t, s, "stty size\n", "40 132\r\n")));
    // A size out of bounds is refused; the terminal goes on.
    auto too_big = run(t.async_resize({0, 80}));
    REQUIRE_FALSE(too_big);
    CHECK(too_big.error().code == moat::errc::invalid_argument);

    // A REPL gets its lines.
    CHECK(run(type(t, s, "python3 -q\n", ">>> ")));
    CHECK(run(type(t, s, "print(6*7)\n", "42\r\n")));
    CHECK(run(type(t, s, "exit()\n", "$ ")));

    // ^C interrupts the foreground job, not the shell.
    const std::size_t before_sleep = s.text.size();
    REQUIRE(run(t.async_write("sleep 30; echo SLEPT-$((1+1))\n")));
    REQUIRE(run(read_until(t, s, "$((1+1))\r\n", before_sleep)));
    // Once the sleep runs in the foreground.
    REQUIRE(count_within(*this, box.id, "sleep", "1"));
    const std::size_t before_interrupt = s.text.size();
    REQUIRE(run(t.async_write(std::string(1, '\x03'))));
    CHECK(run(read_until(t, s, "$ ", before_interrupt)));
    CHECK(run(type(t, s, "echo STILL-$((1+1))\n", "STILL-2\r\n")));
    CHECK(s.text.find("SLEPT-2") == std::string::npos);

    // exit ends it with its status.
    REQUIRE(run(t.async_write("exit 7\n")));
    REQUIRE(run(read_to_end(t, s)));
    CHECK(s.end->exit_code == 7);
    auto late = run(t.async_write("x"));
    CHECK_FALSE(late);
    opened = moat::make_error(moat::errc::cancelled, "dropped");
    CHECK(open_descriptors() == descriptors_before);
    // Nothing of it runs on.
    CHECK(count_within(*this, box.id, "bash|sleep|python3", "0"));
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "a sandbox's terminals are its own devpts, never the host's" *
                                     moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    // Without a terminal: an empty devpts instance of its own (only ptmx).
    auto listed = sh(box.id, "ls -A /dev/pts; readlink /dev/ptmx; stat -f -c %T /dev/pts");
    CHECK(listed.out.text() == "ptmx\npts/ptmx\ndevpts\n");
    auto opened = run(local->async_open_terminal(box.id, shell_request(), {24, 80}));
    REQUIRE_MESSAGE(opened, opened.error().to_string());
    screen s;
    REQUIRE(run(read_until(*opened, s, "$ ")));
    // Its own terminal is pts 0 of its own instance, whatever the host has open.
    CHECK(sh(box.id, "ls -A /dev/pts | tr '\\n' ' '").out.text() == "0 ptmx ");
    CHECK(run(type(*opened, s, "tty | tr / :\n", ":dev:pts:0\r\n")));
    // Not even root of the sandbox reaches past it: no other instance is mounted.
    CHECK(sh(box.id, "grep -c devpts /proc/self/mounts").out.text() == "1\n");
    REQUIRE(run(opened->async_signal(SIGKILL)));
    REQUIRE(run(read_to_end(*opened, s)));
    CHECK(s.end->signal == SIGKILL);
    destroy(box.id);
}

TEST_CASE_FIXTURE(
    local_fixture,
    "a terminal is reattached by its pid from another backend, and killed from there" *
        moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::sandbox_spec spec;
    spec.survive_owner = true;
    const auto box = create(spec);
    int pid = 0;
    {
        // Resident: the first client's going leaves it running.
        auto opened = run(local->async_open_terminal(box.id, shell_request(true), {24, 80}));
        REQUIRE_MESSAGE(opened, opened.error().to_string());
        pid = opened->pid();
        screen s;
        REQUIRE(run(read_until(*opened, s, "$ ")));
        CHECK(run(type(*opened, s, "X=remembered\n", "$ ")));
    }
    // Another backend, as another worker would be (on its own io_context).
    local_fixture other;
    auto attached = other.run(other.local->async_attach(box.id));
    REQUIRE_MESSAGE(attached, attached.error().to_string());
    auto again = other.run(other.local->async_attach_terminal(box.id, pid));
    REQUIRE_MESSAGE(again, again.error().to_string());
    CHECK(again->pid() == pid);
    screen s;
    CHECK(other.run(type(*again, s, "echo \"$X again\"\n", "remembered again\r\n")));
    REQUIRE(other.run(again->async_resize({50, 60})));
    CHECK(other.run(type(*again, s, "stty size\n", "50 60\r\n")));
    // A reattachment dropped leaves it running too; a third one kills it.
    again = moat::make_error(moat::errc::cancelled, "dropped");
    auto third = run(local->async_attach_terminal(box.id, pid));
    REQUIRE_MESSAGE(third, third.error().to_string());
    screen s3;
    CHECK(run(type(*third, s3, "echo THIRD-$((1+1))\n", "THIRD-2\r\n")));
    REQUIRE(run(third->async_signal(SIGKILL)));
    REQUIRE(run(read_to_end(*third, s3)));
    CHECK(s3.end->signal == SIGKILL);
    // Gone: no terminal has that pid now, and a pid that never was a terminal is refused.
    auto gone = run(local->async_attach_terminal(box.id, pid));
    REQUIRE_FALSE(gone);
    CHECK(gone.error().code == moat::errc::invalid_argument);
    auto not_terminal = run(local->async_attach_terminal(box.id, 1));
    REQUIRE_FALSE(not_terminal);
    CHECK(not_terminal.error().code == moat::errc::invalid_argument);
    CHECK(count_within(*this, box.id, "bash", "0"));
    third = moat::make_error(moat::errc::cancelled, "dropped");
    other.shut_down();
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a terminal dropped before its end kills its command, and a bad size is refused" *
                      moat::test::shares_host) {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto created = run(rt.async_create({}));
    REQUIRE_MESSAGE(created, created.error().to_string());
    auto box = *created;
    for (const moat::terminal_size bad :
         {moat::terminal_size{0, 80}, moat::terminal_size{24, 0}, moat::terminal_size{1001, 80}}) {
        auto refused = run(box->async_open_terminal(shell_request(), bad));
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == moat::errc::invalid_argument);
    }
    {
        // Through the handle: the side lane, beside a command that holds the ordered one.
        auto opened = run(box->async_open_terminal(shell_request(), {24, 80}));
        REQUIRE_MESSAGE(opened, opened.error().to_string());
        screen s;
        REQUIRE(run(read_until(*opened, s, "$ ")));
        CHECK(run(type(*opened, s, "sleep 300 &\n", "$ ")));
    }
    // The shell and the job it left behind are gone with the handle.
    bool ended = false;
    for (int i = 0; i < 100 && !ended; ++i) {
        auto ps =
            run(box->async_exec(moat::test::shell("ps -e -o comm= | grep -c -E "
                                                  "'^(bash|sleep)$' || true")));
        REQUIRE_MESSAGE(ps, ps.error().to_string());
        ended = ps->out.text() == "0\n";
        if (!ended) run(moat::test::pause(50ms));
    }
    CHECK(ended);
    CHECK_FALSE(box->quarantine_cause().has_value());
    REQUIRE(run(box->async_destroy()));
}
