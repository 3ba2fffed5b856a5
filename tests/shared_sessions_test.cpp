// Sessions shared by several workers through one session store (include/moat/session_store.hpp):
// the stores' contract on their own (claims, fencing, lease expiry, the rebuild notice, the
// shared idle mark), then several managers, each with its own local backend and runtime, over one
// memory store and over one host store in this process, then worker processes
// (tests/session_worker.cpp) over the host store: one sandbox for eight at once, a worker killed
// in the middle of its create, a rebuild across processes.
#include <doctest/doctest.h>

#include <moat/session_manager.hpp>

#include "support/async_wait.hpp"
#include "support/local_fixture.hpp"
#include "support/redis_server.hpp"
#include "support/session_worker_process.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using moat::test::field;
using moat::test::finish;
using moat::test::local_fixture;
using moat::test::pause;
using moat::test::read_line;
using moat::test::running_with;
using moat::test::start_worker;
using moat::test::until;
using namespace std::chrono_literals;

namespace {

// A fresh 0700 directory for one host store, removed afterwards.
struct store_directory {
    store_directory() {
        char name[] = "/tmp/moat-sessions-test-XXXXXX";
        REQUIRE(::mkdtemp(name) != nullptr);
        path = name;
    }
    ~store_directory() {
        const std::string command = "rm -rf '" + path + "'";
        (void)std::system(command.c_str());
    }
    std::string path;
};

std::string hex(const std::string& text) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (unsigned char c : text) {
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out;
}

// A store made for the kind under test: the memory store (one object for everyone) or a host
// store per worker over one directory (as separate processes would have).
// A Redis store per worker over one redis-server of the test's own, when `redis` is set.
struct store_maker {
    bool host = false;
    bool redis = false;
    // "memory", "host" or "redis".
    void use(const std::string& kind) {
        host = kind == "host";
        redis = kind == "redis";
    }
    std::shared_ptr<moat::session_store> memory = moat::make_memory_session_store();
    store_directory dir;
    std::unique_ptr<moat::test::redis_server> server;
    std::shared_ptr<moat::session_store> make(asio::any_io_executor ex,
                                              std::chrono::milliseconds lock_wait = 2s) {
        if (redis) {
            if (!server) server = std::make_unique<moat::test::redis_server>();
            auto made = moat::make_redis_session_store(std::move(ex), server->unix_config());
            REQUIRE(made);
            return std::move(*made);
        }
        if (!host) return memory;
        moat::host_store_options o;
        o.directory = dir.path;
        o.lock_wait = lock_wait;
        return moat::make_host_session_store(std::move(ex), o);
    }
};

struct event_log {
    std::vector<moat::manager_event> events;
    std::size_t count(moat::manager_event::kind k) const {
        std::size_t n = 0;
        for (const auto& e : events) n += e.what == k ? 1 : 0;
        return n;
    }
    std::size_t ended(moat::end_reason reason) const {
        std::size_t n = 0;
        for (const auto& e : events)
            n += e.what == moat::manager_event::kind::ended && e.reason == reason ? 1 : 0;
        return n;
    }
};

// One worker: its own backend, runtime and manager; every worker logs into one shared log.
struct worker {
    worker(asio::io_context& io, std::shared_ptr<moat::session_store> store, event_log& log,
           const std::string& test_label, std::chrono::milliseconds idle = 10min)
        : local(moat::make_local_backend(io.get_executor())), rt(*local) {
        moat::manager_options o;
        o.spec.labels["test"] = test_label;
        o.idle_timeout = idle;
        o.claim_lease = 2s;
        // Another worker's backend attaches to it (the shared stores set this themselves).
        o.spec.survive_owner = true;
        o.on_event = [&log](const moat::manager_event& e) { log.events.push_back(e); };
        manager = std::make_unique<moat::session_manager>(rt, o, std::move(store));
    }
    std::unique_ptr<moat::backend> local;
    moat::runtime rt;
    std::unique_ptr<moat::session_manager> manager;
};

using lease_slot = std::optional<moat::result<moat::session_lease>>;

asio::awaitable<void> acquire_into(moat::session_manager& m, std::string key,
                                   std::shared_ptr<lease_slot> out) {
    *out = co_await m.async_acquire(std::move(key), moat::deadline::after(60s));
}

template <class Slots>
bool all_done(const Slots& slots) {
    for (const auto& s : slots)
        if (!s->has_value()) return false;
    return true;
}

asio::awaitable<void> tick_into(int& ticks) {
    for (int i = 0; i < 10; ++i) {
        co_await pause(10ms);
        ++ticks;
    }
}

void shut_down_all(local_fixture& f, std::vector<std::unique_ptr<worker>>& workers) {
    for (auto& w : workers) (void)f.run(w->manager->async_shutdown(5s));
    workers.clear();
}

}  // namespace

