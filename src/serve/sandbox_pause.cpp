// `moat serve`'s pause and resume (sandbox_pause.hpp is the contract).
#include "serve/sandbox_pause.hpp"

#include <moat/log.hpp>

#include "core/asio_compat.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <vector>

namespace moat::serve {

struct resume_attempt {
    explicit resume_attempt(asio::any_io_executor executor) : done(std::move(executor)) {}
    async_event done;
    result<void> outcome = make_error(errc::cancelled, "the resume was stopped");
};

namespace {

constexpr auto pause_bound = std::chrono::seconds(10);

// Ends the paused sandboxes paused longest ago while those paused hold more memory together than
// the budget allows.
asio::awaitable<void> hold_paused_budget(serve_context& context) {
    const std::uint64_t budget = context.options.paused_memory_bytes;
    if (budget == 0) co_return;
    std::vector<std::pair<std::shared_ptr<registry_entry>, std::uint64_t>> paused;
    std::uint64_t total = 0;
    for (const auto& e : context.registry.live()) {
        if (!e->paused || !e->handle || e->ended.is_set()) continue;
        auto reading = co_await e->handle->async_usage(deadline::after(pause_bound));
        const std::uint64_t bytes = reading ? reading->memory_used_bytes.value_or(0) : 0;
        paused.emplace_back(e, bytes);
        total += bytes;
    }
    std::sort(paused.begin(), paused.end(),
              [](const auto& a, const auto& b) { return a.first->paused_at < b.first->paused_at; });
    auto& sandboxes = context.sandboxes.get_backend();
    for (const auto& [e, bytes] : paused) {
        if (total <= budget) break;
        detail::log(log_level::info, "serve",
                    "ended: the paused sandboxes hold more memory than --paused-memory-mb", e->id);
        auto destroyed = co_await context.registry.async_destroy(e, sandboxes);
        if (destroyed) total -= bytes;
    }
}

// Sets the entry's end `ttl` from now (an autoPause one's moat TTL auto_pause_grace more).
asio::awaitable<result<void>> run_for(registry_entry& entry, std::chrono::milliseconds ttl) {
    const std::chrono::milliseconds grace = entry.auto_pause ? auto_pause_grace : ttl.zero();
    auto extended = co_await entry.handle->async_extend_ttl(ttl + grace);
    if (!extended) co_return std::move(extended).error();
    entry.end_at = extended->expires_at - grace;
    co_return result<void>{};
}

// Marks the attempt done however its run ends (a server stop cancels it), waking its joiners.
struct attempt_done {
    std::shared_ptr<registry_entry> entry;
    std::shared_ptr<resume_attempt> attempt;
    ~attempt_done() {
        if (entry->resuming == attempt) entry->resuming.reset();
        attempt->done.set();
    }
};

asio::awaitable<void> run_resume(std::shared_ptr<registry_entry> entry,
                                 std::chrono::milliseconds ttl,
                                 std::shared_ptr<resume_attempt> attempt) {
    attempt_done guard{entry, attempt};
    auto resumed = co_await entry->handle->async_resume(deadline::after(pause_bound));
    if (!resumed) {
        attempt->outcome = std::move(resumed).error();
        co_return;
    }
    entry->paused = false;
    entry->end_at = resumed->expires_at;
    attempt->outcome = co_await run_for(*entry, ttl);
}

// Joins the entry's resume in flight, or starts one (`started`) in the background group, and
// waits for its outcome.
asio::awaitable<result<void>> join_resume(serve_context& context,
                                          std::shared_ptr<registry_entry> entry,
                                          std::chrono::milliseconds ttl, bool& started) {
    auto attempt = entry->resuming;
    started = !attempt;
    if (!attempt) {
        attempt = std::make_shared<resume_attempt>(context.executor);
        entry->resuming = attempt;
        context.background.spawn(run_resume(entry, ttl, attempt));
    }
    while (!attempt->done.is_set()) {
        const auto waited = co_await attempt->done.async_wait(deadline::never());
        if (waited == async_event::wait_outcome::cancelled) {
            co_return make_error(errc::cancelled, "stopped waiting for the resume of " + entry->id);
        }
    }
    co_return attempt->outcome;
}

}  // namespace

void set_lifecycle(registry_entry& entry, bool auto_pause, bool auto_resume,
                   std::chrono::seconds timeout) {
    entry.auto_pause = auto_pause;
    if (auto_pause) entry.end_at -= auto_pause_grace;
    entry.auto_resume = auto_resume;
    entry.auto_resume_ttl = auto_resume_ttl_for(timeout);
}

asio::awaitable<result<void>> pause_entry(serve_context& context,
                                          std::shared_ptr<registry_entry> entry) {
    auto paused = co_await entry->handle->async_pause(deadline::after(pause_bound));
    if (!paused) co_return std::move(paused).error();
    entry->paused = true;
    entry->paused_at = paused->paused_at.value_or(std::chrono::system_clock::now());
    entry->end_at = paused->expires_at;
    co_await hold_paused_budget(context);
    co_return result<void>{};
}

asio::awaitable<result<void>> resume_entry(serve_context& context,
                                           std::shared_ptr<registry_entry> entry,
                                           std::chrono::milliseconds ttl) {
    bool started = false;
    auto resumed = co_await join_resume(context, entry, ttl, started);
    if (!resumed || started) co_return resumed;
    co_return co_await run_for(*entry, ttl);  // another's resume: this caller's end
}

asio::awaitable<result<void>> wake_for_traffic(serve_context& context,
                                               std::shared_ptr<registry_entry> entry) {
    if (!entry->resuming) {
        if (!entry->paused) co_return result<void>{};
        if (!entry->auto_resume) {
            co_return make_error(errc::sandbox_paused,
                                 "the sandbox is paused and was not created with autoResume");
        }
    }
    const std::chrono::milliseconds ttl = entry->auto_resume_ttl;
    bool started = false;
    auto resumed = co_await join_resume(context, entry, ttl, started);
    if (entry->ended.is_set()) co_return make_error(errc::sandbox_not_found, "the sandbox ended");
    co_return resumed;
}

asio::awaitable<void> run_auto_pauser(serve_context& context) {
    asio::steady_timer tick(co_await asio::this_coro::executor);
    for (;;) {
        tick.expires_after(auto_pause_interval);
        auto [waited] = co_await tick.async_wait(as_tuple(asio::use_awaitable));
        if (waited) co_return;  // cancelled: the server stops
        const auto now = std::chrono::system_clock::now();
        for (const auto& entry : context.registry.live()) {
            if (!entry->auto_pause || entry->paused || !entry->handle || entry->ended.is_set() ||
                entry->end_at > now)
                continue;
            auto paused = co_await pause_entry(context, entry);
            if (!paused) {
                detail::log(log_level::warning, "serve",
                            "autoPause failed: " + paused.error().to_string(), entry->id);
            }
            if ((co_await asio::this_coro::cancellation_state).cancelled() !=
                asio::cancellation_type::none) {
                co_return;
            }
        }
    }
}

}  // namespace moat::serve
