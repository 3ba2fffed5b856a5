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

}  // namespace

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

asio::awaitable<result<void>> resume_entry(serve_context& context, registry_entry& entry,
                                           std::chrono::milliseconds ttl) {
    (void)context;
    auto resumed = co_await entry.handle->async_resume(deadline::after(pause_bound));
    if (!resumed) co_return std::move(resumed).error();
    entry.paused = false;
    entry.end_at = resumed->expires_at;
    const std::chrono::milliseconds grace = entry.auto_pause ? auto_pause_grace : ttl.zero();
    auto extended = co_await entry.handle->async_extend_ttl(ttl + grace);
    if (!extended) co_return std::move(extended).error();
    entry.end_at = extended->expires_at - grace;
    co_return result<void>{};
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