TEST_CASE("errc::store_unavailable is 19, named, and of the unavailable kind") {
    CHECK(static_cast<int>(moat::errc::store_unavailable) == 19);
    CHECK(std::string(moat::to_string(moat::errc::store_unavailable)) == "store_unavailable");
    CHECK(moat::make_error_code(moat::errc::store_unavailable) == moat::condition::unavailable);
}

TEST_CASE(
    "a store grants one claim at a time, fences an expired holder, announces a rebuild once and "
    "keeps an ended marker for its time, over the memory, host and Redis stores") {
    for (const std::string kind : {"memory", "host", "redis"}) {
        CAPTURE(kind);
        local_fixture f;
        store_maker maker;
        maker.use(kind);
        auto store = maker.make(f.io.get_executor());
        const auto limit = moat::deadline::after(10s);
        auto first = f.run(store->async_claim("k", "", 200ms, limit));
        REQUIRE(first);
        REQUIRE(first->token);
        auto second = f.run(store->async_claim("k", "", 200ms, limit));
        REQUIRE(second);
        CHECK_FALSE(second->token);
        REQUIRE(second->current);
        CHECK(second->current->claimed);
        CHECK(second->current->sandbox_id.empty());
        // The holder's lease runs out: a successor claims, and the first token is dead.
        f.run(pause(300ms));
        auto renewed = f.run(store->async_renew("k", *first->token, 200ms, limit));
        REQUIRE(renewed);
        CHECK_FALSE(*renewed);
        auto successor = f.run(store->async_claim("k", "", 10s, limit));
        REQUIRE(successor);
        REQUIRE(successor->token);
        CHECK(*successor->token != *first->token);
        auto late = f.run(store->async_commit("k", *first->token, "stale", 0, 60s, limit));
        REQUIRE(late);
        CHECK_FALSE(*late);
        auto committed = f.run(store->async_commit("k", *successor->token, "box-1", 0, 60s, limit));
        REQUIRE(committed);
        CHECK(*committed);
        // A repeat of that commit (its answer was lost) is true and changes nothing; the same
        // token naming another sandbox is not.
        auto repeated = f.run(store->async_commit("k", *successor->token, "box-1", 0, 60s, limit));
        REQUIRE(repeated);
        CHECK(*repeated);
        auto other_box = f.run(store->async_commit("k", *successor->token, "box-2", 0, 60s, limit));
        REQUIRE(other_box);
        CHECK_FALSE(*other_box);
        auto got = f.run(store->async_get("k", limit));
        REQUIRE(got);
        REQUIRE(*got);
        CHECK((*got)->sandbox_id == "box-1");
        CHECK_FALSE((*got)->claimed);

        // Compare-and-set: only a claim that names the current sandbox can replace it.
        auto wrong = f.run(store->async_claim("k", "box-0", 10s, limit));
        REQUIRE(wrong);
        CHECK_FALSE(wrong->token);
        auto rebuild = f.run(store->async_claim("k", "box-1", 10s, limit));
        REQUIRE(rebuild);
        REQUIRE(rebuild->token);
        auto other = f.run(store->async_claim("k", "box-1", 10s, limit));
        REQUIRE(other);
        CHECK_FALSE(other->token);
        REQUIRE(f.run(store->async_commit("k", *rebuild->token, "box-2", 1, 60s, limit)));
        // The notice is taken exactly once.
        auto t1 = f.run(store->async_touch("k", "box-2", 60s, true, limit));
        REQUIRE(t1);
        REQUIRE(*t1);
        CHECK((*t1)->notice);
        auto t2 = f.run(store->async_touch("k", "box-2", 60s, true, limit));
        REQUIRE(t2);
        REQUIRE(*t2);
        CHECK_FALSE((*t2)->notice);
        auto stale_touch = f.run(store->async_touch("k", "box-1", 60s, true, limit));
        REQUIRE(stale_touch);
        CHECK_FALSE(*stale_touch);

        // The shared idle mark: a recent use keeps the entry, an old one lets it go.
        const std::optional<std::chrono::milliseconds> forget;
        auto kept = f.run(store->async_erase("k", "box-2", 10s, forget, limit));
        REQUIRE(kept);
        CHECK_FALSE(*kept);
        f.run(pause(100ms));
        auto gone = f.run(store->async_erase("k", "box-2", 50ms, forget, limit));
        REQUIRE(gone);
        CHECK(*gone);
        auto after = f.run(store->async_get("k", limit));
        REQUIRE(after);
        CHECK_FALSE(*after);

        // An ended marker (an idle end): no sandbox, the generation and notice mark kept; a claim
        // expecting "" takes it, and the commit of the next generation is announced once.
        auto m_claim = f.run(store->async_claim("m", "", 10s, limit));
        REQUIRE(m_claim);
        REQUIRE(m_claim->token);
        REQUIRE(f.run(store->async_commit("m", *m_claim->token, "box-m1", 3, 60s, limit)));
        auto m_taken = f.run(store->async_touch("m", "box-m1", 60s, true, limit));
        REQUIRE(m_taken);
        REQUIRE(*m_taken);
        CHECK((*m_taken)->notice);
        const std::optional<std::chrono::milliseconds> remember = 10s;
        auto marked = f.run(store->async_erase("m", "box-m1", forget, remember, limit));
        REQUIRE(marked);
        CHECK(*marked);
        auto marker = f.run(store->async_get("m", limit));
        REQUIRE(marker);
        REQUIRE(*marker);
        CHECK((*marker)->ended);
        CHECK((*marker)->sandbox_id.empty());
        CHECK((*marker)->generation == 3);
        CHECK((*marker)->noticed == 3);
        CHECK_FALSE((*marker)->claimed);
        auto on_marker = f.run(store->async_touch("m", "box-m1", 60s, true, limit));
        REQUIRE(on_marker);
        CHECK_FALSE(*on_marker);
        auto m_again = f.run(store->async_claim("m", "", 10s, limit));
        REQUIRE(m_again);
        REQUIRE(m_again->token);
        REQUIRE(f.run(store->async_commit("m", *m_again->token, "box-m2", 4, 60s, limit)));
        auto back = f.run(store->async_get("m", limit));
        REQUIRE(back);
        REQUIRE(*back);
        CHECK_FALSE((*back)->ended);
        CHECK((*back)->sandbox_id == "box-m2");
        auto m_told = f.run(store->async_touch("m", "box-m2", 60s, true, limit));
        REQUIRE(m_told);
        REQUIRE(*m_told);
        CHECK((*m_told)->notice);
        auto m_once = f.run(store->async_touch("m", "box-m2", 60s, true, limit));
        REQUIRE(m_once);
        REQUIRE(*m_once);
        CHECK_FALSE((*m_once)->notice);
        // A marker runs out after its time: the key is then as if it had never been used.
        const std::optional<std::chrono::milliseconds> briefly = 100ms;
        REQUIRE(f.run(store->async_erase("m", "box-m2", forget, briefly, limit)));
        f.run(pause(200ms));
        auto forgotten = f.run(store->async_get("m", limit));
        REQUIRE(forgotten);
        CHECK_FALSE(*forgotten);

        // Entries expire with their TTL.
        auto short_claim = f.run(store->async_claim("t", "", 10s, limit));
        REQUIRE(short_claim);
        REQUIRE(short_claim->token);
        REQUIRE(f.run(store->async_commit("t", *short_claim->token, "box-t", 0, 100ms, limit)));
        f.run(pause(200ms));
        auto expired = f.run(store->async_get("t", limit));
        REQUIRE(expired);
        CHECK_FALSE(*expired);
    }
}

