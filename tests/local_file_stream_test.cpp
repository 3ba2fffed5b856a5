// Streamed file transfer on the local backend and through the sandbox handle: 100 MiB in and out
// in bounded memory with every byte value, the write cap, a failing or cancelled source, planted
// symlinks, parent directories, per-path read errors, an executor that keeps serving meanwhile,
// and the handle's queue order. Contents are checked inside the sandbox (sha256sum, ls) and on the
// host (RSS, /etc, /tmp), never only through the API under test.
#include <moat/runtime.hpp>
#include <moat/with_timeout.hpp>

#include "support/async_wait.hpp"
#include "support/fault_injecting_backend.hpp"
#include "support/host_inspect.hpp"
#include "support/local_fixture.hpp"
#include "support/text_source.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <openssl/evp.h>

#include <unistd.h>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

using moat::errc;
using moat::test::local_fixture;
using moat::test::text_source;
using moat::test::until;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t mib = 1024 * 1024;

// How much the test process's RSS may grow while 100 MiB stream through it. ASan's quarantine
// keeps freed memory (every chunk) resident up to 256 MiB, so there the bound is the dev build's
// and the sanitized run checks everything else.
#if defined(__SANITIZE_ADDRESS__)
constexpr long rss_growth_bound = 1L << 40;
#else
constexpr long rss_growth_bound = 32L << 20;
#endif

class sha256 {
  public:
    sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
    ~sha256() { EVP_MD_CTX_free(ctx_); }
    sha256(const sha256&) = delete;
    sha256& operator=(const sha256&) = delete;
    void update(std::string_view data) { EVP_DigestUpdate(ctx_, data.data(), data.size()); }
    std::string hex() {
        unsigned char digest[32];
        unsigned int length = 0;
        EVP_DigestFinal_ex(ctx_, digest, &length);
        static constexpr char digits[] = "0123456789abcdef";
        std::string out;
        for (unsigned int i = 0; i < length; ++i) {
            out += digits[digest[i] >> 4];
            out += digits[digest[i] & 0xf];
        }
        return out;
    }

  private:
    EVP_MD_CTX* ctx_;
};

// Deterministic bytes, chunk by chunk: all 256 values first, then xorshift noise. Records the
// test process's peak RSS as it goes.
struct pattern {
    std::uint64_t total = 0;
    std::uint64_t produced = 0;
    std::size_t chunk_bytes = 128 * 1024;
    std::uint64_t state = 0x9e3779b97f4a7c15ull;
    sha256 hash;
    long peak_rss = 0;
    int calls = 0;
    // Fails the source with this error after this many chunks.
    std::optional<int> fail_after;
    // Waits (for a cancellation) instead of returning chunk number `hang_after`.
    std::optional<int> hang_after;
    bool hanging = false;

    std::string next_chunk() {
        const std::uint64_t left = total - produced;
        std::string out(static_cast<std::size_t>(std::min<std::uint64_t>(chunk_bytes, left)), '\0');
        std::size_t i = 0;
        for (; i < out.size() && produced + i < 256; ++i) {
            out[i] = static_cast<char>(produced + i);
        }
        for (; i < out.size(); ++i) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            out[i] = static_cast<char>(state >> 56);
        }
        produced += out.size();
        hash.update(out);
        return out;
    }
};

asio::awaitable<moat::result<std::string>> pull_pattern(std::shared_ptr<pattern> p) {
    p->peak_rss = std::max(p->peak_rss, moat::test::resident_bytes());
    const int call = p->calls++;
    if (p->fail_after && call == *p->fail_after) {
        co_return moat::make_error(errc::invalid_argument, "the client went away");
    }
    if (p->hang_after && call == *p->hang_after) {
        p->hanging = true;
        asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::hours(1));
        co_await timer.async_wait(asio::use_awaitable);  // throws once cancelled
    }
    co_return p->next_chunk();
}

moat::byte_source source_of(const std::shared_ptr<pattern>& p) {
    return [p]() { return pull_pattern(p); };
}

moat::file_write_target target_at(const std::string& path) {
    moat::file_write_target target;
    target.path = path;
    return target;
}

// Everything a read stream delivers, hashed, with the peak RSS seen while reading.
struct drained {
    std::optional<moat::error> failure;
    std::uint64_t bytes = 0;
    std::string sha;
    std::string content;  // kept only when asked
    long peak_rss = 0;
};

