// moat mcp: a Model Context Protocol tool server on stdin/stdout, one per-session sandbox per
// connection (see mcp/mcp_server.hpp), or with --session KEY the shared session KEY (the store of
// --store / MOAT_STORE, host-local by default), which outlives the connection. Logs go to stderr;
// stdout carries only protocol messages.
#include <moat/runtime.hpp>
#include <moat/session_manager.hpp>
#include <moat/session_store.hpp>
#include <moat/tools.hpp>

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/stderr_log.hpp"
#include "mcp/mcp_server.hpp"

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace moat::cli {
namespace {

struct mcp_options {
    manager_options manager;
    tool_options tools;
    std::string store;    // --store or MOAT_STORE (with --session)
    std::string session;  // --session KEY: a shared session that outlives the connection
    bool images = false;  // --images: a cell's images also as MCP image content items
};

// A tool name prefix: what MCP tool names allow (letters, digits, '_', '-', '.'), short.
std::string parse_tool_prefix(const std::string& value) {
    const bool fits = !value.empty() && value.size() <= 32 &&
                      value.find_first_not_of(
                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          "0123456789_-.") == std::string::npos;
    if (!fits) {
        throw usage_error("--tool-prefix: '" + value +
                          "' must be 1 to 32 letters, digits, '_', '-' or '.'");
    }
    return value;
}

// The number of failed run calls before "stop retrying" (1 to 100), or "off".
int parse_retry_ceiling(const std::string& value) {
    if (value == "off") return 0;
    int n = 0;
    std::size_t used = 0;
    try {
        n = std::stoi(value, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != value.size() || n < 1 || n > 100) {
        throw usage_error("--retry-ceiling: '" + value + "' must be a number from 1 to 100 or off");
    }
    return n;
}

mcp_options parse_mcp_options(int argc, char** argv) {
    mcp_options o;
    bool store_given = false;
    network_flags network;
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (auto seconds = flag_value("--timeout", argc, argv, i)) {
            const auto limit = parse_wall_limit("--timeout", *seconds);
            o.tools.default_timeout = std::chrono::duration_cast<std::chrono::seconds>(limit);
            if (o.tools.default_timeout.count() < 1)
                o.tools.default_timeout = std::chrono::seconds(1);
        } else if (auto megabytes = flag_value("--memory", argc, argv, i)) {
            o.manager.spec.limits.memory_bytes = parse_megabytes("--memory", *megabytes);
        } else if (auto pair = flag_value("--env", argc, argv, i)) {
            auto [key, value] = parse_key_value("--env", *pair);
            o.manager.spec.env[key] = value;
        } else if (auto name = flag_value("--template", argc, argv, i)) {
            o.manager.spec.template_name = *name;
        } else if (auto label = flag_value("--label", argc, argv, i)) {
            auto [key, value] = parse_key_value("--label", *label);
            o.manager.spec.labels[key] = value;
        } else if (auto prefix = flag_value("--tool-prefix", argc, argv, i)) {
            o.tools.tool_prefix = parse_tool_prefix(*prefix);
        } else if (auto ceiling = flag_value("--retry-ceiling", argc, argv, i)) {
            o.tools.failures_before_stop = parse_retry_ceiling(*ceiling);
        } else if (auto url = flag_value("--store", argc, argv, i)) {
            o.store = *url;
            store_given = true;
        } else if (auto key = flag_value("--session", argc, argv, i)) {
            if (key->empty()) throw usage_error("--session: the key is empty");
            o.session = *key;
        } else if (arg == "--images") {
            o.images = true;
        } else if (network_flag(argc, argv, i, network)) {
            continue;
        } else {
            throw usage_error("unknown option '" + std::string(arg) + "'");
        }
    }
    if (store_given && o.session.empty()) {
        throw usage_error("--store needs --session KEY (a connection's own session is not shared)");
    }
    if (!store_given) {
        if (const char* from_env = std::getenv("MOAT_STORE")) o.store = from_env;
    }
    if (!o.session.empty()) check_session_store_url(o.store);
    o.manager.spec.network = finish_network(network);
    o.manager.spec.labels["moat.client"] = "mcp";
    return o;
}

asio::awaitable<int> serve(backend& b, mcp_options o) {
    runtime sandboxes(b);
    // With --session the session lives in the shared store and outlives this connection (the
    // manager's shutdown leaves a shared store's sandboxes running); without, it is this
    // connection's own and is destroyed when the client leaves.
    std::shared_ptr<session_store> store = o.session.empty()
                                               ? make_memory_session_store()
                                               : open_session_store(o.store, b.get_executor());
    session_manager sessions(sandboxes, o.manager, std::move(store));
    int code = 0;
    {
        const std::string key = o.session.empty() ? "mcp-" + std::to_string(::getpid()) : o.session;
        tool_session tools(sessions, key, o.tools);
        mcp::server_options server_options;
        server_options.end_session_on_close = o.session.empty();
        if (o.images) server_options.max_image_items = 4;
        mcp::server server(tools, STDIN_FILENO, STDOUT_FILENO, server_options);
        code = co_await server.async_run();
    }
    co_await asio::this_coro::reset_cancellation_state();
    const auto report = co_await sessions.async_shutdown();
    if (!report.left.empty()) code = exit_failure;
    co_return code;
}

}  // namespace

int mcp_command(int argc, char** argv) {
    mcp_options o = parse_mcp_options(argc, argv);
    install_stderr_log("mcp");
    return run_with_backend([&o](backend& b) { return serve(b, o); });
}

}  // namespace moat::cli