TEST_CASE(
    "the host store fails with store_unavailable while a key's lock is held past its "
    "wait, without blocking the executor") {
    local_fixture f;
    store_maker maker;
    maker.host = true;
    auto store = maker.make(f.io.get_executor(), 300ms);
    REQUIRE(f.run(store->async_claim("held", "", 10s, moat::deadline::after(5s))));
    const std::string lock_path = maker.dir.path + "/" + hex("held") + ".lock";
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    // While the lock is taken elsewhere, the executor keeps running other work.
    int ticks = 0;
    f.tasks.spawn(tick_into(ticks));
    auto blocked = f.run(store->async_get("held", moat::deadline::after(5s)));
    REQUIRE_FALSE(blocked);
    CHECK(blocked.error().code == moat::errc::store_unavailable);
    CHECK(ticks > 0);
    // The caller's deadline bounds the wait too.
    auto bounded = f.run(store->async_get("held", moat::deadline::after(50ms)));
    REQUIRE_FALSE(bounded);
    CHECK(bounded.error().code == moat::errc::store_unavailable);
    ::close(fd);
    auto free = f.run(store->async_get("held", moat::deadline::after(5s)));
    REQUIRE(free);
    CHECK(*free);
}

TEST_CASE(
    "eight workers acquiring one key at once share one sandbox, over the memory store and "
    "over the host store") {
    MOAT_REQUIRE_NAMESPACES();
    for (const bool host : {false, true}) {
        CAPTURE(host);
        local_fixture f;
        store_maker maker;
        maker.host = host;
        event_log log;
        const std::string label = host ? "shared-eight-host" : "shared-eight-memory";
        std::vector<std::unique_ptr<worker>> workers;
        for (int i = 0; i < 8; ++i) {
            workers.push_back(
                std::make_unique<worker>(f.io, maker.make(f.io.get_executor()), log, label));
        }
        std::vector<std::shared_ptr<lease_slot>> slots;
        for (auto& w : workers) {
            slots.push_back(std::make_shared<lease_slot>());
            f.tasks.spawn(acquire_into(*w->manager, "conversation-8", slots.back()));
        }
        REQUIRE(f.run(until([&] { return all_done(slots); }, 60s)));
        std::set<std::string> ids;
        for (const auto& s : slots) {
            REQUIRE(**s);
            ids.insert((**s)->box->id());
            CHECK_FALSE((**s)->rebuilt);
        }
        CHECK(ids.size() == 1);
        CHECK(log.count(moat::manager_event::kind::created) == 1);
        CHECK(log.count(moat::manager_event::kind::attached) == 7);
        CHECK(running_with(f, {{"test", label}}) == 1);
        slots.clear();
        REQUIRE(f.run(workers[3]->manager->async_end("conversation-8")));
        CHECK(running_with(f, {{"test", label}}) == 0);
        shut_down_all(f, workers);
    }
}