asio::awaitable<drained> drain(moat::file_read_stream stream, bool keep) {
    drained out;
    sha256 hash;
    for (;;) {
        auto chunk = co_await stream.async_next();
        out.peak_rss = std::max(out.peak_rss, moat::test::resident_bytes());
        if (!chunk) {
            out.failure = chunk.error();
            break;
        }
        if (chunk->empty()) break;
        CHECK(chunk->size() <= moat::file_stream_chunk_bytes);
        out.bytes += chunk->size();
        hash.update(*chunk);
        if (keep) out.content += *chunk;
    }
    out.sha = hash.hex();
    co_return out;
}

asio::awaitable<drained> read_all(moat::backend& b, std::string id, std::string path) {
    auto stream = co_await b.async_read_file_stream(std::move(id), std::move(path));
    if (!stream) {
        drained failed;
        failed.failure = stream.error();
        co_return failed;
    }
    co_return co_await drain(std::move(*stream), true);
}

moat::result<void> write_stream(local_fixture& f, const std::string& id,
                                moat::file_write_target target, moat::byte_source source) {
    auto r = f.run(f.local->async_write_file_stream(id, target, std::move(source)));
    if (!r) FAIL("write_file_stream failed whole: " << r.error().to_string());
    CHECK(r->path == target.path);
    return r->outcome;
}

using exec_slot = std::optional<moat::result<moat::exec_result>>;

asio::awaitable<void> exec_through(std::shared_ptr<moat::sandbox> box, std::string command,
                                   std::shared_ptr<exec_slot> out) {
    auto request = moat::test::shell(command);
    auto done = co_await box->async_exec(std::move(request));
    *out = std::move(done);
}

struct ticks {
    std::uint64_t count = 0;
    bool stop = false;
};

asio::awaitable<void> tick(std::shared_ptr<ticks> t) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    while (!t->stop) {
        timer.expires_after(1ms);
        co_await timer.async_wait(asio::use_awaitable);
        ++t->count;
    }
}

struct write_outcome {
    std::optional<moat::result<moat::file_write_result>> value;
};

asio::awaitable<void> write_into(moat::backend& b, std::string id, moat::file_write_target target,
                                 moat::byte_source source, std::shared_ptr<write_outcome> out) {
    out->value =
        co_await b.async_write_file_stream(std::move(id), std::move(target), std::move(source));
}

std::string no_temp_listing(local_fixture& f, const std::string& id, const std::string& dir) {
    return f.sh(id, "ls -A " + dir).out.text();
}

}  // namespace

TEST_CASE_FIXTURE(local_fixture,
                  "100 MiB streams into and out of a sandbox whole, in bounded memory, while the "
                  "executor keeps serving") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    auto p = std::make_shared<pattern>();
    p->total = 100 * mib;
    const long rss_before = moat::test::resident_bytes();
    p->peak_rss = rss_before;
    auto t = std::make_shared<ticks>();
    tasks.spawn(tick(t));
    const auto write_started = std::chrono::steady_clock::now();
    const auto written = write_stream(*this, box.id, target_at("/workspace/big.bin"), source_of(p));
    const std::uint64_t ticks_during_write = t->count;
    REQUIRE_MESSAGE(written, written.error().to_string());
    CHECK(p->produced == 100 * mib);
    const std::string expected = p->hash.hex();
    CHECK(p->peak_rss - rss_before < rss_growth_bound);
    // The executor ran its 1 ms timer between chunks: an inline copy would give it no turn.
    CHECK(ticks_during_write >= 10);
    const auto write_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - write_started);
    MESSAGE("write: " << write_ms.count() << " ms, peak RSS growth "
                      << (p->peak_rss - rss_before) / 1024 << " KiB, " << ticks_during_write
                      << " timer ticks");

    const auto in_sandbox = sh(box.id,
                               "sha256sum /workspace/big.bin; stat -c '%s %a %u' "
                               "/workspace/big.bin; ls -A /workspace");
    CHECK(in_sandbox.out.text() ==
          expected + "  /workspace/big.bin\n104857600 644 1000\nbig.bin\n");

    const std::uint64_t ticks_before_read = t->count;
    auto stream = run(local->async_read_file_stream(box.id, "/workspace/big.bin"));
    REQUIRE_MESSAGE(stream, stream.error().to_string());
    CHECK(stream->stat().size == 100 * mib);
    CHECK(stream->stat().mode == 0644);
    CHECK(stream->stat().type == moat::file_type::regular);
    const long rss_before_read = moat::test::resident_bytes();
    const auto read_started = std::chrono::steady_clock::now();
    const auto read = run(drain(std::move(*stream), false));
    const auto read_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - read_started);
    CHECK_FALSE(read.failure);
    CHECK(read.bytes == 100 * mib);
    CHECK(read.sha == expected);
    CHECK(read.peak_rss - rss_before_read < rss_growth_bound);
    CHECK(t->count - ticks_before_read >= 10);
    MESSAGE("read: " << read_ms.count() << " ms, peak RSS growth "
                     << (read.peak_rss - rss_before_read) / 1024 << " KiB, "
                     << t->count - ticks_before_read << " timer ticks");
    t->stop = true;
    destroy(box.id);
}

