// The e2b backend's heartbeat (backend_state.hpp): the E2B timeout of every sandbox it keeps
// alive is renewed, a bounded number at a time, so that a sandbox outlives its owner by at most
// heartbeat_timeout.
#include "e2b/backend_state.hpp"

#include <moat/log.hpp>
#include <moat/task_group.hpp>

#include "core/asio_compat.hpp"
#include "core/async_event.hpp"
#include "e2b/sandbox_mapping.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>

namespace moat::e2b {
namespace {

// The timeout to send now for a heartbeat sandbox: heartbeat_timeout, cut to what is left of its
// TTL (rounded down: never past it); 0 when less than a second is left.
std::int64_t heartbeat_seconds(const backend_state& s, const held_sandbox& h) {
    const auto left = std::chrono::duration_cast<milliseconds>(h.ttl_end - system_clock::now());
    const auto horizon = std::min(left, s.config.heartbeat_timeout);
    return std::max<std::int64_t>(0, horizon.count() / 1000);
}

// Renews one sandbox's E2B timeout. A sandbox found gone is marked so; another failure is
// logged, and the next round tries again.
asio::awaitable<void> renew(std::shared_ptr<backend_state> s, std::string id) {
    const auto it = s->held.find(id);
    if (it == s->held.end() || it->second->gone_reason || it->second->paused) co_return;
    const auto h = it->second;
    const std::int64_t seconds = heartbeat_seconds(*s, *h);
    if (seconds <= 0) co_return;  // its TTL ends it now
    std::string target = id;
    auto renewed = co_await s->control->async_set_timeout(std::move(target), seconds);
    if (s->stopping || renewed) co_return;
    if (renewed.error().code == errc::sandbox_not_found) {
        mark_gone(*s, *h, "it ended (its heartbeat found it gone)");
        detail::log(log_level::warning, "e2b", "heartbeat: the sandbox is gone", id);
    } else {
        detail::log(log_level::warning, "e2b", "heartbeat: " + renewed.error().to_string(), id);
    }
}

// One heartbeat round: its workers take the sandboxes in turn, and the last one out sets `done`.
struct heartbeat_round {
    explicit heartbeat_round(asio::any_io_executor executor) : done(std::move(executor)) {}
    std::vector<std::string> ids;
    std::size_t next = 0;
    std::size_t workers_left = 0;
    async_event done;
};

// Counts a worker out however it ends (a cancellation seen at a co_await throws).
struct worker_exit {
    std::shared_ptr<heartbeat_round> round;
    ~worker_exit() {
        if (--round->workers_left == 0) round->done.set();
    }
};

asio::awaitable<void> renewal_worker(std::shared_ptr<backend_state> s,
                                     std::shared_ptr<heartbeat_round> round) {
    const worker_exit counted_out{round};
    while (!s->stopping && round->next < round->ids.size()) {
        std::string id = round->ids[round->next++];
        co_await renew(s, std::move(id));
    }
}

// Renews `ids`, renewals_in_flight at a time (each renewal bounded by request_timeout), and
// returns once every one had its turn: false when the heartbeat was cancelled meanwhile (the
// renewals in flight are cancelled with it).
asio::awaitable<bool> renew_all(std::shared_ptr<backend_state> s, std::vector<std::string> ids) {
    auto round = std::make_shared<heartbeat_round>(s->executor);
    round->ids = std::move(ids);
    round->workers_left = std::min(s->renewals_in_flight, round->ids.size());
    task_group workers(s->executor, "e2b heartbeat");
    for (std::size_t i = round->workers_left; i > 0; --i) workers.spawn(renewal_worker(s, round));
    const auto ended = co_await round->done.async_wait(deadline::never());
    if (ended != async_event::wait_outcome::set) {
        workers.cancel_all();
        co_return false;
    }
    co_await workers.async_wait_all();
    co_return true;
}

// Every heartbeat_interval after the previous round ended, a round over the heartbeat sandboxes
// held then; rounds never overlap. A round longer than heartbeat_timeout - heartbeat_interval
// lets a sandbox's E2B timeout pass before its next renewal: that is logged.
}  // namespace

asio::awaitable<void> heartbeat_loop(std::shared_ptr<backend_state> s) {
    asio::steady_timer timer(s->executor);
    const auto margin = s->config.heartbeat_timeout - s->config.heartbeat_interval;
    for (;;) {
        timer.expires_after(s->config.heartbeat_interval);
        auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
        if (ec || s->stopping) break;
        std::vector<std::string> ids;
        for (const auto& [id, h] : s->held) {
            if (h->heartbeat && !h->gone_reason) ids.push_back(id);
        }
        if (ids.empty()) break;
        const auto count = std::to_string(ids.size());
        const auto started = std::chrono::steady_clock::now();
        const bool completed = co_await renew_all(s, std::move(ids));
        if (!completed || s->stopping) break;
        const auto took =
            std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - started);
        const auto line = "heartbeat: a round of " + count + " renewals took " +
                          std::to_string(took.count()) + " ms";
        if (took > margin) {
            detail::log(log_level::warning, "e2b",
                        line + ", more than heartbeat_timeout - heartbeat_interval (" +
                            std::to_string(margin.count()) + " ms): timeouts may have passed");
        } else {
            detail::log(log_level::debug, "e2b", line);
        }
    }
    s->heartbeat_running = false;
}

}  // namespace moat::e2b
