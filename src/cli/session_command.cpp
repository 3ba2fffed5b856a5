// moat session: a conversation's sandbox from the shell, shared by every moat process that names
// the same key (attach-or-create through the session manager over a shared store).
//
//   moat session exec [--store URL] [--timeout S] [--stdin] [--json] KEY -- CMD...
//   moat session end [--store URL] KEY
//   moat session ls [--json]
//
// Without --store (and without MOAT_STORE) the host-local store serves: every moat process on this
// host shares its sessions. The sandbox carries the label moat.session=KEY and outlives the
// command; `end` destroys it, confirmed, and exits 4 for a key no store entry names.
#include <moat/redis_session_store.hpp>
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/session_store.hpp>

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/sandbox_report.hpp"

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace moat::cli {
namespace {

// How long an exec waits for its session's sandbox (another process may be creating it).
constexpr auto acquire_wait = std::chrono::seconds(120);

struct session_options {
    std::string store;  // --store or MOAT_STORE; "" = the host-local store
    std::string key;
    exec_request request;
    sandbox_network network;    // for a session whose sandbox this exec creates
    std::string template_name;  // likewise (--template)
    bool json = false;
    bool read_stdin = false;
};

}  // namespace

void check_session_store_url(const std::string& url) {
    if (url.empty() || url == "host") return;
    if (url.starts_with("host:")) {
        if (url.size() > 5 && url[5] == '/') return;
        throw usage_error("--store: host:DIR needs an absolute directory");
    }
    // Never echo the URL: it may carry a password (parse_redis_url's details never do).
    if (auto parsed = parse_redis_url(url); !parsed)
        throw usage_error("--store: " + parsed.error().detail);
}

std::shared_ptr<session_store> open_session_store(const std::string& url,
                                                  asio::any_io_executor executor) {
    check_session_store_url(url);
    if (url.empty() || url == "host" || url.starts_with("host:")) {
        host_store_options options;
        if (url.starts_with("host:")) options.directory = url.substr(5);
        return make_host_session_store(std::move(executor), options);
    }
    // redis://, rediss://, unix://: the password from the URL, else MOAT_STORE_PASSWORD.
    auto config = parse_redis_url(url);
    if (!config) throw usage_error("--store: " + config.error().detail);
    if (auto loaded = load_redis_password(*config); !loaded)
        throw usage_error("--store: " + loaded.error().detail);
    auto store = make_redis_session_store(std::move(executor), std::move(*config));
    if (!store) throw usage_error("--store: " + store.error().detail);
    return std::move(*store);
}

namespace {

session_options parse_session_options(std::string_view sub, int argc, char** argv) {
    session_options o;
    network_flags network;
    if (const char* from_env = std::getenv("MOAT_STORE")) o.store = from_env;
    int i = 0;
    for (; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (auto url = flag_value("--store", argc, argv, i)) {
            o.store = *url;
        } else if (sub == "exec" && arg == "--stdin") {
            o.read_stdin = true;
        } else if ((sub == "exec" || sub == "ls") && arg == "--json") {
            o.json = true;
        } else if (sub == "exec") {
            if (auto seconds = flag_value("--timeout", argc, argv, i)) {
                o.request.wall_limit = parse_wall_limit("--timeout", *seconds);
                continue;
            }
            if (network_flag(argc, argv, i, network)) continue;
            if (auto name = flag_value("--template", argc, argv, i)) {
                o.template_name = *name;
                continue;
            }
            if (arg.starts_with("-"))
                throw usage_error("unknown option '" + std::string(arg) + "'");
            break;
        } else if (arg.starts_with("-")) {
            throw usage_error("unknown option '" + std::string(arg) + "'");
        } else {
            break;
        }
    }
    check_session_store_url(o.store);
    o.network = finish_network(network);
    if (sub == "ls") {
        if (i != argc) throw usage_error("moat session ls takes no key");
        return o;
    }
    const std::string shape = sub == "exec" ? "moat session exec [options] KEY -- CMD..."
                                            : "moat session end [--store URL] KEY";
    if (i == argc) throw usage_error("missing session key (" + shape + ")");
    o.key = argv[i++];
    if (o.key.empty()) throw usage_error("the session key is empty");
    if (sub == "end") {
        if (i != argc)
            throw usage_error("unexpected '" + std::string(argv[i]) + "' (" + shape + ")");
        return o;
    }
    if (i < argc && std::string_view(argv[i]) == "--") ++i;
    for (; i < argc; ++i) o.request.argv.emplace_back(argv[i]);
    if (o.request.argv.empty()) throw usage_error("missing command (" + shape + ")");
    return o;
}

manager_options cli_manager_options(const sandbox_network& network = {},
                                    const std::string& template_name = {}) {
    manager_options options;
    options.spec.network = network;
    options.spec.template_name = template_name;
    options.spec.labels["moat.client"] = "cli";
    return options;
}

asio::awaitable<int> session_exec(backend& b, session_options o) {
    runtime sandboxes(b);
    auto store = open_session_store(o.store, b.get_executor());
    session_manager sessions(sandboxes, cli_manager_options(o.network, o.template_name), store);
    int code = 0;
    {
        auto got = co_await sessions.async_acquire(o.key, deadline::after(acquire_wait));
        if (!got) {
            code = report_error("session exec", got.error());
        } else {
            auto outcome = co_await exec_for_terminal(got->box, o.request, o.json);
            if (o.json) print_exec_json(got->box->id(), outcome);
            code = exec_exit_code("session exec", outcome, o.json, o.request.wall_limit);
        }
    }
    co_await asio::this_coro::reset_cancellation_state();
    // The store is shared: shutting the manager down leaves the session's sandbox running.
    (void)co_await sessions.async_shutdown(std::chrono::seconds(5));
    co_return code;
}

asio::awaitable<int> session_end(backend& b, session_options o) {
    runtime sandboxes(b);
    auto store = open_session_store(o.store, b.get_executor());
    session_manager sessions(sandboxes, cli_manager_options(), store);
    auto ended = co_await sessions.async_end(o.key);
    int code = 0;
    if (ended) {
        std::printf("ended %s\n", o.key.c_str());
        std::fflush(stdout);
    } else if (ended.error().code == errc::sandbox_not_found) {
        std::fprintf(stderr, "moat session end: no session named '%s'\n", o.key.c_str());
        code = exit_no_sandbox;
    } else {
        code = report_error("session end", ended.error());
    }
    (void)co_await sessions.async_shutdown(std::chrono::seconds(5));
    co_return code;
}

// The sessions' sandboxes on this host: those labelled moat.policy=session and moat.session.
asio::awaitable<int> session_ls(backend& b, session_options o) {
    label_filter filter;
    filter["moat.policy"] = "session";
    auto listed = co_await b.async_list(filter);
    if (!listed) co_return report_error("session ls", listed.error());
    std::string out;
    if (o.json) {
        out = sandboxes_json(*listed);
    } else {
        const auto now = std::chrono::system_clock::now();
        char line[512];
        std::snprintf(line, sizeof line, "%-32s %-24s %-8s %-8s %s\n", "KEY", "ID", "STATE", "AGE",
                      "EXPIRES");
        out = line;
        for (const auto& info : *listed) {
            const auto key = info.labels.find("moat.session");
            if (key == info.labels.end()) continue;
            std::snprintf(line, sizeof line, "%-32s %-24s %-8s %-8s %s\n", key->second.c_str(),
                          info.id.c_str(), to_string(info.state),
                          format_span(now - info.created_at).c_str(),
                          format_span(info.expires_at - now).c_str());
            out += line;
        }
    }
    write_all(STDOUT_FILENO, out);
    co_return 0;
}

}  // namespace

int session_command(int argc, char** argv) {
    if (argc < 1) throw usage_error("missing subcommand (moat session exec|end|ls)");
    const std::string_view sub = argv[0];
    if (sub != "exec" && sub != "end" && sub != "ls") {
        throw usage_error("unknown subcommand '" + std::string(sub) +
                          "' (moat session exec|end|ls)");
    }
    session_options options = parse_session_options(sub, argc - 1, argv + 1);
    if (sub == "exec" && options.read_stdin) {
        if (auto failed = read_stdin_into("session exec", options.request)) return *failed;
    }
    return run_with_backend([&options, sub](backend& b) -> asio::awaitable<int> {
        if (sub == "exec") return session_exec(b, std::move(options));
        if (sub == "end") return session_end(b, std::move(options));
        return session_ls(b, std::move(options));
    });
}

}  // namespace moat::cli