TEST_CASE_FIXTURE(
    local_fixture,
    "a streamed write past its cap is refused, the old file intact and no temp left") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    REQUIRE(write_stream(*this, box.id, target_at("/workspace/keep"), text_source("old content")));
    auto p = std::make_shared<pattern>();
    p->total = 5 * mib;
    p->chunk_bytes = 300 * 1024;
    auto target = target_at("/workspace/keep");
    target.max_bytes = mib;
    const auto over = write_stream(*this, box.id, target, source_of(p));
    REQUIRE_FALSE(over);
    CHECK(over.error().code == errc::too_large);
    CHECK(over.error().detail.find("/workspace/keep") == 0);
    CHECK(over.error().detail.find("1048576") != std::string::npos);
    CHECK(p->calls == 4);  // the fourth chunk crossed the cap; nothing more was pulled
    CHECK(no_temp_listing(*this, box.id, "/workspace") == "keep\n");
    CHECK(sh(box.id, "cat /workspace/keep").out.text() == "old content");
    // A new file past the cap leaves nothing at all; exactly the cap is fine.
    auto fresh = std::make_shared<pattern>();
    fresh->total = 2 * mib;
    CHECK(write_stream(*this, box.id, target_at("/workspace/new"), source_of(fresh)));
    auto capped = target_at("/workspace/new2");
    capped.max_bytes = 2 * mib - 1;
    auto again = std::make_shared<pattern>();
    again->total = 2 * mib;
    CHECK(write_stream(*this, box.id, capped, source_of(again)).error().code == errc::too_large);
    CHECK(no_temp_listing(*this, box.id, "/workspace") == "keep\nnew\n");
    capped.max_bytes = 2 * mib;
    auto exact = std::make_shared<pattern>();
    exact->total = 2 * mib;
    CHECK(write_stream(*this, box.id, capped, source_of(exact)));
    CHECK(no_temp_listing(*this, box.id, "/workspace") == "keep\nnew\nnew2\n");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a source that fails mid-way leaves the old file intact and no temp file") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    REQUIRE(write_stream(*this, box.id, target_at("/workspace/keep"), text_source("old content")));
    auto p = std::make_shared<pattern>();
    p->total = 10 * mib;
    p->fail_after = 3;
    const auto failed = write_stream(*this, box.id, target_at("/workspace/keep"), source_of(p));
    REQUIRE_FALSE(failed);
    CHECK(failed.error().code == errc::invalid_argument);
    CHECK(failed.error().detail == "/workspace/keep: the source failed: the client went away");
    CHECK(no_temp_listing(*this, box.id, "/workspace") == "keep\n");
    CHECK(sh(box.id, "cat /workspace/keep").out.text() == "old content");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a cancelled streamed write leaves the old file intact and no temp file") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    REQUIRE(write_stream(*this, box.id, target_at("/workspace/keep"), text_source("old content")));
    auto p = std::make_shared<pattern>();
    p->total = 10 * mib;
    p->hang_after = 3;  // three chunks are in the temporary file by then
    auto out = std::make_shared<write_outcome>();
    asio::cancellation_signal cancel;
    auto writing = write_into(*local, box.id, target_at("/workspace/keep"), source_of(p), out);
    asio::co_spawn(io, std::move(writing),
                   asio::bind_cancellation_slot(cancel.slot(), [](std::exception_ptr) {}));
    REQUIRE(run(until([&] { return p->hanging; })));
    CHECK(sh(box.id, "ls -A /workspace | wc -l").out.text() == "2\n");  // keep + the temp file
    cancel.emit(asio::cancellation_type::terminal);
    REQUIRE(run(until([&] { return out->value.has_value(); })));
    REQUIRE_FALSE(*out->value);
    CHECK(out->value->error().code == errc::cancelled);
    CHECK(no_temp_listing(*this, box.id, "/workspace") == "keep\n");
    CHECK(sh(box.id, "cat /workspace/keep").out.text() == "old content");
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture, "streamed transfers never follow a planted symlink to the host") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const std::string host_hostname = moat::test::read_file("/etc/hostname");
    const std::string host_passwd = moat::test::read_file("/etc/passwd");
    sh(box.id,
       "cd /workspace && ln -s /proc/1/root rootlink && ln -s /etc etcdir && "
       "ln -s /etc/hostname escape && ln -s /proc/1/root/etc/passwd hostpasswd");
    const std::initializer_list<errc> refused = {errc::invalid_path, errc::permission_denied};
    const auto is_refused = [&](const moat::error& e) {
        for (const errc c : refused) {
            if (e.code == c) return true;
        }
        return false;
    };
    for (const char* path : {"/workspace/rootlink/tmp/moat-pwned", "/proc/1/root/tmp/moat-pwned",
                             "/workspace/etcdir/moat-pwned"}) {
        CAPTURE(path);
        for (const bool parents : {false, true}) {
            auto target = target_at(path);
            target.create_parents = parents;
            const auto r = write_stream(*this, box.id, target, text_source("x"));
            REQUIRE_FALSE(r);
            CHECK_MESSAGE(is_refused(r.error()), r.error().to_string());
        }
    }
    auto deep = target_at("/workspace/rootlink/tmp/moat-dir/pwned");
    deep.create_parents = true;
    const auto d = write_stream(*this, box.id, deep, text_source("x"));
    REQUIRE_FALSE(d);
    CHECK_MESSAGE(is_refused(d.error()), d.error().to_string());
    for (const char* path :
         {"/workspace/hostpasswd", "/workspace/rootlink/etc/passwd", "/proc/1/root/etc/hostname"}) {
        CAPTURE(path);
        const auto r = run(read_all(*local, box.id, path));
        REQUIRE(r.failure);
        CHECK_MESSAGE(is_refused(*r.failure), r.failure->to_string());
    }
    // An absolute link resolves against the sandbox's "/": its /etc/hostname, not the host's.
    const auto own = run(read_all(*local, box.id, "/workspace/escape"));
    REQUIRE_FALSE(own.failure);
    CHECK(own.content == sh(box.id, "cat /etc/hostname").out.text());
    CHECK(own.content != host_hostname);
    // Writing to the link replaces the link, not its target.
    REQUIRE(write_stream(*this, box.id, target_at("/workspace/escape"), text_source("mine\n")));
    CHECK(sh(box.id, "test -L /workspace/escape || cat /workspace/escape").out.text() == "mine\n");

    CHECK(moat::test::read_file("/etc/hostname") == host_hostname);
    CHECK(moat::test::read_file("/etc/passwd") == host_passwd);
    CHECK(::access("/etc/moat-pwned", F_OK) != 0);
    CHECK(::access("/tmp/moat-pwned", F_OK) != 0);
    CHECK(::access("/tmp/moat-dir", F_OK) != 0);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a streamed write into a missing directory fails, or creates it when asked") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    const auto missing =
        write_stream(*this, box.id, target_at("/workspace/a/b/c.txt"), text_source("deep"));
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == errc::file_not_found);
    CHECK(missing.error().detail.find("/workspace/a/b/c.txt") == 0);
    CHECK(no_temp_listing(*this, box.id, "/workspace").empty());

    auto target = target_at("/workspace/a/./b//c.txt");
    target.create_parents = true;
    target.mode = 0600;
    REQUIRE(write_stream(*this, box.id, target, text_source("deep")));
    CHECK(sh(box.id,
             "cat /workspace/a/b/c.txt; stat -c '%a %u %g' /workspace/a /workspace/a/b "
             "/workspace/a/b/c.txt; ls -A /workspace/a/b")
              .out.text() == "deep755 1000 1000\n755 1000 1000\n600 1000 1000\nc.txt\n");
    // Parents under the read-only root cannot be made.
    auto ro = target_at("/usr/moat-new/x");
    ro.create_parents = true;
    const auto denied = write_stream(*this, box.id, ro, text_source("x"));
    REQUIRE_FALSE(denied);
    CHECK(denied.error().code == errc::permission_denied);
    // A file where a directory is needed.
    auto through_file = target_at("/workspace/a/b/c.txt/d");
    through_file.create_parents = true;
    const auto not_dir = write_stream(*this, box.id, through_file, text_source("x"));
    REQUIRE_FALSE(not_dir);
    CHECK(not_dir.error().code == errc::file_not_found);
    destroy(box.id);
}

