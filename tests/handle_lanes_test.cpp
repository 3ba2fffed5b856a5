// The sandbox handle's side lane and its stalled-transfer bound, on the real local backend: side
// operations run beside an ordered operation that holds the sandbox, at most side_lane_width at
// once, and are stopped by a destroy; a read stream nobody pulls and a write whose source yields
// nothing give up their place once transfer_stall_limit passes.
#include <doctest/doctest.h>

#include <moat/runtime.hpp>

#include "support/async_wait.hpp"
#include "support/local_fixture.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <memory>
#include <optional>
#include <string>

using moat::test::local_fixture;
using moat::test::shell;
using moat::test::until;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<moat::sandbox> create_handle(local_fixture& f, moat::runtime& rt) {
    auto box = f.run(rt.async_create({}));
    if (!box) FAIL("create failed: " << box.error().to_string());
    return *box;
}

// A file of `bytes` zero bytes, written through the backend.
void write_file(local_fixture& f, const std::string& id, const std::string& path,
                std::size_t bytes) {
    auto made = f.sh(id, "head -c " + std::to_string(bytes) + " /dev/zero > " + path);
    REQUIRE(made.exit_code == 0);
}

struct exec_outcome {
    std::optional<moat::result<moat::exec_result>> value;
};

asio::awaitable<void> exec_into(std::shared_ptr<moat::sandbox> box, std::string command,
                                moat::lane in, std::shared_ptr<exec_outcome> out) {
    auto request = shell(command);
    out->value = co_await box->async_exec(std::move(request), moat::deadline::never(), in);
}

