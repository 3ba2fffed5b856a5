// moat doctor: which isolation layers and limits moat can enforce on this host, why any cannot,
// and a live create / exec / destroy. Exits 0 when every layer is available and the live check
// passed; otherwise exit_failure, with one line per problem.
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "sandboxd/cgroup_layout.hpp"
#include "templates/idmap_probe.hpp"

#include <moat/templates.hpp>

#include <sys/utsname.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string_view>
#include <vector>

namespace moat::cli {
namespace {

struct layer_description {
    const char* name;
    const char* provides;
};

constexpr layer_description all_layers[] = {
    {"user_ns", "a private uid range per sandbox, never host root"},
    {"pid_ns", "sandbox processes see only each other; pid 1 ends them all"},
    {"mount_ns", "read-only root (or a template's, writable by overlay), private /tmp, /workspace"},
    {"net_ns", "no network but loopback"},
    {"ipc_ns", "private System V IPC and POSIX message queues"},
    {"uts_ns", "its own hostname"},
    {"cgroup_ns", "its own cgroup view"},
    {"seccomp", "dangerous system calls refused (mount, ptrace, bpf, io_uring, ...)"},
    {"no_new_privs", "setuid binaries gain nothing"},
    {"cgroup_memory", "memory limit (tmpfs included), OOM kills contained"},
    {"cgroup_pids", "process limit (fork bombs)"},
    {"cgroup_cpu", "CPU quota"},
};

std::string read_line(const char* path) {
    std::ifstream in(path);
    std::string line;
    if (!in || !std::getline(in, line)) return "";
    return line;
}

// The cgroup layout as the helper will see it (it starts in this process's cgroup): which
// version carries the limits, where, and which controllers the v2 cgroup offers.
std::string describe_cgroups(const sandboxd::cgroup_layout& layout) {
    std::string v1;
    for (std::size_t i = 0; i < sandboxd::controller_count; ++i) {
        if (layout.has_v1(static_cast<sandboxd::controller>(i)))
            v1 += std::string(" ") + sandboxd::controller_names[i];
    }
    std::string v2;
    if (!layout.v2_mount.empty()) {
        std::string controllers =
            sandboxd::read_small_file(layout.v2_own_dir() + "/cgroup.controllers");
        while (!controllers.empty() && controllers.back() == '\n') controllers.pop_back();
        v2 = "v2 at " + layout.v2_mount + ", this process in " + layout.v2_own +
             " (its controllers: " + (controllers.empty() ? "none" : controllers) + ")";
    }
    switch (layout.kind) {
        case sandboxd::cgroup_layout_kind::none:
            return "none mounted";
        case sandboxd::cgroup_layout_kind::v1:
            return "v1 (" + (v1.empty() ? std::string("no memory, pids or cpu") : v1.substr(1)) +
                   ")";
        case sandboxd::cgroup_layout_kind::hybrid:
            if (layout.limits_use_v1())
                return "hybrid: limits use v1 (" + v1.substr(1) + "); " + v2;
            return "hybrid without v1 limit controllers: limits use " + v2;
        case sandboxd::cgroup_layout_kind::v2:
            return "v2 (unified): " + v2.substr(3);
    }
    return "";
}

void print_row(const char* name, const std::string& value) {
    std::printf("  %-18s %s\n", name, value.c_str());
}

std::uint64_t read_number(const char* path, const char* key = nullptr) {
    std::ifstream in(path);
    std::string word;
    if (key == nullptr) {
        std::uint64_t value = 0;
        return in >> value ? value : 0;
    }
    while (in >> word) {
        if (word == key) {
            std::uint64_t value = 0;
            return in >> value ? value : 0;
        }
    }
    return 0;
}

// The host's file table against the worst case the limits allow: every process of a sandbox
// (pids) holding open_files descriptors, for one sandbox and for as many as the host's memory
// holds at the memory limit each. Either reaching fs.file-max is a warning, not a failure: it is
// a sizing choice (lower the limits or raise fs.file-max), and each open file is also charged to
// its sandbox's memory, which bounds them further.
void check_file_table(const resource_limits& limits) {
    const std::uint64_t file_max = read_number("/proc/sys/fs/file-max");
    const std::uint64_t per_sandbox = std::uint64_t{*limits.pids} * *limits.open_files;
    const std::uint64_t memory_kib = read_number("/proc/meminfo", "MemTotal:");
    const std::uint64_t fits =
        std::max<std::uint64_t>(1, (memory_kib << 10) / *limits.memory_bytes);
    std::printf("\nhost-wide tables (worst case of the default limits)\n");
    if (file_max == 0) {
        print_row("file table", "fs.file-max unreadable");
        return;
    }
    std::string row = "one sandbox: " + std::to_string(*limits.pids) + " processes x " +
                      std::to_string(*limits.open_files) + " = " + std::to_string(per_sandbox) +
                      " files of fs.file-max " + std::to_string(file_max) + "; " +
                      std::to_string(fits) +
                      " sandboxes (as many as memory holds): " + std::to_string(per_sandbox * fits);
    if (per_sandbox >= file_max) {
        row +=
            " (WARNING: one sandbox can fill the host's file table: lower open_files or pids, "
            "or raise fs.file-max)";
    } else if (per_sandbox * fits >= file_max) {
        row += " (warning: full sandboxes together could fill it: raise fs.file-max)";
    } else {
        row += " (ok)";
    }
    print_row("file table", row);
}

// The data directory's templates and whether this host can mount one (an idmapped mount, tried on
// the data directory's file system). Missing support is a problem only once templates exist:
// sandboxes of the default root need none.
void check_templates(std::vector<std::string>& problems) {
    std::string data_dir = data_dir_from_environment();
    if (data_dir.empty()) data_dir = default_data_dir();
    const template_store store(data_dir);
    const auto listed = store.list();
    const std::size_t count = listed ? listed->size() : 0;
    // The data directory may not exist yet: its nearest existing ancestor shares its file system.
    std::string probe_dir = data_dir;
    while (probe_dir.size() > 1 && ::access(probe_dir.c_str(), F_OK) != 0)
        probe_dir = probe_dir.substr(0, std::max<std::size_t>(1, probe_dir.rfind('/')));
    const auto probed = templates::probe_idmapped_mount(probe_dir);
    const std::string where = std::to_string(count) + " in " + data_dir;
    if (probed) {
        print_row("templates", "ok: idmapped mounts work (a template root per sandbox); " + where);
        return;
    }
    print_row("templates", "UNAVAILABLE: " + probed.error().detail + "; " + where);
    if (count > 0)
        problems.push_back("templates exist but cannot be mounted: " + probed.error().detail);
}

// Whether a sandbox of no template got a writable root of its own (an overlay: the helper could
// idmap its template root) or the template root itself, read-only. Informational: both are safe.
asio::awaitable<void> check_root(backend& b, const std::string& id) {
    exec_request request;
    request.argv = {"/bin/sh", "-c", "grep -c '^[^ ]* / overlay ' /proc/mounts"};
    auto ran = co_await b.async_exec(id, request);
    if (!ran) co_return;
    print_row("root", ran->out.text() == "1\n"
                          ? "writable: the sandbox's own overlay over the template root"
                          : "read-only: the template root itself (its tmpfs cannot be idmapped "
                            "here: Linux 6.3 or later)");
}

// Creates a sandbox, runs `id -u` in it and destroys it, timing each step.
asio::awaitable<void> live_check(backend& b, std::vector<std::string>& problems) {
    std::printf("\nlive check\n");
    using clock = std::chrono::steady_clock;
    const auto ms = [](clock::duration d) {
        return std::to_string(std::chrono::duration<double, std::milli>(d).count()).substr(0, 5) +
               " ms";
    };
    sandbox_spec spec;
    spec.labels["moat.cli"] = "doctor";
    spec.ttl = std::chrono::minutes(1);
    const auto t0 = clock::now();
    auto created = co_await b.async_create(spec);
    const auto t1 = clock::now();
    if (!created) {
        print_row("create", "FAILED: " + created.error().to_string());
        problems.push_back("create failed: " + created.error().to_string());
    } else {
        print_row("create", "ok, " + ms(t1 - t0) + " (" + created->id + ")");
        exec_request request;
        request.argv = {"/bin/sh", "-c", "id -u"};
        const auto t2 = clock::now();
        auto ran = co_await b.async_exec(created->id, request);
        const auto t3 = clock::now();
        if (!ran || ran->exit_code != 0 || ran->out.text() != "1000\n") {
            const std::string why = ran ? "exit " + std::to_string(ran->exit_code) + ", output '" +
                                              ran->out.text() + "'"
                                        : ran.error().to_string();
            print_row("exec", "FAILED: " + why);
            problems.push_back("exec failed: " + why);
        } else {
            print_row("exec", "ok, " + ms(t3 - t2) + " (runs as uid 1000)");
        }
        co_await check_root(b, created->id);
        const auto t4 = clock::now();
        auto destroyed = co_await b.async_destroy(created->id);
        const auto t5 = clock::now();
        if (!destroyed) {
            print_row("destroy", "FAILED: " + destroyed.error().to_string());
            problems.push_back("destroy failed: " + destroyed.error().to_string());
        } else {
            print_row("destroy", "ok, " + ms(t5 - t4) + " (confirmed gone)");
        }
    }
}

// A remote backend: its endpoint and key (host_report), then the live check.
asio::awaitable<int> diagnose_remote(backend& b) {
    std::vector<std::string> problems;
    std::printf("%s backend\n", b.name().c_str());
    auto report = co_await b.async_host_report();
    if (!report) {
        print_row("endpoint", "FAILED: " + report.error().to_string());
        problems.push_back("the " + b.name() +
                           " endpoint or its API key failed: " + report.error().to_string());
    } else {
        for (const auto& [key, value] : report->facts) print_row(key.c_str(), value);
        print_row("endpoint", "ok (it answered and took the API key)");
        co_await live_check(b, problems);
    }
    std::fflush(stdout);
    if (problems.empty()) {
        std::printf("\nmoat doctor: the %s backend works\n", b.name().c_str());
        co_return 0;
    }
    std::printf("\n");
    for (const auto& p : problems) std::fprintf(stderr, "moat doctor: %s\n", p.c_str());
    co_return exit_failure;
}

asio::awaitable<int> diagnose(backend& b) {
    if (b.name() != "local") co_return co_await diagnose_remote(b);
    std::vector<std::string> problems;
    std::printf("host\n");
    utsname host{};
    ::uname(&host);
    print_row("kernel", std::string(host.release) + " " + host.machine);
    print_row("running as", "uid " + std::to_string(::geteuid()) +
                                (::geteuid() == 0 ? "" : " (the local backend needs root)"));
    const std::string max_userns = read_line("/proc/sys/user/max_user_namespaces");
    if (max_userns == "0") {
        problems.push_back("user namespaces are disabled (sysctl user.max_user_namespaces=0)");
    }
    print_row("user namespaces",
              max_userns.empty() ? "unknown" : "max_user_namespaces " + max_userns);
    const std::string apparmor =
        read_line("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    if (!apparmor.empty()) {
        print_row("apparmor userns",
                  apparmor == "1"
                      ? "restricted (unprivileged user namespaces need a profile; root is fine)"
                      : "not restricted");
    }
    print_row("cgroups", describe_cgroups(sandboxd::read_cgroup_layout()));
    check_templates(problems);

    auto report = co_await b.async_host_report();
    if (!report) {
        problems.push_back("the local backend cannot start: " + report.error().to_string());
    } else {
        for (const auto& [key, value] : report->facts) print_row(key.c_str(), value);
        std::printf("\nisolation layers\n");
        for (const auto& layer : all_layers) {
            const bool available = std::find(report->layers.begin(), report->layers.end(),
                                             layer.name) != report->layers.end();
            std::printf("  %-18s %-8s %s\n", layer.name, available ? "ok" : "MISSING",
                        layer.provides);
            if (!available) problems.push_back(std::string("layer ") + layer.name + " is missing");
        }
        // Egress needs only the sandbox's own network namespace (its endpoint lives there) and
        // this process's ordinary outbound sockets (the proxy connects from the host).
        const bool net_ns = std::find(report->layers.begin(), report->layers.end(), "net_ns") !=
                            report->layers.end();
        print_row("egress", net_ns ? "ok: --allow-host serves a proxy at 127.0.0.1:3128 inside "
                                     "the sandbox, connecting from this host"
                                   : "unavailable: needs the net_ns layer");
        // One reason per missing piece, "; "-separated, each naming its fix where there is one.
        std::string_view why = report->detail;
        while (!why.empty()) {
            const auto end = why.find("; ");
            const std::string reason(why.substr(0, end));
            std::printf("  why: %s\n", reason.c_str());
            problems.push_back(reason);
            why.remove_prefix(end == std::string_view::npos ? why.size() : end + 2);
        }
    }

    const sandbox_spec defaults;
    const resource_limits limits = defaults.limits.with_defaults();
    const exec_request exec_defaults;
    std::printf("\ndefault limits (per sandbox)\n");
    print_row("memory", std::to_string(*limits.memory_bytes >> 20) + " MiB (tmpfs included)");
    print_row("processes", std::to_string(*limits.pids));
    print_row("cpu", std::to_string(*limits.cpu_millicores) + " millicores");
    print_row("/workspace", std::to_string(*limits.workspace_bytes >> 20) + " MiB");
    print_row("/tmp", std::to_string(*limits.tmp_bytes >> 20) + " MiB");
    print_row("open files", std::to_string(*limits.open_files) + " per process (hard limit)");
    print_row("exec wall time", std::to_string(exec_defaults.wall_limit.count() / 1000) + " s");
    print_row("ttl", std::to_string(
                         std::chrono::duration_cast<std::chrono::seconds>(defaults.ttl).count()) +
                         " s");
    check_file_table(limits);

    co_await live_check(b, problems);
    std::fflush(stdout);
    if (problems.empty()) {
        std::printf("\nmoat doctor: everything moat needs is here\n");
        co_return 0;
    }
    std::printf("\n");
    for (const auto& p : problems) std::fprintf(stderr, "moat doctor: %s\n", p.c_str());
    co_return exit_failure;
}

}  // namespace

int doctor_command(int argc, char** argv) {
    if (argc != 0) throw usage_error("unexpected argument '" + std::string(argv[0]) + "'");
    return run_with_backend([](backend& b) { return diagnose(b); });
}

}  // namespace moat::cli
