#include "serve/sandbox_metrics.hpp"

#include <moat/usage.hpp>

#include "core/asio_compat.hpp"
#include "e2b_protocol/sandbox_metrics.hpp"
#include "serve/control_plane.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <map>

namespace moat::serve {
namespace {

namespace protocol = e2b_protocol;
using system_clock = std::chrono::system_clock;

// How long one sandbox's reading may take before the sampler moves on.
constexpr auto reading_bound = std::chrono::seconds(2);

protocol::sandbox_metric to_metric(const usage_sample& s) {
    protocol::sandbox_metric m;
    m.at = s.usage.at;
    m.cpu_count = s.usage.cpu_count;
    m.cpu_used_percent = s.cpu_used_percent.value_or(0);
    m.mem_used = s.usage.memory_used_bytes.value_or(0);
    m.mem_total = s.usage.memory_limit_bytes;
    m.mem_cache = s.usage.memory_cache_bytes.value_or(0);
    m.disk_used = s.usage.disk_used_bytes.value_or(0);
    m.disk_total = s.usage.disk_total_bytes.value_or(0);
    return m;
}

asio::awaitable<void> send_json(http::server_response& response, std::string body) {
    http::header_list headers;
    headers.add("Content-Type", "application/json");
    (void)co_await response.async_send(200, std::move(headers), std::move(body));
}

system_clock::time_point from_unix(std::int64_t seconds) {
    return system_clock::time_point(std::chrono::seconds(seconds));
}

}  // namespace

asio::awaitable<void> run_metrics_sampler(serve_context& context) {
    asio::steady_timer tick(co_await asio::this_coro::executor);
    for (;;) {
        tick.expires_after(metrics_interval);
        auto [waited] = co_await tick.async_wait(as_tuple(asio::use_awaitable));
        if (waited) co_return;  // cancelled: the server stops
        for (const auto& entry : context.registry.live()) {
            if (!entry->handle || entry->ended.is_set()) continue;
            auto reading = co_await entry->handle->async_usage(deadline::after(reading_bound));
            if (reading) entry->usage->add(*reading);
            if ((co_await asio::this_coro::cancellation_state).cancelled() !=
                asio::cancellation_type::none) {
                co_return;
            }
        }
    }
}

asio::awaitable<void> answer_sandbox_metrics(serve_context& context, http::server_request& request,
                                             http::server_response& response) {
    const std::string id(request.param("id"));
    auto entry = context.registry.find(id);
    if (!entry) {
        (void)co_await response.async_send_error(404, sandbox_not_found_message(id));
        co_return;
    }
    auto query = protocol::parse_metrics_request(request.query());
    if (!query) {
        (void)co_await response.async_send_error(400, query.error().detail);
        co_return;
    }
    const auto from = query->start ? from_unix(*query->start) : system_clock::time_point::min();
    // Second precision, as the query: the end second is included whole.
    const auto to =
        query->end ? from_unix(*query->end) + std::chrono::seconds(1) - std::chrono::nanoseconds(1)
                   : system_clock::time_point::max();
    std::vector<protocol::sandbox_metric> metrics;
    for (const auto& s : entry->usage->between(from, to)) metrics.push_back(to_metric(s));
    co_await send_json(response, protocol::encode_sandbox_metrics(metrics));
}

asio::awaitable<void> answer_sandboxes_metrics(serve_context& context,
                                               http::server_request& request,
                                               http::server_response& response) {
    auto ids = protocol::parse_metrics_list_request(request.query());
    if (!ids) {
        (void)co_await response.async_send_error(400, ids.error().detail);
        co_return;
    }
    std::map<std::string, protocol::sandbox_metric> latest;
    for (const auto& id : *ids) {
        auto entry = context.registry.find(id);
        if (!entry) continue;
        if (auto last = entry->usage->latest()) latest.emplace(id, to_metric(*last));
    }
    co_await send_json(response, protocol::encode_sandboxes_with_metrics(latest));
}

}  // namespace moat::serve
