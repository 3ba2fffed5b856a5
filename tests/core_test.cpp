// The runtime core: results and error conditions, output capture, JSON writing, deadlines,
// with_timeout and the task group.
#include <moat/result.hpp>
#include <moat/task_group.hpp>
#include <moat/with_timeout.hpp>

#include "core/json_writer.hpp"
#include "core/output_capture.hpp"
#include "support/async_test.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <doctest/doctest.h>

#include <random>
#include <string>

using namespace std::chrono_literals;

TEST_CASE("errors compare equal to the condition of their kind") {
    CHECK(moat::make_error_code(moat::errc::deadline_exceeded) == moat::condition::timeout);
    CHECK(moat::make_error_code(moat::errc::cancelled) == moat::condition::cancelled);
    CHECK(moat::make_error_code(moat::errc::backend_failure) == moat::condition::retryable);
    CHECK(moat::make_error_code(moat::errc::invalid_argument) == moat::condition::caller_error);
    CHECK(moat::make_error_code(moat::errc::sandbox_unavailable) == moat::condition::unavailable);
    CHECK(moat::make_error_code(moat::errc::layer_unavailable) == moat::condition::backend_failure);
    CHECK(moat::make_error_code(moat::errc::invalid_argument) != moat::condition::retryable);
    CHECK(moat::make_error(moat::errc::invalid_argument, "--timeout: negative").to_string() ==
          "invalid_argument: --timeout: negative");
}

TEST_CASE("the HTTP-layer codes keep their values, names and kinds") {
    CHECK(static_cast<int>(moat::errc::unauthorized) == 17);
    CHECK(static_cast<int>(moat::errc::rate_limited) == 18);
    CHECK(std::string(moat::to_string(moat::errc::unauthorized)) == "unauthorized");
    CHECK(std::string(moat::to_string(moat::errc::rate_limited)) == "rate_limited");
    CHECK(moat::make_error_code(moat::errc::unauthorized).message() == "unauthorized");
    CHECK(moat::make_error_code(moat::errc::rate_limited) == moat::condition::retryable);
    CHECK(moat::make_error_code(moat::errc::unauthorized) == moat::condition::caller_error);
    CHECK(moat::make_error_code(moat::errc::unauthorized) != moat::condition::retryable);
    CHECK(moat::make_error_code(moat::errc::protocol_error) == moat::condition::backend_failure);
}

TEST_CASE("a result holds either a value or an error") {
    moat::result<int> ok = 42;
    REQUIRE(ok);
    CHECK(*ok == 42);
    moat::result<int> bad = moat::make_error(moat::errc::sandbox_not_found, "no sandbox 'x'");
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == moat::errc::sandbox_not_found);
    moat::result<void> fine;
    CHECK(fine.has_value());
}

namespace {

// What value() threw, as "type-independent" text: its what() and, if it carries one, its code.
template <class Result>
std::string what_value_throws(const Result& r) {
    try {
        r.value();
    } catch (const std::system_error& e) {
        return std::string(e.what()) + " [" + e.code().message() + "]";
    } catch (const std::exception& e) {
        return e.what();
    }
    return "nothing";
}

}  // namespace

TEST_CASE("value() of a failed result throws an exception carrying its code and detail") {
    const moat::result<int> failed =
        moat::make_error(moat::errc::sandbox_not_found, "no sandbox 'abc'");
    const std::string thrown = what_value_throws(failed);
    CHECK(thrown.find("no sandbox 'abc'") != std::string::npos);
    CHECK(thrown.find(moat::make_error_code(moat::errc::sandbox_not_found).message()) !=
          std::string::npos);
    const moat::result<void> failed_void = moat::make_error(moat::errc::cancelled, "stopped");
    CHECK(what_value_throws(failed_void).find("stopped") != std::string::npos);
    const moat::result<int> fine = 7;
    CHECK(what_value_throws(fine) == "nothing");
}

TEST_CASE("output capture keeps everything that fits") {
    moat::output_capture capture({.head_bytes = 8, .tail_bytes = 8});
    capture.append("hello ");
    capture.append("world");
    const auto out = capture.finish();
    CHECK(out.head == "hello world");
    CHECK(out.tail.empty());
    CHECK_FALSE(out.is_truncated());
    CHECK(out.text() == "hello world");
}

