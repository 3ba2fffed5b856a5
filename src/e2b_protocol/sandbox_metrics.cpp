#include "e2b_protocol/sandbox_metrics.hpp"

#include "core/json_writer.hpp"
#include "e2b_protocol/sandbox_requests.hpp"

#include <algorithm>
#include <charconv>

namespace moat::e2b_protocol {
namespace {

constexpr std::int64_t max_unix_seconds = std::int64_t{1} << 40;

result<std::optional<std::int64_t>> seconds_parameter(
    const std::map<std::string, std::string>& query, const char* name) {
    const auto it = query.find(name);
    if (it == query.end()) return std::optional<std::int64_t>();
    const std::string& text = it->second;
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0 ||
        value > max_unix_seconds) {
        return make_error(errc::invalid_argument,
                          std::string("'") + name + "' must be a unix time in whole seconds");
    }
    return std::optional<std::int64_t>(value);
}

void write_metric(json_writer& w, const sandbox_metric& m) {
    const auto unix_seconds =
        std::chrono::duration_cast<std::chrono::seconds>(m.at.time_since_epoch()).count();
    w.begin_object();
    w.key("timestamp").value(format_rfc3339(m.at));
    w.key("timestampUnix").value(static_cast<std::int64_t>(unix_seconds));
    w.key("cpuCount").value(static_cast<std::uint64_t>(m.cpu_count));
    w.key("cpuUsedPct").value(m.cpu_used_percent);
    w.key("memUsed").value(m.mem_used);
    w.key("memTotal").value(m.mem_total);
    w.key("memCache").value(m.mem_cache);
    w.key("diskUsed").value(m.disk_used);
    w.key("diskTotal").value(m.disk_total);
    w.end_object();
}

}  // namespace

result<metrics_request> parse_metrics_request(std::string_view query) {
    auto parsed = parse_query(query);
    if (!parsed) return std::move(parsed).error();
    metrics_request r;
    auto start = seconds_parameter(*parsed, "start");
    if (!start) return std::move(start).error();
    auto end = seconds_parameter(*parsed, "end");
    if (!end) return std::move(end).error();
    r.start = *start;
    r.end = *end;
    if (r.start && r.end && *r.start > *r.end) {
        return make_error(errc::invalid_argument, "'start' is after 'end'");
    }
    return r;
}

result<std::vector<std::string>> parse_metrics_list_request(std::string_view query) {
    auto parsed = parse_query(query);
    if (!parsed) return std::move(parsed).error();
    const auto it = parsed->find("sandbox_ids");
    if (it == parsed->end() || it->second.empty()) {
        return make_error(errc::invalid_argument, "'sandbox_ids' is required");
    }
    std::vector<std::string> ids;
    std::string_view rest = it->second;
    while (true) {
        const auto comma = rest.find(',');
        const auto id = rest.substr(0, comma);
        if (id.empty()) return make_error(errc::invalid_argument, "'sandbox_ids' has an empty id");
        if (std::find(ids.begin(), ids.end(), id) != ids.end()) {
            return make_error(errc::invalid_argument, "'sandbox_ids' names a sandbox twice");
        }
        if (ids.size() == max_metrics_sandboxes) {
            return make_error(errc::invalid_argument, "'sandbox_ids' names more than " +
                                                          std::to_string(max_metrics_sandboxes) +
                                                          " sandboxes");
        }
        ids.emplace_back(id);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
    }
    return ids;
}

std::string encode_sandbox_metrics(const std::vector<sandbox_metric>& metrics) {
    json_writer w;
    w.begin_array();
    for (const auto& m : metrics) write_metric(w, m);
    w.end_array();
    return w.take();
}

std::string encode_sandboxes_with_metrics(const std::map<std::string, sandbox_metric>& latest) {
    json_writer w;
    w.begin_object().key("sandboxes").begin_object();
    for (const auto& [id, m] : latest) {
        w.key(id);
        write_metric(w, m);
    }
    w.end_object().end_object();
    return w.take();
}

}  // namespace moat::e2b_protocol