TEST_CASE_FIXTURE(
    local_fixture,
    "a streamed read of a missing file, a directory or a FIFO gets its per-path error") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    sh(box.id, "mkfifo /workspace/fifo && mkdir /workspace/dir && : > /workspace/empty");
    const auto code_of = [&](const std::string& path) {
        auto r = run(read_all(*local, box.id, path));
        REQUIRE(r.failure);
        CHECK(r.failure->detail.find(path) == 0);
        return static_cast<errc>(r.failure->code.value());
    };
    CHECK(code_of("/workspace/missing") == errc::file_not_found);
    CHECK(code_of("/workspace/nodir/missing") == errc::file_not_found);
    CHECK(code_of("/workspace/dir") == errc::is_directory);
    CHECK(code_of("/workspace/fifo") == errc::invalid_path);
    CHECK(code_of("relative") == errc::invalid_path);
    const auto empty = run(read_all(*local, box.id, "/workspace/empty"));
    CHECK_FALSE(empty.failure);
    CHECK(empty.bytes == 0);
    // A streamed write onto a directory is is_directory.
    const auto onto_dir =
        write_stream(*this, box.id, target_at("/workspace/dir"), text_source("x"));
    REQUIRE_FALSE(onto_dir);
    CHECK(onto_dir.error().code == errc::is_directory);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "a streamed read delivers the size it announced, and a file that shrinks fails") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    sh(box.id, "head -c 1048576 /dev/zero > /workspace/f");
    auto stream = run(local->async_read_file_stream(box.id, "/workspace/f"));
    REQUIRE(stream);
    CHECK(stream->stat().size == mib);
    auto first = run(stream->async_next());
    REQUIRE(first);
    CHECK(first->size() == moat::file_stream_chunk_bytes);
    sh(box.id, "truncate -s 200000 /workspace/f");
    std::optional<moat::error> failure;
    for (int i = 0; i < 20 && !failure; ++i) {
        auto next = run(stream->async_next());
        if (!next)
            failure = next.error();
        else
            REQUIRE_FALSE(next->empty());
    }
    REQUIRE(failure);
    CHECK(failure->code == errc::backend_failure);
    CHECK(failure->detail.find("/workspace/f: the file shrank") == 0);
    CHECK(run(stream->async_next()).error().code == errc::invalid_argument);
    destroy(box.id);
}