TEST_CASE(
    "a sandbox destroyed behind two workers' backs is rebuilt once and the notice is given "
    "once") {
    MOAT_REQUIRE_NAMESPACES();
    for (const bool host : {false, true}) {
        CAPTURE(host);
        local_fixture f;
        store_maker maker;
        maker.host = host;
        event_log log;
        const std::string label = host ? "shared-rebuild-host" : "shared-rebuild-memory";
        std::vector<std::unique_ptr<worker>> workers;
        for (int i = 0; i < 2; ++i) {
            workers.push_back(
                std::make_unique<worker>(f.io, maker.make(f.io.get_executor()), log, label));
        }
        auto a = f.run(workers[0]->manager->async_acquire("thread-r"));
        REQUIRE(a);
        auto b = f.run(workers[1]->manager->async_acquire("thread-r"));
        REQUIRE(b);
        const std::string old_id = a->box->id();
        CHECK(b->box->id() == old_id);
        a->reset();
        b->reset();
        REQUIRE(f.run(f.local->async_destroy(old_id)));

        std::vector<std::shared_ptr<lease_slot>> slots;
        for (auto& w : workers) {
            slots.push_back(std::make_shared<lease_slot>());
            f.tasks.spawn(acquire_into(*w->manager, "thread-r", slots.back()));
        }
        REQUIRE(f.run(until([&] { return all_done(slots); }, 60s)));
        REQUIRE(**slots[0]);
        REQUIRE(**slots[1]);
        CHECK((**slots[0])->box->id() == (**slots[1])->box->id());
        CHECK((**slots[0])->box->id() != old_id);
        CHECK(((**slots[0])->rebuilt ? 1 : 0) + ((**slots[1])->rebuilt ? 1 : 0) == 1);
        CHECK(log.count(moat::manager_event::kind::rebuilt) == 1);
        CHECK(running_with(f, {{"test", label}}) == 1);
        slots.clear();
        // The next turns, on either worker, are not told again.
        auto again0 = f.run(workers[0]->manager->async_acquire("thread-r"));
        auto again1 = f.run(workers[1]->manager->async_acquire("thread-r"));
        REQUIRE(again0);
        REQUIRE(again1);
        CHECK_FALSE(again0->rebuilt);
        CHECK_FALSE(again1->rebuilt);
        again0->reset();
        again1->reset();
        REQUIRE(f.run(workers[0]->manager->async_end("thread-r")));
        shut_down_all(f, workers);
    }
}

