#include "serve/sandbox_listing.hpp"

#include "core/base64.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>

namespace moat::serve {
namespace {

std::int64_t unix_ms(std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// The cursor of the page after the one ending at `last`: base64url of "<ms>__<id>[__asc]".
std::string next_token(const registry_entry& last, bool descending) {
    std::string cursor = std::to_string(unix_ms(last.started_at)) + "__" + last.id;
    if (!descending) cursor += "__asc";
    return base64url_encode(cursor);
}

std::optional<std::pair<std::int64_t, std::string>> parse_next_token(std::string_view token,
                                                                     bool descending) {
    const auto decoded = base64url_decode(token);
    if (!decoded) return std::nullopt;
    const std::string_view suffix = "__asc";
    std::string_view text = *decoded;
    const bool asc = text.ends_with(suffix);
    if (asc) text.remove_suffix(suffix.size());
    const auto sep = text.find("__");
    long long ms = 0;
    if (sep == std::string_view::npos || asc == descending || sep + 2 >= text.size() ||
        std::from_chars(text.data(), text.data() + sep, ms).ptr != text.data() + sep)
        return std::nullopt;
    return std::make_pair(static_cast<std::int64_t>(ms), std::string(text.substr(sep + 2)));
}

bool matches(const registry_entry& e, const e2b_protocol::list_request& q) {
    for (const auto& [k, v] : q.metadata) {
        const auto it = e.metadata.find(k);
        if (it == e.metadata.end() || it->second != v) return false;
    }
    if (!q.template_id.empty() && q.template_id != e.template_id) return false;
    if (q.started_after && e.started_at <= *q.started_after) return false;
    return true;
}

}  // namespace

result<list_query> parse_list_query(std::string_view raw, bool paged) {
    auto request = e2b_protocol::parse_list_request(raw, paged);
    if (!request) return std::move(request).error();
    list_query q;
    q.request = std::move(*request);
    const auto& r = q.request;
    q.paused = paged;
    if (!r.state.empty()) {
        const std::string states = "," + r.state + ",";
        q.running = states.find(",running,") != std::string::npos;
        q.paused = states.find(",paused,") != std::string::npos;
    }
    if (!r.order.empty()) q.descending = r.order == "desc";
    q.limit = r.limit.value_or(100);
    if (!r.next_token.empty()) {
        q.after = parse_next_token(r.next_token, q.descending);
        if (!q.after) return make_error(errc::invalid_argument, "Invalid next token");
    }
    return q;
}

list_page select_page(std::vector<std::shared_ptr<registry_entry>> live, const list_query& q,
                      bool paged) {
    list_page page;
    std::vector<std::shared_ptr<registry_entry>>& picked = page.entries;
    for (auto& e : live) {
        const bool wanted = e->paused ? q.paused : q.running;
        if (wanted && matches(*e, q.request)) picked.push_back(std::move(e));
    }
    const auto key = [](const registry_entry& e) {
        return std::make_pair(unix_ms(e.started_at), std::string_view(e.id));
    };
    std::sort(picked.begin(), picked.end(), [&](const auto& a, const auto& b) {
        return q.descending ? key(*b) < key(*a) : key(*a) < key(*b);
    });
    page.total = picked.size();
    if (q.after) {
        const auto cursor = std::make_pair(q.after->first, std::string_view(q.after->second));
        std::erase_if(picked, [&](const auto& e) {
            return q.descending ? !(key(*e) < cursor) : !(cursor < key(*e));
        });
    }
    if (paged && picked.size() > q.limit) {
        picked.resize(q.limit);
        page.next_token = next_token(*picked.back(), q.descending);
    }
    return page;
}

}  // namespace moat::serve
