// envd's directory watches (filesystem.Filesystem/WatchDir, CreateWatcher, GetWatcherEvents,
// RemoveWatcher) over the sandbox handle's watches (sandbox::async_watch_dir, side lane): the
// events come from inotify inside the sandbox (watch.hpp), not from a command. Errors as envd's:
// not_found for a missing directory, invalid_argument for a file or a bad path, unauthenticated
// for a user other than the sandbox's.
//
// WatchDir streams {"start":{}}, then each event, with keepalives as the process stream sends
// them (Keepalive-Ping-Interval, else 90 s); it ends at its Connect-Timeout-Ms
// (deadline_exceeded), when the directory is removed ({}), when the sandbox ends (unavailable),
// when the client goes (seen at the next send), or with resource_exhausted when events were
// lost because the client read too slowly.
//
// includeEntry: each event carries what Stat answers for its path, read when serve takes the
// event from the watch (one command on the side lane per event; best effort, as envd's: an entry
// gone by then, a removal for one, has none).
//
// The polling watchers are serve's: a random id per watcher, at most max_watchers per sandbox,
// at most max_buffered_events kept between two polls (a poll after a loss fails once with
// resource_exhausted saying how many were lost; the watcher goes on), removed with the sandbox,
// by RemoveWatcher, or when nobody polled it for idle_watcher_limit.
#include "core/ascii.hpp"
#include "e2b_protocol/watch_messages.hpp"
#include "serve/connect_rpc.hpp"
#include "serve/envd_entry.hpp"
#include "serve/envd_files.hpp"
#include "serve/envd_service.hpp"

#include <moat/sandbox.hpp>
#include <moat/with_timeout.hpp>

#include "core/asio_compat.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <sys/random.h>
#include <algorithm>
#include <map>

namespace moat::serve {
namespace {

namespace connect = http::connect;
namespace protocol = e2b_protocol;
using code = connect::code;

constexpr std::chrono::seconds default_keepalive{90};
constexpr std::chrono::seconds open_limit{30};
constexpr std::size_t max_watchers = 32;
constexpr std::size_t max_buffered_events = 1024;
constexpr std::chrono::minutes idle_watcher_limit{10};
// How often a polling watcher looks at its idle time while no event comes.
constexpr std::chrono::seconds idle_check{30};

// A polling watcher: what came since the last poll.
struct watcher {
    std::string id;
    std::string sandbox_id;
    std::uint64_t task = 0;  // its pump, in the server's background group
    std::vector<protocol::filesystem_event> events;
    std::uint64_t lost = 0;
    std::chrono::steady_clock::time_point polled = std::chrono::steady_clock::now();
    std::optional<std::string> ended;  // why its watch ended
};

struct watch_service {
    explicit watch_service(serve_context& c) : context(c) {}
    serve_context& context;
    std::map<std::string, std::map<std::string, std::shared_ptr<watcher>>> watchers;  // by sandbox