TEST_CASE(
    "a store entry naming another session's sandbox is refused and the session gets its "
    "own") {
    MOAT_REQUIRE_NAMESPACES();
    for (const bool host : {false, true}) {
        CAPTURE(host);
        local_fixture f;
        store_maker maker;
        maker.host = host;
        event_log log;
        const std::string label = host ? "shared-poison-host" : "shared-poison-memory";
        std::vector<std::unique_ptr<worker>> workers;
        workers.push_back(
            std::make_unique<worker>(f.io, maker.make(f.io.get_executor()), log, label));
        auto victim = f.run(workers[0]->manager->async_acquire("tenant-a"));
        REQUIRE(victim);
        const std::string victim_id = victim->box->id();
        victim->reset();
        // Someone with write access to the store points tenant-b at tenant-a's sandbox.
        auto store = maker.make(f.io.get_executor());
        const auto limit = moat::deadline::after(10s);
        auto claim = f.run(store->async_claim("tenant-b", "", 10s, limit));
        REQUIRE(claim);
        REQUIRE(claim->token);
        REQUIRE(f.run(store->async_commit("tenant-b", *claim->token, victim_id, 0, 60s, limit)));

        workers.push_back(
            std::make_unique<worker>(f.io, maker.make(f.io.get_executor()), log, label));
        auto intruder = f.run(workers[1]->manager->async_acquire("tenant-b"));
        REQUIRE(intruder);
        CHECK(intruder->box->id() != victim_id);
        CHECK(intruder->box->info().labels.at("moat.session") == "tenant-b");
        CHECK(log.count(moat::manager_event::kind::entry_refused) == 1);
        // tenant-a's sandbox was neither handed out nor touched.
        auto seen = f.run(f.local->async_inspect(victim_id));
        REQUIRE(seen);
        CHECK(seen->state == moat::sandbox_state::running);
        intruder->reset();
        REQUIRE(f.run(workers[1]->manager->async_end("tenant-b")));
        REQUIRE(f.run(workers[0]->manager->async_end("tenant-a")));
        CHECK(running_with(f, {{"test", label}}) == 0);
        shut_down_all(f, workers);
    }
}

TEST_CASE(
    "the idle timeout with two alternating workers never ends an active session and ends "
    "an idle one once, over the memory, host and Redis stores") {
    MOAT_REQUIRE_NAMESPACES();
    for (const std::string kind : {"memory", "host", "redis"}) {
        CAPTURE(kind);
        local_fixture f;
        store_maker maker;
        maker.use(kind);
        event_log log;
        const std::string label = "shared-idle-" + kind;
        std::vector<std::unique_ptr<worker>> workers;
        for (int i = 0; i < 2; ++i) {
            workers.push_back(
                std::make_unique<worker>(f.io, maker.make(f.io.get_executor()), log, label, 400ms));
        }
        std::string id;
        // Each worker alone leaves 500 ms between its own uses, more than the 400 ms idle
        // timeout; together they use the session every 250 ms.
        for (int turn = 0; turn < 12; ++turn) {
            auto got = f.run(workers[turn % 2]->manager->async_acquire("thread-idle"));
            REQUIRE(got);
            if (id.empty()) id = got->box->id();
            CHECK(got->box->id() == id);
            got->reset();
            f.run(pause(250ms));
        }
        CHECK(log.ended(moat::end_reason::idle_timeout) == 0);
        CHECK(log.count(moat::manager_event::kind::created) == 1);
        // Idle: it ends, once, and its sandbox is gone.
        REQUIRE(f.run(until([&] { return log.ended(moat::end_reason::idle_timeout) == 1; }, 20s)));
        f.run(pause(1s));
        CHECK(log.ended(moat::end_reason::idle_timeout) == 1);
        CHECK(running_with(f, {{"test", label}}) == 0);
        // The conversation comes back: its new sandbox is a rebuild, announced to one worker.
        auto back = f.run(workers[1]->manager->async_acquire("thread-idle"));
        REQUIRE(back);
        CHECK(back->rebuilt);
        CHECK(back->box->id() != id);
        const std::string back_id = back->box->id();
        back->reset();
        auto other = f.run(workers[0]->manager->async_acquire("thread-idle"));
        REQUIRE(other);
        CHECK_FALSE(other->rebuilt);
        CHECK(other->box->id() == back_id);
        other->reset();
        CHECK(log.count(moat::manager_event::kind::rebuilt) == 1);
        REQUIRE(f.run(workers[0]->manager->async_end("thread-idle")));
        CHECK(running_with(f, {{"test", label}}) == 0);
        shut_down_all(f, workers);
    }
}

TEST_CASE(
    "a claim whose holder stopped renewing is taken over after its lease, and the late "
    "holder cannot commit") {
    MOAT_REQUIRE_NAMESPACES();
    for (const bool host : {false, true}) {
        CAPTURE(host);
        local_fixture f;
        store_maker maker;
        maker.host = host;
        event_log log;
        const std::string label = host ? "shared-takeover-host" : "shared-takeover-memory";
        auto dead = maker.make(f.io.get_executor());
        const auto limit = moat::deadline::after(10s);
        // A worker that claimed and then stopped (it never renews).
        auto stuck = f.run(dead->async_claim("thread-t", "", 500ms, limit));
        REQUIRE(stuck);
        REQUIRE(stuck->token);
        std::vector<std::unique_ptr<worker>> workers;
        workers.push_back(
            std::make_unique<worker>(f.io, maker.make(f.io.get_executor()), log, label));
        auto got =
            f.run(workers[0]->manager->async_acquire("thread-t", moat::deadline::after(20s)));
        REQUIRE(got);
        auto late = f.run(dead->async_commit("thread-t", *stuck->token, "late", 0, 60s, limit));
        REQUIRE(late);
        CHECK_FALSE(*late);
        auto entry = f.run(dead->async_get("thread-t", limit));
        REQUIRE(entry);
        REQUIRE(*entry);
        CHECK((*entry)->sandbox_id == got->box->id());
        got->reset();
        REQUIRE(f.run(workers[0]->manager->async_end("thread-t")));
        shut_down_all(f, workers);
    }
}

