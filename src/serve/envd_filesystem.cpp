// envd's filesystem service (filesystem.Filesystem/*) over Connect JSON: Stat, ListDir, MakeDir,
// Move and Remove, each one command inside the sandbox (serve/envd_entry.hpp says why that is
// safe with hostile names and planted symlinks). Error codes as envd's: not_found for a missing
// path, already_exists for MakeDir on a directory, invalid_argument for MakeDir on a non-directory
// or ListDir of one and for a bad path, unauthenticated for a user other than the sandbox's,
// internal for the rest. WatchDir and the polling watcher RPCs are envd_watch.cpp's.
#include "serve/connect_rpc.hpp"
#include "serve/envd_entry.hpp"
#include "serve/envd_files.hpp"
#include "serve/envd_service.hpp"

namespace moat::serve {
namespace {

namespace connect = http::connect;
namespace protocol = e2b_protocol;

// How long one filesystem command may run, and how much listing it may print.
constexpr std::chrono::seconds command_wall_limit{30};
constexpr std::size_t max_listing_bytes = 16 * 1024 * 1024;
// A command that prints at most one entry (Stat, MakeDir, Move; Remove prints none).
constexpr std::size_t max_entry_bytes = 64 * 1024;
// Listings that may run at once, server-wide: each may hold max_listing_bytes of output (and its
// parse), so together at most 128 MiB. More wait their turn, at most listing_wait.
constexpr std::size_t max_concurrent_listings = 8;
constexpr std::chrono::seconds listing_wait{30};

// What a handler answers: the response message, or an error.
struct outcome {
    std::optional<connect::code> code;  // set: an error
    std::string text;                   // the JSON message, or the error's message
};

outcome fail(connect::code code, std::string message) {
    return {code, std::move(message)};
}
outcome ok(std::string json) {
    return {std::nullopt, std::move(json)};
}

// A path as sent, resolved against the user's home (envd's rules).
result<std::string> resolve(const std::string& path, const std::string& home) {
    return resolve_envd_path(path, home);
}

// One of envd_entry's commands, run: its exit code and the entries it printed, each with its
// metadata (read through the backend: find cannot print extended attributes).
struct command_outcome {
    int exit_code = 0;
    std::vector<entry_info> entries;
};

// The server-wide turns of listings (max_concurrent_listings at once).
operation_queue& listing_turns(serve_context& context) {
    if (!context.listings)
        context.listings =
            std::make_shared<operation_queue>(context.executor, max_concurrent_listings);
    return *context.listings;
}

// Holds one listing turn; hands it on however the listing ends.
struct listing_turn {
    operation_queue* turns = nullptr;
    listing_turn() = default;
    listing_turn(const listing_turn&) = delete;
    listing_turn& operator=(const listing_turn&) = delete;
    ~listing_turn() {
        if (turns) turns->release();
    }
};

// `output_cap`: max_listing_bytes for a listing, which first waits for a server-wide turn.
asio::awaitable<result<command_outcome>> async_run(serve_context& context,
                                                   const registry_entry& sandbox,
                                                   std::vector<std::string> argv, bool as_root,
                                                   std::size_t output_cap = max_entry_bytes) {
    listing_turn turn;
    if (output_cap > max_entry_bytes) {
        auto& turns = listing_turns(context);
        const auto limit = deadline::after(listing_wait);
        const auto granted = co_await turns.async_acquire(limit);
        if (granted != operation_queue::turn::granted)
            co_return make_error(errc::too_large, "the server is running " +
                                                      std::to_string(max_concurrent_listings) +
                                                      " directory listings; none finished within " +
                                                      std::to_string(listing_wait.count()) + " s");
        turn.turns = &turns;
    }
    exec_request request;
    request.argv = std::move(argv);
    request.as_root = as_root;
    request.wall_limit = command_wall_limit;
    request.output.head_bytes = output_cap;
    request.output.tail_bytes = 0;
    auto ran =
        co_await sandbox.handle->async_exec(std::move(request), deadline::never(), lane::side);
    if (!ran) co_return ran.error();
    command_outcome out;
    out.exit_code = ran->exit_code;
    if (ran->timed_out)
        co_return make_error(errc::deadline_exceeded, "filesystem command outlived its limit");
    if (ran->out.is_truncated())
        co_return make_error(errc::too_large,
                             "directory listing is over " + std::to_string(output_cap) + " bytes");
    if (ran->exit_code == 0) {
        auto parsed = parse_find_output(ran->out.head);
        if (!parsed) co_return parsed.error();
        out.entries = std::move(*parsed);
        if (auto filled = co_await async_fill_metadata(sandbox, out.entries); !filled)
            co_return std::move(filled).error();
    } else if (ran->exit_code != exit_not_found && ran->exit_code != exit_not_directory &&
               ran->exit_code != exit_already_exists) {
        // The first line of what the command said (coreutils name the path and the reason).
        auto said = ran->err.head.substr(0, ran->err.head.find('\n'));
        if (said.size() > 512) said.resize(512);
        auto code = errc::backend_failure;
        if (said.find("Permission denied") != std::string::npos) code = errc::permission_denied;
        if (said.empty()) said = "exit status " + std::to_string(ran->exit_code);
        co_return make_error(code, said);
    }
    co_return out;
}

outcome from_error(const error& e) {
    if (e.code == errc::backend_failure) return fail(connect::code::internal, e.detail);
    if (e.code == errc::too_large) return fail(connect::code::resource_exhausted, e.detail);
    return fail(connect::from_errc(e.code), e.detail);
}

outcome entry_response(const entry_info& entry) {
    return ok(protocol::encode_entry_response(entry));
}

// Each request's paths, resolved in place against the user's home.
result<void> resolve_paths(std::string& path, const std::string& home) {
    auto resolved = resolve(path, home);
    if (!resolved) return resolved.error();
    path = std::move(*resolved);
    return {};
}
result<void> resolve_paths(protocol::list_dir_request& request, const std::string& home) {
    return resolve_paths(request.path, home);
}
result<void> resolve_paths(protocol::move_request& request, const std::string& home) {
    if (auto source = resolve_paths(request.source, home); !source) return source;
    return resolve_paths(request.destination, home);
}

// One filesystem RPC: its request's parser, the command its (resolved) request runs, at most
// how much that may print, and the answer to what it ran.
template <class Request>
struct command_rpc {
    result<Request> (*parse)(std::string_view);
    std::vector<std::string> (*command)(const Request&);
    std::size_t output_cap;
    outcome (*answer)(const Request&, const command_outcome&);
};

// Every command RPC: the user check, the request read, parsed and its paths resolved, the command
// run; a refusal (invalid_argument, unauthenticated) or the command's error when one fails.
template <class Request, const command_rpc<Request>& Rpc>
asio::awaitable<outcome> run_rpc(envd_call& call) {
    bool as_root = false;
    if (auto refused = check_rpc_user(call, as_root))
        co_return fail(connect::code::unauthenticated, *refused);
    auto body = co_await async_read_unary_request(call.request);
    if (!body) co_return fail(connect::code::invalid_argument, body.error().detail);
    auto sent = Rpc.parse(*body);
    if (!sent) co_return fail(connect::code::invalid_argument, sent.error().detail);
    const std::string home = user_home(*call.sandbox, as_root);
    if (auto resolved = resolve_paths(*sent, home); !resolved)
        co_return fail(connect::code::invalid_argument, resolved.error().detail);
    auto argv = Rpc.command(*sent);
    auto ran =
        co_await async_run(call.context, *call.sandbox, std::move(argv), as_root, Rpc.output_cap);
    if (!ran) co_return from_error(ran.error());
    co_return Rpc.answer(*sent, *ran);
}

outcome stat_answer(const std::string& path, const command_outcome& ran) {
    if (ran.exit_code == exit_not_found || ran.entries.size() != 1)
        return fail(connect::code::not_found, "file not found: '" + path + "'");
    return entry_response(ran.entries[0]);
}

std::vector<std::string> list_dir_command(const protocol::list_dir_request& request) {
    // envd: 0 (unset) means the directory's own entries.
    const std::uint32_t depth = request.depth == 0 ? 1 : request.depth;
    return list_command(request.path, depth);
}

outcome list_dir_answer(const protocol::list_dir_request& request, const command_outcome& ran) {
    if (ran.exit_code == exit_not_found)
        return fail(connect::code::not_found, "directory not found: '" + request.path + "'");
    if (ran.exit_code == exit_not_directory)
        return fail(connect::code::invalid_argument,
                    "path is not a directory: '" + request.path + "'");
    auto entries = ran.entries;
    sort_as_walked(entries);  // find prints a directory's entries in the order readdir gives them
    return ok(protocol::encode_list_dir_response(entries));
}

outcome make_dir_answer(const std::string& path, const command_outcome& ran) {
    if (ran.exit_code == exit_already_exists)
        return fail(connect::code::already_exists, "directory already exists: '" + path + "'");
    if (ran.exit_code == exit_not_directory)
        return fail(connect::code::invalid_argument,
                    "path already exists but it is not a directory: '" + path + "'");
    if (ran.entries.size() != 1)
        return fail(connect::code::internal, "directory vanished once made: '" + path + "'");
    return entry_response(ran.entries[0]);
}

std::vector<std::string> move_request_command(const protocol::move_request& request) {
    return move_command(request.source, request.destination);
}

outcome move_answer(const protocol::move_request& request, const command_outcome& ran) {
    if (ran.exit_code == exit_not_found)
        return fail(connect::code::not_found, "source file not found: '" + request.source + "'");
    if (ran.entries.size() != 1)
        return fail(connect::code::internal, "moved entry vanished: '" + request.destination + "'");
    return entry_response(ran.entries[0]);
}

outcome remove_answer(const std::string&, const command_outcome&) {
    return ok("{}");
}

constexpr command_rpc<std::string> stat_rpc{protocol::parse_path_request, stat_command,
                                            max_entry_bytes, stat_answer};
constexpr command_rpc<protocol::list_dir_request> list_dir_rpc{
    protocol::parse_list_dir_request, list_dir_command, max_listing_bytes, list_dir_answer};
constexpr command_rpc<std::string> make_dir_rpc{protocol::parse_path_request, make_dir_command,
                                                max_entry_bytes, make_dir_answer};
constexpr command_rpc<protocol::move_request> move_rpc{
    protocol::parse_move_request, move_request_command, max_entry_bytes, move_answer};
constexpr command_rpc<std::string> remove_rpc{protocol::parse_path_request, remove_command,
                                              max_entry_bytes, remove_answer};

// Runs a command RPC and sends what it answered.
template <class Request, const command_rpc<Request>& Rpc>
asio::awaitable<void> unary(envd_call& call) {
    auto answer = co_await run_rpc<Request, Rpc>(call);
    if (answer.code) {
        const auto code = *answer.code;
        (void)co_await async_send_unary_error(call.response, code, answer.text);
    } else {
        auto json = std::move(answer.text);
        (void)co_await async_send_unary(call.response, std::move(json));
    }
}

}  // namespace

asio::awaitable<std::optional<entry_info>> async_stat_entry(serve_context& context,
                                                            const registry_entry& sandbox,
                                                            std::string path, bool as_root) {
    auto argv = stat_command(path);
    auto ran = co_await async_run(context, sandbox, std::move(argv), as_root);
    if (!ran || ran->exit_code != 0 || ran->entries.size() != 1) co_return std::nullopt;
    co_return std::move(ran->entries[0]);
}

void add_filesystem_service(envd_routes& routes, serve_context& context) {
    routes.add("POST", "/filesystem.Filesystem/Stat", unary<std::string, stat_rpc>);
    routes.add("POST", "/filesystem.Filesystem/ListDir",
               unary<protocol::list_dir_request, list_dir_rpc>);
    routes.add("POST", "/filesystem.Filesystem/MakeDir", unary<std::string, make_dir_rpc>);
    routes.add("POST", "/filesystem.Filesystem/Move", unary<protocol::move_request, move_rpc>);
    routes.add("POST", "/filesystem.Filesystem/Remove", unary<std::string, remove_rpc>);
    add_watch_routes(routes, context);
}

}  // namespace moat::serve
