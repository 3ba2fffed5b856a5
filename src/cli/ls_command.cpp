// moat ls and moat inventory: every sandbox recorded on this host (the shared state directory),
// whichever process created it: a table for people, or a JSON array with --json. A sandbox whose
// pid 1 is gone but whose record remains (its creator died; the janitor removes it) shows as
// `exited`. The inventory adds the owner instance, current memory and pids usage, the CPU time
// used so far and the writable filesystems' use, and for a sandbox with a network the bytes its
// egress moved and the host memory its tunnels hold.
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/sandbox_report.hpp"

#include <unistd.h>
#include <cstdio>

namespace moat::cli {
namespace {

struct ls_options {
    label_filter filter;
    bool json = false;
    bool inventory = false;
};

std::string megabytes(const std::optional<std::uint64_t>& bytes) {
    if (!bytes) return "-";
    char text[32];
    std::snprintf(text, sizeof text, "%.1fM", static_cast<double>(*bytes) / (1 << 20));
    return text;
}

// CPU time as seconds with one decimal ("12.3s"), or "-".
std::string cpu_seconds(const std::optional<std::uint64_t>& us) {
    if (!us) return "-";
    char text[32];
    std::snprintf(text, sizeof text, "%.1fs", static_cast<double>(*us) / 1e6);
    return text;
}

std::string labels_text(const std::map<std::string, std::string>& labels) {
    std::string text;
    for (const auto& [k, v] : labels) {
        if (!text.empty()) text += ',';
        text += k + "=" + v;
    }
    return text.empty() ? "-" : text;
}

asio::awaitable<int> list_sandboxes(backend& b, ls_options o) {
    auto listed = co_await b.async_list(o.filter);
    if (!listed) co_return report_error(o.inventory ? "inventory" : "ls", listed.error());
    std::string out;
    if (o.json) {
        out = sandboxes_json(*listed);
    } else if (o.inventory) {
        const auto now = std::chrono::system_clock::now();
        char line[768];
        std::snprintf(line, sizeof line,
                      "%-24s %-8s %-8s %-10s %-9s %-5s %-8s %-9s %-9s %-9s %-28s %s\n", "ID",
                      "STATE", "AGE", "EXPIRES", "MEMORY", "PIDS", "CPU", "DISK", "EGRESS",
                      "BUFFERED", "OWNER", "LABELS");
        out = line;
        for (const auto& info : *listed) {
            const std::string pids = info.pids_current ? std::to_string(*info.pids_current) : "-";
            std::snprintf(
                line, sizeof line, "%-24s %-8s %-8s %-10s %-9s %-5s %-8s %-9s %-9s %-9s %-28s %s\n",
                info.id.c_str(), to_string(info.state), format_span(now - info.created_at).c_str(),
                format_span(info.expires_at - now).c_str(),
                megabytes(info.memory_used_bytes).c_str(), pids.c_str(),
                cpu_seconds(info.cpu_time_us).c_str(), megabytes(info.disk_used_bytes).c_str(),
                megabytes(info.egress_bytes_used).c_str(),
                megabytes(info.egress_buffered_bytes).c_str(), info.owner_instance.c_str(),
                labels_text(info.labels).c_str());
            out += line;
        }
    } else {
        const auto now = std::chrono::system_clock::now();
        char line[512];
        std::snprintf(line, sizeof line, "%-24s %-8s %-8s %-10s %-8s %s\n", "ID", "STATE", "AGE",
                      "EXPIRES", "PID", "LABELS");
        out = line;
        for (const auto& info : *listed) {
            const std::string pid = info.host_pid ? std::to_string(*info.host_pid) : "-";
            std::snprintf(line, sizeof line, "%-24s %-8s %-8s %-10s %-8s %s\n", info.id.c_str(),
                          to_string(info.state), format_span(now - info.created_at).c_str(),
                          format_span(info.expires_at - now).c_str(), pid.c_str(),
                          labels_text(info.labels).c_str());
            out += line;
        }
    }
    write_all(STDOUT_FILENO, out);
    co_return 0;
}

}  // namespace

namespace {

int list_command(int argc, char** argv, bool inventory) {
    ls_options options;
    options.inventory = inventory;
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--json") {
            options.json = true;
        } else if (auto label = flag_value("--label", argc, argv, i)) {
            auto [key, value] = parse_key_value("--label", *label);
            options.filter[key] = value;
        } else {
            throw usage_error("unexpected argument '" + std::string(arg) + "'");
        }
    }
    return run_with_backend(
        [&options](backend& b) { return list_sandboxes(b, std::move(options)); });
}

}  // namespace

int ls_command(int argc, char** argv) {
    return list_command(argc, argv, false);
}

int inventory_command(int argc, char** argv) {
    return list_command(argc, argv, true);
}

}  // namespace moat::cli