TEST_CASE(
    "while another worker holds the claim, an acquire fails at its deadline and creates "
    "nothing") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture f;
    store_maker maker;
    event_log log;
    const auto limit = moat::deadline::after(10s);
    auto store = maker.make(f.io.get_executor());
    auto held = f.run(store->async_claim("thread-w", "", 30s, limit));
    REQUIRE(held);
    REQUIRE(held->token);
    std::vector<std::unique_ptr<worker>> workers;
    workers.push_back(std::make_unique<worker>(f.io, store, log, "shared-wait"));
    auto got = f.run(workers[0]->manager->async_acquire("thread-w", moat::deadline::after(300ms)));
    REQUIRE_FALSE(got);
    CHECK(got.error().code == moat::errc::deadline_exceeded);
    CHECK(log.count(moat::manager_event::kind::created) == 0);
    CHECK(running_with(f, {{"test", "shared-wait"}}) == 0);
    CHECK(workers[0]->manager->acquiring() == 0);
    shut_down_all(f, workers);
}

TEST_CASE(
    "a failing store fails the acquire with store_unavailable and no sandbox, unless the "
    "local fallback is chosen") {
    MOAT_REQUIRE_NAMESPACES();
    local_fixture f;
    store_maker maker;
    maker.host = true;
    event_log log;
    // A real failure: the key's lock is held by someone else for longer than the store waits.
    auto store = maker.make(f.io.get_executor(), 200ms);
    REQUIRE(f.run(store->async_get("thread-f", moat::deadline::after(5s))));
    const std::string lock_path = maker.dir.path + "/" + hex("thread-f") + ".lock";
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    std::vector<std::unique_ptr<worker>> workers;
    workers.push_back(std::make_unique<worker>(f.io, store, log, "shared-fail"));
    auto got = f.run(workers[0]->manager->async_acquire("thread-f", moat::deadline::after(5s)));
    REQUIRE_FALSE(got);
    CHECK(got.error().code == moat::errc::store_unavailable);
    CHECK(got.error().code == moat::condition::unavailable);
    CHECK(log.count(moat::manager_event::kind::created) == 0);
    CHECK(running_with(f, {{"test", "shared-fail"}}) == 0);

    // The explicit fallback serves it from this worker alone, and says so.
    {
        moat::manager_options o;
        o.spec.labels["test"] = "shared-fail";
        o.local_fallback = true;
        o.on_event = [&log](const moat::manager_event& e) { log.events.push_back(e); };
        moat::runtime rt(*f.local);
        moat::session_manager fallback(rt, o, store);
        auto served = f.run(fallback.async_acquire("thread-f", moat::deadline::after(10s)));
        REQUIRE(served);
        CHECK(log.count(moat::manager_event::kind::store_fallback) == 1);
        served->reset();
        REQUIRE(f.run(fallback.async_end("thread-f")));
        (void)f.run(fallback.async_shutdown(5s));
    }
    ::close(fd);
    // Once the store answers again, the acquire succeeds.
    auto later = f.run(workers[0]->manager->async_acquire("thread-f", moat::deadline::after(10s)));
    REQUIRE(later);
    later->reset();
    REQUIRE(f.run(workers[0]->manager->async_end("thread-f")));
    CHECK(running_with(f, {{"test", "shared-fail"}}) == 0);
    shut_down_all(f, workers);
}

// --- Worker processes over the host store and over Redis ---

namespace {

// A store for worker processes: host:DIR, or a redis-server of the test's own (with a key
// prefix, as an application would set).
struct process_store {
    explicit process_store(const std::string& kind) {
        if (kind == "redis") {
            server = std::make_unique<moat::test::redis_server>();
            url = server->unix_url() + "?prefix=mw:";
        } else {
            url = "host:" + dir.path;
        }
    }
    store_directory dir;
    std::unique_ptr<moat::test::redis_server> server;
    std::string url;
};

}  // namespace

