#include "cli/sandbox_report.hpp"

#include "core/limits_json.hpp"
#include "core/rfc3339.hpp"

#include <cstdio>
#include <ctime>

namespace moat::cli {

std::string format_utc(std::chrono::system_clock::time_point t) {
    return detail::format_rfc3339(t);
}

std::string format_span(std::chrono::system_clock::duration d) {
    const bool negative = d < d.zero();
    long long s = std::chrono::duration_cast<std::chrono::seconds>(negative ? -d : d).count();
    char text[40];
    if (s < 60) {
        std::snprintf(text, sizeof text, "%llds", s);
    } else if (s < 3600) {
        std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
    } else if (s < 86400) {
        std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, s % 3600 / 60);
    } else {
        std::snprintf(text, sizeof text, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
    }
    return (negative ? "-" : "") + std::string(text);
}

namespace {

// The value, or null when there is none.
template <class T>
void write_optional(json_writer& w, const char* key, const std::optional<T>& value) {
    w.key(key);
    if (value) {
        w.value(*value);
    } else {
        w.null();
    }
}

}  // namespace

void write_sandbox_json(json_writer& w, const sandbox_info& info) {
    w.begin_object();
    w.key("id").value(info.id);
    w.key("state").value(to_string(info.state));
    w.key("created_at").value(format_utc(info.created_at));
    w.key("expires_at").value(format_utc(info.expires_at));
    w.key("host_pid");
    if (info.host_pid) {
        w.value(*info.host_pid);
    } else {
        w.null();
    }
    w.key("owned").value(info.owned);
    w.key("survive_owner").value(info.survive_owner);
    w.key("owner_instance").value(info.owner_instance);
    w.key("labels").begin_object();
    for (const auto& [k, v] : info.labels) w.key(k).value(v);
    w.end_object();
    write_optional(w, "memory_used_bytes", info.memory_used_bytes);
    write_optional(w, "pids_current", info.pids_current);
    write_optional(w, "cpu_time_us", info.cpu_time_us);
    write_optional(w, "disk_used_bytes", info.disk_used_bytes);
    write_optional(w, "disk_total_bytes", info.disk_total_bytes);
    write_optional(w, "egress_bytes_used", info.egress_bytes_used);
    write_optional(w, "egress_buffered_bytes", info.egress_buffered_bytes);
    w.key("layers").begin_array();
    for (const auto& layer : info.layers) w.value(layer);
    w.end_array();
    w.key("limits");
    write_limits_json(w, info.limits);
    w.key("layout").begin_object();
    w.key("user").value(info.layout.user).key("home").value(info.layout.home);
    w.key("workdir").value(info.layout.workdir);
    w.key("artifacts_dir").value(info.layout.artifacts_dir);
    w.end_object();
    w.key("network").begin_object();
    w.key("mode").value(to_string(info.network.mode));
    for (const auto& [name, list] : {std::pair{"allow_hosts", &info.network.allow_hosts},
                                     std::pair{"resolve", &info.network.resolve},
                                     std::pair{"allow_addresses", &info.network.allow_addresses}}) {
        w.key(name).begin_array();
        for (const auto& entry : *list) w.value(entry);
        w.end_array();
    }
    w.end_object();
    w.end_object();
}

std::string sandboxes_json(const std::vector<sandbox_info>& sandboxes) {
    json_writer w;
    w.begin_array();
    for (const auto& info : sandboxes) write_sandbox_json(w, info);
    w.end_array();
    return w.take() + "\n";
}

}  // namespace moat::cli