TEST_CASE_FIXTURE(local_fixture,
                  "through the handle a streamed read holds the turn and a write keeps the order") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto made = run(rt.async_create({}));
    REQUIRE(made);
    auto box = *made;
    std::vector<moat::file_write> files(1);
    files[0].path = "/workspace/data";
    files[0].content = std::string(3 * moat::file_stream_chunk_bytes + 5, 'd');
    REQUIRE(run(box->async_write_files(files)));

    auto stream = run(box->async_read_file_stream("/workspace/data"));
    REQUIRE(stream);
    // An exec queued behind the open stream waits for it.
    auto queued_exec = std::make_shared<exec_slot>();
    tasks.spawn(exec_through(box, "cat /workspace/data | wc -c", queued_exec));
    REQUIRE(run(until([&] { return box->queued() == 1; })));
    CHECK(box->state() == moat::handle_state::busy);
    std::uint64_t got = 0;
    for (;;) {
        auto chunk = run(stream->async_next());
        REQUIRE(chunk);
        CHECK_FALSE(queued_exec->has_value());
        if (chunk->empty()) break;
        got += chunk->size();
    }
    CHECK(got == files[0].content.size());
    REQUIRE(run(until([&] { return queued_exec->has_value(); })));
    REQUIRE(**queued_exec);
    CHECK((**queued_exec)->out.text() == std::to_string(got) + "\n");

    // A write queued behind a running exec runs after it: the exec sees the old content.
    auto slow = std::make_shared<exec_slot>();
    tasks.spawn(exec_through(box, "sleep 0.3; cat /workspace/data | wc -c", slow));
    REQUIRE(run(until([&] { return box->state() == moat::handle_state::busy; })));
    auto target = target_at("/workspace/data");
    const auto written = run(box->async_write_file_stream(target, text_source("new")));
    REQUIRE(written);
    CHECK(written->outcome);
    REQUIRE(run(until([&] { return slow->has_value(); })));
    REQUIRE(**slow);
    CHECK((**slow)->out.text() == std::to_string(got) + "\n");
    CHECK(sh(box->id(), "cat /workspace/data").out.text() == "new");

    // Past its deadline a streamed write is abandoned: deadline_exceeded, the old file intact.
    auto p = std::make_shared<pattern>();
    p->total = 10 * mib;
    p->hang_after = 2;
    const auto late =
        run(box->async_write_file_stream(target, source_of(p), moat::deadline::after(300ms)));
    REQUIRE_FALSE(late);
    CHECK(late.error().code == errc::deadline_exceeded);
    CHECK(sh(box->id(), "ls -A /workspace; cat /workspace/data").out.text() == "data\nnew");
    CHECK(box->state() == moat::handle_state::ready);
    REQUIRE(run(box->async_destroy()));
}

