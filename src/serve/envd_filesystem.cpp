// envd's filesystem service (filesystem.Filesystem/*) over Connect JSON: Stat, ListDir, MakeDir,
// Move and Remove, each one command inside the sandbox (serve/envd_entry.hpp says why that is
// safe with hostile names and planted symlinks). Error codes as envd's: not_found for a missing
// path, already_exists for MakeDir on a directory, invalid_argument for MakeDir on a non-directory
// or ListDir of one and for a bad path, unauthenticated for a user other than the sandbox's,
// internal for the rest. WatchDir and the polling watcher RPCs answer `unimplemented` (see
// docs/serve.md).
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
result<std::string> resolve(const std::string& path, const registry_entry& sandbox) {
    return resolve_envd_path(path, sandbox_home(sandbox));
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
asio::awaitable<result<command_outcome>> async_run(envd_call& call, std::vector<std::string> argv,
                                                   std::size_t output_cap = max_entry_bytes) {
    listing_turn turn;
    if (output_cap > max_entry_bytes) {
        auto& turns = listing_turns(call.context);
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
    request.wall_limit = command_wall_limit;
    request.output.head_bytes = output_cap;
    request.output.tail_bytes = 0;
    auto ran = co_await call.sandbox->handle->async_exec(std::move(request), deadline::never(),
                                                         lane::side);
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
        if (auto filled = co_await async_fill_metadata(*call.sandbox, out.entries); !filled)
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

// The common start of every handler: the user check and the request, parsed by `parse` into
// `out`; the refusal when either fails.
template <class Request>
asio::awaitable<std::optional<outcome>> async_read(envd_call& call,
                                                   result<Request> (*parse)(std::string_view),
                                                   Request& out) {
    if (auto refused = check_rpc_user(call))
        co_return fail(connect::code::unauthenticated, *refused);
    auto body = co_await async_read_unary_request(call.request);
    if (!body) co_return fail(connect::code::invalid_argument, body.error().detail);
    auto parsed = parse(*body);
    if (!parsed) co_return fail(connect::code::invalid_argument, parsed.error().detail);
    out = std::move(*parsed);
    co_return std::nullopt;
}

asio::awaitable<outcome> stat(envd_call& call) {
    std::string sent;
    if (auto refused = co_await async_read(call, protocol::parse_path_request, sent))
        co_return std::move(*refused);
    auto path = resolve(sent, *call.sandbox);
    if (!path) co_return fail(connect::code::invalid_argument, path.error().detail);
    auto argv = stat_command(*path);
    auto ran = co_await async_run(call, std::move(argv));
    if (!ran) co_return from_error(ran.error());
    if (ran->exit_code == exit_not_found || ran->entries.size() != 1)
        co_return fail(connect::code::not_found, "file not found: '" + *path + "'");
    co_return entry_response(ran->entries[0]);
}

asio::awaitable<outcome> list_dir(envd_call& call) {
    protocol::list_dir_request sent;
    if (auto refused = co_await async_read(call, protocol::parse_list_dir_request, sent))
        co_return std::move(*refused);
    auto path = resolve(sent.path, *call.sandbox);
    if (!path) co_return fail(connect::code::invalid_argument, path.error().detail);
    // envd: 0 (unset) means the directory's own entries.
    const std::uint32_t depth = sent.depth == 0 ? 1 : sent.depth;
    auto argv = list_command(*path, depth);
    auto ran = co_await async_run(call, std::move(argv), max_listing_bytes);
    if (!ran) co_return from_error(ran.error());
    if (ran->exit_code == exit_not_found)
        co_return fail(connect::code::not_found, "directory not found: '" + *path + "'");
    if (ran->exit_code == exit_not_directory)
        co_return fail(connect::code::invalid_argument, "path is not a directory: '" + *path + "'");
    co_return ok(protocol::encode_list_dir_response(ran->entries));
}

asio::awaitable<outcome> make_dir(envd_call& call) {
    std::string sent;
    if (auto refused = co_await async_read(call, protocol::parse_path_request, sent))
        co_return std::move(*refused);
    auto path = resolve(sent, *call.sandbox);
    if (!path) co_return fail(connect::code::invalid_argument, path.error().detail);
    auto argv = make_dir_command(*path);
    auto ran = co_await async_run(call, std::move(argv));
    if (!ran) co_return from_error(ran.error());
    if (ran->exit_code == exit_already_exists)
        co_return fail(connect::code::already_exists, "directory already exists: '" + *path + "'");
    if (ran->exit_code == exit_not_directory)
        co_return fail(connect::code::invalid_argument,
                       "path already exists but it is not a directory: '" + *path + "'");
    if (ran->entries.size() != 1)
        co_return fail(connect::code::internal, "directory vanished once made: '" + *path + "'");
    co_return entry_response(ran->entries[0]);
}

asio::awaitable<outcome> move(envd_call& call) {
    protocol::move_request sent;
    if (auto refused = co_await async_read(call, protocol::parse_move_request, sent))
        co_return std::move(*refused);
    auto source = resolve(sent.source, *call.sandbox);
    if (!source) co_return fail(connect::code::invalid_argument, source.error().detail);
    auto destination = resolve(sent.destination, *call.sandbox);
    if (!destination) co_return fail(connect::code::invalid_argument, destination.error().detail);
    auto argv = move_command(*source, *destination);
    auto ran = co_await async_run(call, std::move(argv));
    if (!ran) co_return from_error(ran.error());
    if (ran->exit_code == exit_not_found)
        co_return fail(connect::code::not_found, "source file not found: '" + *source + "'");
    if (ran->entries.size() != 1)
        co_return fail(connect::code::internal, "moved entry vanished: '" + *destination + "'");
    co_return entry_response(ran->entries[0]);
}

asio::awaitable<outcome> remove(envd_call& call) {
    std::string sent;
    if (auto refused = co_await async_read(call, protocol::parse_path_request, sent))
        co_return std::move(*refused);
    auto path = resolve(sent, *call.sandbox);
    if (!path) co_return fail(connect::code::invalid_argument, path.error().detail);
    auto argv = remove_command(*path);
    auto ran = co_await async_run(call, std::move(argv));
    if (!ran) co_return from_error(ran.error());
    co_return ok("{}");
}

// Runs a handler and sends what it answered.
template <asio::awaitable<outcome> (*Handler)(envd_call&)>
asio::awaitable<void> unary(envd_call& call) {
    auto answer = co_await Handler(call);
    if (answer.code) {
        const auto code = *answer.code;
        (void)co_await async_send_unary_error(call.response, code, answer.text);
    } else {
        auto json = std::move(answer.text);
        (void)co_await async_send_unary(call.response, std::move(json));
    }
}

asio::awaitable<void> unimplemented_stream(envd_call& call) {
    connect_stream stream(call.response);
    const std::string message =
        std::string(call.request.path()) + " is not supported by moat serve (no directory watches)";
    (void)co_await stream.async_end(connect::code::unimplemented, message);
}

asio::awaitable<void> unimplemented_unary(envd_call& call) {
    const std::string message =
        std::string(call.request.path()) + " is not supported by moat serve (no directory watches)";
    (void)co_await async_send_unary_error(call.response, connect::code::unimplemented, message);
}

}  // namespace

void add_filesystem_service(envd_routes& routes, serve_context&) {
    routes.add("POST", "/filesystem.Filesystem/Stat", unary<stat>);
    routes.add("POST", "/filesystem.Filesystem/ListDir", unary<list_dir>);
    routes.add("POST", "/filesystem.Filesystem/MakeDir", unary<make_dir>);
    routes.add("POST", "/filesystem.Filesystem/Move", unary<move>);
    routes.add("POST", "/filesystem.Filesystem/Remove", unary<remove>);
    routes.add("POST", "/filesystem.Filesystem/WatchDir", unimplemented_stream);
    for (const char* method : {"CreateWatcher", "GetWatcherEvents", "RemoveWatcher"})
        routes.add("POST", std::string("/filesystem.Filesystem/") + method, unimplemented_unary);
}

}  // namespace moat::serve