TEST_CASE(
    "eight worker processes acquiring one key at once share one sandbox, over the host store "
    "and over Redis") {
    MOAT_REQUIRE_NAMESPACES();
    for (const std::string kind : {"host", "redis"}) {
        CAPTURE(kind);
        local_fixture f;
        process_store shared(kind);
        const std::string store = shared.url;
        std::vector<moat::test::worker_process> children;
        for (int i = 0; i < 8; ++i) {
            children.push_back(start_worker(
                {store, "proc-8", "acquire", "--label", "test=shared-proc-eight-" + kind}));
        }
        const auto [ids, rebuilt] = moat::test::collect_acquires(children);
        CHECK(ids.size() == 1);
        CHECK_FALSE(ids.begin()->empty());
        CHECK(rebuilt == 0);
        CHECK(running_with(f, {{"test", "shared-proc-eight-" + kind}}) == 1);
        auto ender = start_worker({store, "proc-8", "end"});
        CHECK(read_line(ender, "ended") == "ended");
        CHECK(finish(ender) == 0);
        CHECK(running_with(f, {{"test", "shared-proc-eight-" + kind}}) == 0);
    }
}

TEST_CASE(
    "a worker process killed in the middle of its create is taken over after its lease, "
    "and its half-made sandbox is destroyed, over the host store and over Redis") {
    MOAT_REQUIRE_NAMESPACES();
    for (const std::string kind : {"host", "redis"}) {
        CAPTURE(kind);
        local_fixture f;
        process_store shared(kind);
        const std::string store = shared.url;
        auto doomed =
            start_worker({store, "proc-kill", "acquire", "--label", "test=shared-proc-kill-" + kind,
                          "--lease-ms", "1000", "--hang-in-seed"});
        const auto seeding = read_line(doomed, "seeding");
        const std::string half_made = field(seeding, "id");
        REQUIRE_FALSE(half_made.empty());
        REQUIRE(::kill(doomed.pid, SIGKILL) == 0);
        CHECK(finish(doomed) == 128 + SIGKILL);
        CHECK(running_with(f, {{"test", "shared-proc-kill-" + kind}}) ==
              1);  // left behind by the dead

        auto successor = start_worker({store, "proc-kill", "acquire", "--label",
                                       "test=shared-proc-kill-" + kind, "--lease-ms", "1000"});
        const auto line = read_line(successor, "id=");
        CAPTURE(line);
        CHECK(finish(successor) == 0);
        const std::string id = field(line, "id");
        REQUIRE_FALSE(id.empty());
        CHECK(id != half_made);
        auto old = f.run(f.local->async_inspect(half_made));
        CHECK((!old || old->state == moat::sandbox_state::exited));
        CHECK(running_with(f, {{"test", "shared-proc-kill-" + kind}}) == 1);
        auto ender = start_worker({store, "proc-kill", "end"});
        CHECK(read_line(ender, "ended") == "ended");
        CHECK(finish(ender) == 0);
        CHECK(running_with(f, {{"test", "shared-proc-kill-" + kind}}) == 0);
    }
}

TEST_CASE(
    "worker processes that find the session's sandbox destroyed rebuild it once and one of "
    "them gives the notice, over the host store and over Redis") {
    MOAT_REQUIRE_NAMESPACES();
    for (const std::string kind : {"host", "redis"}) {
        CAPTURE(kind);
        local_fixture f;
        process_store shared(kind);
        const std::string store = shared.url;
        auto first = start_worker(
            {store, "proc-r", "acquire", "--label", "test=shared-proc-rebuild-" + kind});
        const std::string old_id = field(read_line(first, "id="), "id");
        CHECK(finish(first) == 0);
        REQUIRE_FALSE(old_id.empty());
        REQUIRE(f.run(f.local->async_destroy(old_id)));
        std::vector<moat::test::worker_process> children;
        for (int i = 0; i < 4; ++i) {
            children.push_back(start_worker(
                {store, "proc-r", "acquire", "--label", "test=shared-proc-rebuild-" + kind}));
        }
        const auto [ids, rebuilt] = moat::test::collect_acquires(children);
        CHECK(ids.size() == 1);
        CHECK(*ids.begin() != old_id);
        CHECK(rebuilt == 1);
        CHECK(running_with(f, {{"test", "shared-proc-rebuild-" + kind}}) == 1);
        auto ender = start_worker({store, "proc-r", "end"});
        CHECK(read_line(ender, "ended") == "ended");
        CHECK(finish(ender) == 0);
        CHECK(running_with(f, {{"test", "shared-proc-rebuild-" + kind}}) == 0);
    }
}

namespace {

// The real store, whose commit answers are lost on demand: the commit runs in the store, then
// the caller gets the error a dropped connection gives (the outcome unknown to it).
class lost_commit_answers final : public moat::session_store {
  public:
    lost_commit_answers(std::shared_ptr<moat::session_store> real, int lose)
        : real_(std::move(real)), lose_(lose) {}
    int commits = 0;