    void forget(const watcher& w) {
        auto sandbox = watchers.find(w.sandbox_id);
        if (sandbox == watchers.end()) return;
        sandbox->second.erase(w.id);
        if (sandbox->second.empty()) watchers.erase(sandbox);
    }
};

using service_ptr = std::shared_ptr<watch_service>;

// Opens the watch a request asks for; the Connect error to answer with when it cannot.
struct opened_watch {
    std::optional<dir_watch> watch;
    std::string path;  // the directory watched, resolved
    bool include_entry = false;
    bool as_root = false;  // the watch's user (its entries are stat'ed as that user)
    code failure = code::internal;
    std::string message;
};

// An event as the SDK gets it: with its entry when the watch asked for entries.
asio::awaitable<protocol::filesystem_event> sdk_event(serve_context& context,
                                                      const registry_entry& sandbox,
                                                      const opened_watch& opened,
                                                      watch_event event) {
    protocol::filesystem_event out{std::move(event), std::nullopt};
    if (!opened.include_entry) co_return out;
    std::string path = opened.path;
    if (path != "/") path += '/';
    path += out.event.name;
    out.entry = co_await async_stat_entry(context, sandbox, std::move(path), opened.as_root);
    co_return out;
}

asio::awaitable<opened_watch> open_watch(envd_call& call, std::string_view body) {
    opened_watch out;
    bool as_root = false;
    if (auto refused = check_rpc_user(call, as_root)) {
        out.failure = code::unauthenticated;
        out.message = *refused;
        co_return out;
    }
    auto request = protocol::parse_watch_dir_request(body);
    if (!request) {
        out.failure = code::invalid_argument;
        out.message = request.error().detail;
        co_return out;
    }
    auto path = resolve_envd_path(request->path, user_home(*call.sandbox, as_root));
    if (!path) {
        out.failure = code::invalid_argument;
        out.message = path.error().detail;
        co_return out;
    }
    watch_options options;
    options.recursive = request->recursive;
    const auto limit = deadline::after(open_limit);  // named locals (g++ 12)
    auto opened = co_await call.sandbox->handle->async_watch_dir(*path, options, limit, lane::side);
    if (!opened) {
        out.failure = connect::from_errc(opened.error().code);
        if (opened.error().code == errc::backend_failure) out.failure = code::internal;
        out.message = opened.error().detail;
        co_return out;
    }
    out.watch = std::move(*opened);
    out.path = std::move(*path);
    out.include_entry = request->include_entry;
    out.as_root = as_root;
    co_return out;
}

asio::awaitable<void> watch_dir(envd_call& call) {
    connect_stream stream(call.response);
    auto body = co_await async_read_stream_request(call.request);
    if (!body) {
        const auto failure = connect::from_errc(body.error().code);
        (void)co_await stream.async_end(failure, body.error().detail);
        co_return;
    }
    auto opened = co_await open_watch(call, *body);
    if (!opened.watch) {
        (void)co_await stream.async_end(opened.failure, opened.message);
        co_return;
    }
    const auto keepalive = keepalive_interval(call.request).value_or(default_keepalive);
    deadline stream_end;
    if (auto timeout = connect_timeout(call.request); timeout && timeout->count() > 0)
        stream_end = deadline::after(*timeout);
    const auto started = protocol::encode_watch_start();
    if (!co_await stream.async_send(started)) co_return;
    auto keepalive_due = deadline::after(keepalive);
    for (;;) {
        auto pull = opened.watch->async_next();
        const auto wake = earliest(keepalive_due, stream_end);
        auto next = co_await with_timeout(std::move(pull), wake);
        if (next) {
            if (auto* event = std::get_if<watch_event>(&*next)) {
                auto sent =
                    co_await sdk_event(call.context, *call.sandbox, opened, std::move(*event));
                const auto json = protocol::encode_watch_event(sent);
                if (!co_await stream.async_send(json)) co_return;  // the client went away
                keepalive_due = deadline::after(keepalive);
                continue;
            }
            if (const auto* lost = std::get_if<watch_overflow>(&*next)) {
                const std::string message = "events were lost (" + std::to_string(lost->lost) +
                                            ", 0: unknown): the client did not read them in time";
                (void)co_await stream.async_end(code::resource_exhausted, message);
                co_return;
            }
            const auto& end = std::get<watch_end>(*next);
            if (end.why == watch_end::reason::directory_removed) {
                (void)co_await stream.async_end();
            } else {
                (void)co_await stream.async_end(code::unavailable, end.detail);
            }
            co_return;
        }
        if (next.error().code != errc::deadline_exceeded) {
            const auto failure = connect::from_errc(next.error().code);
            (void)co_await stream.async_end(failure, next.error().detail);
            co_return;
        }
        if (stream_end.has_expired()) {
            const std::string_view message = "the stream outlived its Connect-Timeout-Ms";
            (void)co_await stream.async_end(code::deadline_exceeded, message);
            co_return;
        }
        if (keepalive_due.has_expired()) {
            const auto json = protocol::encode_watch_keepalive();
            if (!co_await stream.async_send(json)) co_return;
            keepalive_due = deadline::after(keepalive);
        }
    }
}

// Moves a polling watcher's events into its buffer until the watch ends, nobody polls it for
// idle_watcher_limit, or it is removed (its task cancelled).
asio::awaitable<void> pump_watcher(service_ptr service, std::shared_ptr<watcher> w,
                                   std::shared_ptr<registry_entry> sandbox, opened_watch opened) {
    for (;;) {
        auto pull = opened.watch->async_next();
        const auto limit = deadline::after(idle_check);
        auto next = co_await with_timeout(std::move(pull), limit);
        if (!next) {
            if (next.error().code != errc::deadline_exceeded) break;  // removed, or stopping
            if (std::chrono::steady_clock::now() - w->polled > idle_watcher_limit) break;
            continue;
        }
        if (auto* event = std::get_if<watch_event>(&*next)) {
            if (w->events.size() < max_buffered_events) {
                auto kept =
                    co_await sdk_event(service->context, *sandbox, opened, std::move(*event));
                w->events.push_back(std::move(kept));
            } else {
                ++w->lost;
            }
        } else if (const auto* lost = std::get_if<watch_overflow>(&*next)) {
            w->lost += std::max<std::uint64_t>(lost->lost, 1);
        } else {
            const auto& end = std::get<watch_end>(*next);
            w->ended = end.detail;
            // The sandbox is gone: so is the watcher. A removed directory keeps its watcher
            // (its last events wait for a poll) until it is removed or idle.
            if (end.why == watch_end::reason::sandbox_ended) break;
            asio::steady_timer timer(service->context.executor);
            while (std::chrono::steady_clock::now() - w->polled <= idle_watcher_limit) {
                timer.expires_after(idle_check);
                const auto token = as_tuple(asio::use_awaitable);
                auto [waited] = co_await timer.async_wait(token);
                if (waited) break;  // removed, or stopping
            }
            break;
        }
    }
    service->forget(*w);
}

std::string new_watcher_id() {
    unsigned char bytes[12];
    if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) return {};
    std::string id = "w";
    detail::append_hex(id, bytes);
    return id;
}

asio::awaitable<void> create_watcher(service_ptr service, envd_call& call) {
    auto body = co_await async_read_unary_request(call.request);
    if (!body) {
        (void)co_await async_send_unary_error(call.response, code::invalid_argument,
                                              body.error().detail);
        co_return;
    }
    auto& mine = service->watchers[call.sandbox->id];
    if (mine.size() >= max_watchers) {
        const std::string message = "this sandbox has " + std::to_string(max_watchers) +
                                    " watchers, moat serve's limit: remove one first "
                                    "(RemoveWatcher)";
        (void)co_await async_send_unary_error(call.response, code::resource_exhausted, message);
        co_return;
    }
    auto opened = co_await open_watch(call, *body);
    const std::string id = new_watcher_id();
    if (!opened.watch || id.empty()) {
        if (opened.watch) opened.message = "no random watcher id could be made";
        (void)co_await async_send_unary_error(call.response, opened.failure, opened.message);
        co_return;
    }
    auto w = std::make_shared<watcher>();
    w->id = id;
    w->sandbox_id = call.sandbox->id;
    service->watchers[w->sandbox_id][id] = w;
    w->task = service->context.background.spawn(
        pump_watcher(service, w, call.sandbox, std::move(opened)));
    const auto json = protocol::encode_create_watcher_response(id);
    (void)co_await async_send_unary(call.response, json);
}

// The caller's watcher named by the request, or nullptr once answered with why not.
asio::awaitable<std::shared_ptr<watcher>> find_watcher(service_ptr service, envd_call& call) {
    auto body = co_await async_read_unary_request(call.request);
    result<std::string> id = make_error(errc::invalid_argument, "");
    if (body) {
        id = protocol::parse_watcher_id_request(*body);
    } else {
        id = body.error();
    }
    if (!id) {
        (void)co_await async_send_unary_error(call.response, code::invalid_argument,
                                              id.error().detail);
        co_return nullptr;
    }
    auto sandbox = service->watchers.find(call.sandbox->id);
    std::shared_ptr<watcher> found;
    if (sandbox != service->watchers.end()) {
        auto it = sandbox->second.find(*id);
        if (it != sandbox->second.end()) found = it->second;
    }
    if (!found) {
        const std::string message = "watcher with id " + *id + " not found";
        (void)co_await async_send_unary_error(call.response, code::not_found, message);
    }
    co_return found;
}

asio::awaitable<void> get_watcher_events(service_ptr service, envd_call& call) {
    auto w = co_await find_watcher(service, call);
    if (!w) co_return;
    w->polled = std::chrono::steady_clock::now();
    if (w->lost != 0) {
        const std::string message =
            std::to_string(w->lost) + " events were lost (more than " +
            std::to_string(max_buffered_events) +
            " came between two polls); the events kept are in the next answer";
        w->lost = 0;
        (void)co_await async_send_unary_error(call.response, code::resource_exhausted, message);
        co_return;
    }
    const auto events = std::exchange(w->events, {});
    const auto json = protocol::encode_watcher_events_response(events);
    (void)co_await async_send_unary(call.response, json);
}

asio::awaitable<void> remove_watcher(service_ptr service, envd_call& call) {
    auto w = co_await find_watcher(service, call);
    if (!w) co_return;
    service->forget(*w);
    service->context.background.cancel(w->task);
    std::string empty = "{}";  // a named local (g++ 12)
    (void)co_await async_send_unary(call.response, std::move(empty));
}

}  // namespace

void add_watch_routes(envd_routes& routes, serve_context& context) {
    auto service = std::make_shared<watch_service>(context);
    routes.add("POST", "/filesystem.Filesystem/WatchDir", watch_dir);
    routes.add("POST", "/filesystem.Filesystem/CreateWatcher",
               with_service(service, create_watcher));
    routes.add("POST", "/filesystem.Filesystem/GetWatcherEvents",
               with_service(service, get_watcher_events));
    routes.add("POST", "/filesystem.Filesystem/RemoveWatcher",
               with_service(service, remove_watcher));
}

}  // namespace moat::serve