TEST_CASE_FIXTURE(local_fixture,
                  "a backend that cannot stream falls back to the batch calls for small files") {
    MOAT_REQUIRE_NAMESPACES();
    const auto box = create();
    moat::test::fault_injecting_backend batch_only(*local);
    batch_only.batch_files_only = true;
    auto p = std::make_shared<pattern>();
    p->total = 3 * mib;
    auto written = run(
        batch_only.async_write_file_stream(box.id, target_at("/workspace/small"), source_of(p)));
    REQUIRE(written);
    REQUIRE_MESSAGE(written->outcome, written->outcome.error().to_string());
    const std::string expected = p->hash.hex();
    CHECK(sh(box.id, "sha256sum < /workspace/small").out.text() == expected + "  -\n");
    const auto read = run(read_all(batch_only, box.id, "/workspace/small"));
    CHECK_FALSE(read.failure);
    CHECK(read.bytes == 3 * mib);
    CHECK(read.sha == expected);

    // Past the batch call's per-file limit: too_large naming the backend, nothing written.
    auto big = std::make_shared<pattern>();
    big->total = 11 * mib;
    written = run(
        batch_only.async_write_file_stream(box.id, target_at("/workspace/big"), source_of(big)));
    REQUIRE(written);
    REQUIRE_FALSE(written->outcome);
    CHECK(written->outcome.error().code == errc::too_large);
    CHECK(written->outcome.error().detail.find("does not stream") != std::string::npos);
    CHECK(no_temp_listing(*this, box.id, "/workspace") == "small\n");
    sh(box.id, "head -c 11534336 /dev/zero > /workspace/big");
    const auto too_big = run(read_all(batch_only, box.id, "/workspace/big"));
    REQUIRE(too_big.failure);
    CHECK(too_big.failure->code == errc::too_large);
    const auto missing = run(read_all(batch_only, box.id, "/workspace/missing"));
    REQUIRE(missing.failure);
    CHECK(missing.failure->code == errc::file_not_found);
    destroy(box.id);
}

TEST_CASE_FIXTURE(
    local_fixture,
    "through the handle a read stream past its deadline fails and gives the turn on") {
    MOAT_REQUIRE_NAMESPACES();
    moat::runtime rt(*local);
    auto made = run(rt.async_create({}));
    REQUIRE(made);
    auto box = *made;
    sh(box->id(), "head -c 4194304 /dev/zero > /workspace/data");
    auto stream = run(box->async_read_file_stream("/workspace/data", moat::deadline::after(300ms)));
    REQUIRE(stream);
    REQUIRE(run(stream->async_next()));
    auto queued_exec = std::make_shared<exec_slot>();
    tasks.spawn(exec_through(box, "echo after", queued_exec));
    REQUIRE(run(until([&] { return box->queued() == 1; })));
    run(moat::test::pause(400ms));
    // Every pull from here on is past the deadline: the first fails, the stream is finished.
    const auto late = run(stream->async_next());
    REQUIRE_FALSE(late);
    CHECK(late.error().code == errc::deadline_exceeded);
    CHECK(run(stream->async_next()).error().code == errc::invalid_argument);
    REQUIRE(run(until([&] { return queued_exec->has_value(); })));
    REQUIRE(**queued_exec);
    CHECK((**queued_exec)->out.text() == "after\n");
    CHECK(box->state() == moat::handle_state::ready);
    REQUIRE(run(box->async_destroy()));
}