TEST_CASE("output capture keeps head and tail of a long stream in fixed memory") {
    std::mt19937 rng(7);
    std::string all;
    moat::output_capture capture({.head_bytes = 100, .tail_bytes = 300});
    for (int i = 0; i < 2000; ++i) {
        std::string piece(rng() % 700, 'a');
        for (auto& c : piece) c = static_cast<char>('a' + rng() % 26);
        all += piece;
        capture.append(piece);
    }
    const auto out = capture.finish();
    REQUIRE(all.size() > 400);
    CHECK(out.head == all.substr(0, 100));
    CHECK(out.tail == all.substr(all.size() - 300));
    CHECK(out.total_bytes == all.size());
    CHECK(out.omitted_bytes == all.size() - 400);
    CHECK(out.text().find("bytes omitted") != std::string::npos);
}

TEST_CASE("json writer escapes control characters and replaces invalid UTF-8") {
    moat::json_writer w;
    w.begin_object().key("s").value(std::string_view("a\"b\\c\n\x01\xff\xc3\xa9", 10));
    w.key("n").value(-3).key("list").begin_array().value(true).null().end_array().end_object();
    CHECK(w.str() ==
          "{\"s\":\"a\\\"b\\\\c\\n\\u0001\xEF\xBF\xBD\xC3\xA9\",\"n\":-3,\"list\":[true,null]}");
}

namespace {

asio::awaitable<moat::result<int>> slow_answer(std::chrono::milliseconds delay) {
    asio::steady_timer timer(co_await asio::this_coro::executor, delay);
    co_await timer.async_wait(asio::use_awaitable);
    co_return 7;
}

asio::awaitable<moat::result<int>> answer_within(std::chrono::milliseconds delay,
                                                 std::chrono::milliseconds limit) {
    co_return co_await moat::with_timeout(slow_answer(delay), moat::deadline::after(limit));
}

asio::awaitable<void> sleep_long(int* finished) {
    asio::steady_timer timer(co_await asio::this_coro::executor, 1h);
    co_await timer.async_wait(asio::use_awaitable);
    ++*finished;
}

asio::awaitable<void> cancel_and_wait(moat::task_group& group) {
    group.cancel_all();
    co_await group.async_wait_all();
}

}  // namespace

TEST_CASE("with_timeout returns the value when the operation finishes first") {
    asio::io_context io;
    auto r = moat::test::run_async(io, answer_within(1ms, 10s));
    REQUIRE(r);
    CHECK(*r == 7);
}

TEST_CASE("with_timeout cancels the operation and reports deadline_exceeded") {
    asio::io_context io;
    auto r = moat::test::run_async(io, answer_within(1h, 20ms));
    REQUIRE_FALSE(r);
    CHECK(r.error().code == moat::errc::deadline_exceeded);
}

TEST_CASE("a task group cancels its tasks and waits for all of them") {
    asio::io_context io;
    moat::task_group group(io.get_executor(), "test");
    int finished = 0;
    for (int i = 0; i < 10; ++i) group.spawn(sleep_long(&finished));
    io.poll();
    CHECK(group.size() == 10);
    moat::test::run_async(io, cancel_and_wait(group));
    CHECK(group.size() == 0);
    CHECK(finished == 0);  // cancelled, not completed
}

TEST_CASE("a deadline never expires unless set") {
    CHECK(moat::deadline::never().is_never());
    CHECK_FALSE(moat::deadline::never().has_expired());
    CHECK(moat::deadline::after(-1s).has_expired());
    CHECK(moat::earliest(moat::deadline::after(1s), moat::deadline::never()) !=
          moat::deadline::never());
}

TEST_CASE("a deadline past what the clock can hold never comes, and one in the past has passed") {
    using clock = moat::deadline::clock;
    // 9,999,999,999 s (a ten-digit Keepalive-Ping-Interval) is past the nanosecond clock's range.
    const auto far = moat::deadline::after(std::chrono::seconds(9'999'999'999));
    CHECK(far.is_never());
    CHECK_FALSE(far.has_expired());
    CHECK(far.remaining() == clock::duration::max());
    for (const auto d : {moat::deadline::after(clock::duration::max()),
                         moat::deadline::after(std::chrono::hours::max()),
                         moat::deadline::after(std::chrono::seconds::max())}) {
        CHECK(d.is_never());
        CHECK_FALSE(d.has_expired());
    }
    for (const auto d : {moat::deadline::after(clock::duration::min()),
                         moat::deadline::after(std::chrono::seconds::min()),
                         moat::deadline::after(std::chrono::seconds(-9'999'999'999)),
                         moat::deadline::after(clock::duration::zero())}) {
        CHECK_FALSE(d.is_never());
        CHECK(d.has_expired());
        CHECK(d.remaining() == clock::duration::zero());
    }
    const auto hour = moat::deadline::after(1h);
    CHECK_FALSE(hour.is_never());
    CHECK_FALSE(hour.has_expired());
    CHECK(hour.remaining() <= clock::duration(1h));
    CHECK(hour.remaining() > clock::duration::zero());
}
