// moat template build|ls|rm|verify: the local backend's templates (templates.hpp), kept in the
// data directory (--data-dir, else MOAT_DATA_DIR, else /var/lib/moat as root).
//
//   moat template build NAME --from-dir DIR   copy DIR into a layer; print the template; list on
//                                             stderr what the build cleared (setuid bits, ...)
//   moat template build NAME --from-oci PATH[:TAG]
//                                             the same from image TAG (default latest) of the
//                                             OCI image layout at PATH, unpacked with umoci
//   ... --max-data-mb N                       the data directory's budget (else MOAT_MAX_DATA_MB):
//                                             past it, unused layers go, then the build fails
//   moat template ls [--json]                 NAME, DIGEST, SIZE, BUILT, SOURCE
//   moat template rm NAME                     refused while a live sandbox of this host uses it
//   moat template verify NAME                 recompute the layer's digest; exit 1 if it differs
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "core/json_writer.hpp"
#include "core/rfc3339.hpp"

#include <moat/templates.hpp>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>

namespace moat::cli {
namespace {

struct template_options {
    std::string action;
    std::string name;
    std::string from_dir;
    std::string from_oci;  // PATH[:TAG]
    std::string data_dir;
    std::uint64_t max_data_bytes = 0;
    bool json = false;
};

template_options parse(int argc, char** argv) {
    template_options o;
    o.data_dir = data_dir_from_environment();
    if (const char* budget = std::getenv("MOAT_MAX_DATA_MB"); budget != nullptr && *budget != 0)
        o.max_data_bytes = parse_megabytes("MOAT_MAX_DATA_MB", budget);
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (auto dir = flag_value("--from-dir", argc, argv, i)) {
            o.from_dir = *dir;
        } else if (auto oci = flag_value("--from-oci", argc, argv, i)) {
            o.from_oci = *oci;
        } else if (auto data = flag_value("--data-dir", argc, argv, i)) {
            o.data_dir = *data;
        } else if (auto budget = flag_value("--max-data-mb", argc, argv, i)) {
            o.max_data_bytes = parse_megabytes("--max-data-mb", *budget);
        } else if (arg == "--json") {
            o.json = true;
        } else if (arg.starts_with("-")) {
            throw usage_error("unknown option '" + std::string(arg) + "'");
        } else if (o.action.empty()) {
            o.action = arg;
        } else if (o.name.empty()) {
            o.name = arg;
        } else {
            throw usage_error("unexpected argument '" + std::string(arg) + "'");
        }
    }
    if (o.action != "build" && o.action != "ls" && o.action != "rm" && o.action != "verify")
        throw usage_error("moat template needs build, ls, rm or verify");
    if (o.action != "ls" && o.name.empty())
        throw usage_error("moat template " + o.action + " needs a template name");
    if (o.action == "build" && o.from_dir.empty() == o.from_oci.empty())
        throw usage_error("moat template build NAME needs one of --from-dir DIR, --from-oci PATH");
    if (o.action != "build" && (!o.from_dir.empty() || !o.from_oci.empty()))
        throw usage_error("--from-dir and --from-oci are for moat template build");
    return o;
}

std::string size_text(std::uint64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1fM", static_cast<double>(bytes) / (1 << 20));
    return text;
}

std::string listing(const std::vector<template_info>& templates, bool json) {
    if (json) {
        json_writer w;
        w.begin_array();
        for (const auto& t : templates) {
            w.begin_object();
            w.key("name").value(t.name);
            w.key("digest").value(t.digest);
            w.key("size_bytes").value(t.size_bytes);
            w.key("built_at").value(detail::format_rfc3339(t.built_at, 0));
            w.key("source").value(t.source);
            w.key("python").value(t.python);
            w.end_object();
        }
        w.end_array();
        return w.take() + "\n";
    }
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line, "%-24s %-19s %-9s %-20s %s\n", "NAME", "DIGEST", "SIZE",
                  "BUILT", "SOURCE");
    out += line;
    for (const auto& t : templates) {
        const std::string digest = t.digest.substr(0, 19);  // "sha256:" and 12 digits
        std::snprintf(line, sizeof line, "%-24s %-19s %-9s %-20s %s\n", t.name.c_str(),
                      digest.c_str(), size_text(t.size_bytes).c_str(),
                      detail::format_rfc3339(t.built_at, 0).c_str(), t.source.c_str());
        out += line;
    }
    return out;
}

// PATH[:TAG]: the tag follows the last ':' when what follows holds no '/'.
result<template_build_report> build_from_oci(template_store& store, const template_options& o) {
    const auto colon = o.from_oci.rfind(':');
    if (colon == std::string::npos || o.from_oci.find('/', colon) != std::string::npos)
        return store.build_from_oci(o.name, o.from_oci);
    return store.build_from_oci(o.name, o.from_oci.substr(0, colon), o.from_oci.substr(colon + 1));
}

int build(template_store& store, const template_options& o) {
    auto built =
        o.from_oci.empty() ? store.build_from_dir(o.name, o.from_dir) : build_from_oci(store, o);
    if (!built) return report_error("template build", built.error());
    for (const auto& line : built->cleared) write_all(STDERR_FILENO, "cleared: " + line + "\n");
    write_all(STDOUT_FILENO, "built " + built->built.name + " " + built->built.digest + " " +
                                 size_text(built->built.size_bytes) + "\n");
    return 0;
}

int verify(template_store& store, const template_options& o) {
    auto found = store.find(o.name);
    if (!found) return report_error("template verify", found.error());
    auto digest = store.digest_of_layer(found->digest);
    if (!digest) return report_error("template verify", digest.error());
    if (*digest != found->digest) {
        write_all(STDERR_FILENO, "moat template verify: " + o.name + ": the layer's digest is " +
                                     *digest + ", not " + found->digest + "\n");
        return exit_failure;
    }
    write_all(STDOUT_FILENO, "ok " + o.name + " " + found->digest + "\n");
    return 0;
}

// The digests the live sandboxes of this host's state directory run.
asio::awaitable<int> remove(backend& b, template_options o) {
    auto listed = co_await b.async_list({});
    if (!listed) co_return report_error("template rm", listed.error());
    std::vector<std::string> in_use;
    for (const auto& info : *listed) {
        if (info.state == sandbox_state::running && !info.template_digest.empty())
            in_use.push_back(info.template_digest);
    }
    template_store store(o.data_dir);
    auto removed = store.remove(o.name, in_use);
    if (!removed) co_return report_error("template rm", removed.error());
    write_all(STDOUT_FILENO, "removed " + o.name + "\n");
    co_return 0;
}

}  // namespace

int template_command(int argc, char** argv) {
    const template_options o = parse(argc, argv);
    template_store store(o.data_dir, o.max_data_bytes);
    if (o.action == "build") return build(store, o);
    if (o.action == "verify") return verify(store, o);
    if (o.action == "ls") {
        auto listed = store.list();
        if (!listed) return report_error("template ls", listed.error());
        write_all(STDOUT_FILENO, listing(*listed, o.json));
        return 0;
    }
    return run_with_backend([&o](backend& b) { return remove(b, o); });
}

}  // namespace moat::cli