// A byte source that yields `first` once, then waits (cancellably) for an hour.
struct stalling_source {
    std::shared_ptr<bool> gave_first = std::make_shared<bool>(false);
    std::string first;
    asio::awaitable<moat::result<std::string>> operator()() const {
        return next(gave_first, first);
    }
    static asio::awaitable<moat::result<std::string>> next(std::shared_ptr<bool> gave,
                                                           std::string first) {
        if (!*gave) {
            *gave = true;
            co_return first;
        }
        asio::steady_timer never(co_await asio::this_coro::executor, 1h);
        co_await never.async_wait(asio::use_awaitable);  // throws when cancelled
        co_return std::string();
    }
};

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "a side-lane stat runs while a read stream holds the sandbox's ordered lane") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    write_file(*this, box->id(), "/workspace/big", 4 * moat::file_stream_chunk_bytes);
    // Opened and never pulled: it holds the ordered lane until it is dropped (or stalls, 30 s).
    auto stream = run(box->async_read_file_stream("/workspace/big"));
    REQUIRE(stream);
    CHECK(box->state() == moat::handle_state::busy);
    // An ordered stat cannot run now: its deadline passes in the queue.
    auto queued =
        run(box->async_stat("/workspace/big", moat::deadline::after(200ms), moat::lane::ordered));
    REQUIRE_FALSE(queued);
    CHECK(queued.error().code == moat::errc::deadline_exceeded);
    // The same stat in the side lane runs beside it.
    auto beside =
        run(box->async_stat("/workspace/big", moat::deadline::after(20s), moat::lane::side));
    REQUIRE(beside);
    CHECK(beside->size == 4 * moat::file_stream_chunk_bytes);
    // The stream is intact: every byte still comes.
    std::size_t total = 0;
    while (true) {
        auto chunk = run(stream->async_next());
        REQUIRE(chunk);
        if (chunk->empty()) break;
        total += chunk->size();
    }
    CHECK(total == 4 * moat::file_stream_chunk_bytes);
    CHECK(box->state() == moat::handle_state::ready);
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture, "the side lane runs at most side_lane_width operations at once") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime_options options;
    options.handle.side_lane_width = 2;
    moat::runtime rt(*local, options);
    auto box = create_handle(*this, rt);
    write_file(*this, box->id(), "/workspace/f", 2 * moat::file_stream_chunk_bytes);
    auto first = run(box->async_read_file_stream("/workspace/f", {}, moat::lane::side));
    auto second = run(box->async_read_file_stream("/workspace/f", {}, moat::lane::side));
    REQUIRE(first);
    REQUIRE(second);
    CHECK(box->running_beside() == 2);
    // The ordered lane is free.
    CHECK(box->state() == moat::handle_state::ready);
    REQUIRE(run(box->async_stat("/workspace/f")));
    // A third side operation waits for a place, and its deadline passes there.
    auto third =
        run(box->async_stat("/workspace/f", moat::deadline::after(200ms), moat::lane::side));
    REQUIRE_FALSE(third);
    CHECK(third.error().code == moat::errc::deadline_exceeded);
    CHECK(third.error().detail.find("queued") != std::string::npos);
    // Dropping one stream gives its place up.
    *first = moat::file_read_stream();
    CHECK(box->running_beside() == 1);
    auto fourth =
        run(box->async_stat("/workspace/f", moat::deadline::after(20s), moat::lane::side));
    REQUIRE(fourth);
    *second = moat::file_read_stream();
    CHECK(box->running_beside() == 0);
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture, "a destroy stops the side lane's running operations") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto box = create_handle(*this, rt);
    auto ordered = std::make_shared<exec_outcome>();
    auto beside = std::make_shared<exec_outcome>();
    tasks.spawn(exec_into(box, "sleep 1000", moat::lane::ordered, ordered));
    tasks.spawn(exec_into(box, "sleep 1001", moat::lane::side, beside));
    REQUIRE(run(until(
        [&] { return box->running_beside() == 1 && box->state() == moat::handle_state::busy; })));
    REQUIRE(run(box->async_destroy()));
    CHECK(box->state() == moat::handle_state::destroyed);
    REQUIRE(run(until([&] { return ordered->value && beside->value; })));
    // Both ended without a result from their program: stopped by the destroy.
    CHECK_FALSE(*ordered->value);
    CHECK_FALSE(*beside->value);
    CHECK(box->running_beside() == 0);
    // Nothing runs in either lane afterwards.
    auto after = run(box->async_stat("/", {}, moat::lane::side));
    REQUIRE_FALSE(after);
    CHECK(after.error().code == moat::errc::sandbox_unavailable);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a read stream nobody pulls gives up the sandbox after the stall limit") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime_options options;
    options.handle.transfer_stall_limit = 300ms;
    moat::runtime rt(*local, options);
    auto box = create_handle(*this, rt);
    write_file(*this, box->id(), "/workspace/big", 4 * moat::file_stream_chunk_bytes);
    auto stream = run(box->async_read_file_stream("/workspace/big"));
    REQUIRE(stream);
    auto chunk = run(stream->async_next());
    REQUIRE(chunk);
    CHECK_FALSE(chunk->empty());
    // The stream stays alive and unpulled; an ordered stat (no deadline) runs once it stalled.
    auto stat = run(box->async_stat("/workspace/big"));
    REQUIRE(stat);
    CHECK(box->state() == moat::handle_state::ready);
    auto late = run(stream->async_next());
    REQUIRE_FALSE(late);
    CHECK(late.error().code == moat::errc::deadline_exceeded);
    CHECK(late.error().detail.find("transfer_stall_limit") != std::string::npos);
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "a write whose source stalls fails after the stall limit and leaves no file") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime_options options;
    options.handle.transfer_stall_limit = 300ms;
    moat::runtime rt(*local, options);
    auto box = create_handle(*this, rt);
    moat::file_write_target target;
    target.path = "/workspace/stalled";
    stalling_source source;
    source.first = std::string(1000, 'x');
    auto written = run(box->async_write_file_stream(target, source));
    // The write as a whole failed, or its one file did.
    moat::errc code = moat::errc::cancelled;
    std::string detail;
    if (!written) {
        code = static_cast<moat::errc>(written.error().code.value());
        detail = written.error().detail;
    } else {
        REQUIRE_FALSE(written->outcome);
        code = static_cast<moat::errc>(written->outcome.error().code.value());
        detail = written->outcome.error().detail;
    }
    CHECK(code == moat::errc::deadline_exceeded);
    CHECK(detail.find("transfer_stall_limit") != std::string::npos);
    CHECK(box->state() == moat::handle_state::ready);
    auto gone = run(box->async_stat("/workspace/stalled"));
    REQUIRE_FALSE(gone);
    CHECK(gone.error().code == moat::errc::file_not_found);
    // No temporary file either.
    auto listing = sh(box->id(), "ls -A /workspace | wc -l");
    CHECK(listing.out.head == "0\n");
    REQUIRE(run(box->async_destroy()));
}