    asio::awaitable<moat::result<std::optional<moat::session_record>>> async_get(
        std::string key, moat::deadline limit) override {
        return real_->async_get(std::move(key), limit);
    }
    asio::awaitable<moat::result<moat::session_claim>> async_claim(std::string key,
                                                                   std::string expected,
                                                                   std::chrono::milliseconds lease,
                                                                   moat::deadline limit) override {
        return real_->async_claim(std::move(key), std::move(expected), lease, limit);
    }
    asio::awaitable<moat::result<bool>> async_renew(std::string key, std::string token,
                                                    std::chrono::milliseconds lease,
                                                    moat::deadline limit) override {
        return real_->async_renew(std::move(key), std::move(token), lease, limit);
    }
    asio::awaitable<moat::result<bool>> async_commit(std::string key, std::string token,
                                                     std::string sandbox_id,
                                                     std::uint64_t generation,
                                                     std::chrono::milliseconds ttl,
                                                     moat::deadline limit) override {
        ++commits;
        auto committing = real_->async_commit(std::move(key), std::move(token),
                                              std::move(sandbox_id), generation, ttl, limit);
        auto committed = co_await std::move(committing);
        if (lose_ > 0) {
            --lose_;
            co_return moat::make_error(moat::errc::store_unavailable,
                                       "the connection to the store dropped before its answer");
        }
        co_return committed;
    }
    asio::awaitable<moat::result<void>> async_release(std::string key, std::string token,
                                                      moat::deadline limit) override {
        return real_->async_release(std::move(key), std::move(token), limit);
    }
    asio::awaitable<moat::result<std::optional<moat::session_touch>>> async_touch(
        std::string key, std::string sandbox_id, std::chrono::milliseconds ttl, bool take_notice,
        moat::deadline limit) override {
        return real_->async_touch(std::move(key), std::move(sandbox_id), ttl, take_notice, limit);
    }
    asio::awaitable<moat::result<bool>> async_erase(
        std::string key, std::string sandbox_id,
        std::optional<std::chrono::milliseconds> unused_at_least,
        std::optional<std::chrono::milliseconds> remember_for, moat::deadline limit) override {
        return real_->async_erase(std::move(key), std::move(sandbox_id), unused_at_least,
                                  remember_for, limit);
    }
    bool is_shared() const noexcept override { return real_->is_shared(); }

  private:
    std::shared_ptr<moat::session_store> real_;
    int lose_;
};

}  // namespace

TEST_CASE(
    "a commit whose answer is lost is tried again with its token, and the sandbox the store "
    "names is never destroyed, over the host and Redis stores") {
    MOAT_REQUIRE_NAMESPACES();
    for (const std::string kind : {"host", "redis"}) {
        CAPTURE(kind);
        local_fixture f;
        store_maker maker;
        maker.use(kind);
        event_log log;
        const std::string label = "lost-commit-" + kind;
        // One answer lost: the retry confirms the commit, the acquire succeeds.
        auto once = std::make_shared<lost_commit_answers>(maker.make(f.io.get_executor()), 1);
        worker first(f.io, once, log, label);
        auto lease = f.run(first.manager->async_acquire("k"));
        REQUIRE_MESSAGE(lease, lease.error().to_string());
        const std::string id = lease->box->id();
        CHECK(once->commits == 2);
        auto seen = f.run(f.local->async_inspect(id));
        REQUIRE(seen);
        CHECK(seen->state == moat::sandbox_state::running);
        auto store = maker.make(f.io.get_executor());
        auto named = f.run(store->async_get("k", moat::deadline::after(10s)));
        REQUIRE(named);
        REQUIRE(*named);
        CHECK((*named)->sandbox_id == id);
        lease->reset();
        REQUIRE(f.run(first.manager->async_end("k")));

        // Every answer lost: the acquire fails, but the sandbox the store now names lives on,
        // and the next acquire gets it.
        auto always = std::make_shared<lost_commit_answers>(maker.make(f.io.get_executor()), 100);
        worker second(f.io, always, log, label);
        auto failed = f.run(second.manager->async_acquire("k2"));
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code == moat::errc::store_unavailable);
        CHECK(always->commits == 3);
        auto entry = f.run(store->async_get("k2", moat::deadline::after(10s)));
        REQUIRE(entry);
        REQUIRE(*entry);
        const std::string kept = (*entry)->sandbox_id;
        worker third(f.io, maker.make(f.io.get_executor()), log, label);
        auto again = f.run(third.manager->async_acquire("k2"));
        REQUIRE_MESSAGE(again, again.error().to_string());
        CHECK(again->box->id() == kept);
        again->reset();
        REQUIRE(f.run(third.manager->async_end("k2")));
        CHECK(running_with(f, {{"test", label}}) == 0);
        for (auto* w : {&first, &second, &third}) {
            f.run(w->manager->async_shutdown());
        }
        f.shut_down();
    }
}
