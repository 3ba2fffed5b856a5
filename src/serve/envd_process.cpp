// envd's process service (process.Process/*) over the sandbox handle's async_spawn and
// async_open_terminal: Start (with or without a pty), Connect, List, SendInput (stdin or pty),
// CloseStdin, SendSignal and Update (a pty's resize), with envd's semantics (docs/serve.md,
// "Processes"). Each sandbox gets a process table (process_table.hpp) on its
// first process call; a watcher in serve_context::background closes it the moment the sandbox
// ends (its live streams end with `unavailable`, its processes are killed) or the server stops.
//
// StreamInput (a client stream, which connect-web cannot send) keeps answering unimplemented.
#include "serve/connect_rpc.hpp"
#include "serve/envd_files.hpp"
#include "serve/envd_service.hpp"
#include "serve/process_table.hpp"

#include <moat/deadline.hpp>
#include <moat/sandbox.hpp>
#include <moat/terminal.hpp>
#include <moat/with_timeout.hpp>

#include "core/asio_compat.hpp"
#include "core/async_event.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <map>
#include <memory>
#include <string>

namespace moat::serve {
namespace {

namespace protocol = e2b_protocol;
using http::connect::code;
using protocol::encode_data_event;
using protocol::encode_end_event;
using protocol::encode_keepalive_event;
using protocol::encode_start_event;

// envd's keepalive period when the client sends no Keepalive-Ping-Interval.
constexpr std::chrono::seconds default_keepalive{90};
// How long a Start may take to get its process running, and a unary call to finish its work
// when the client set no Connect-Timeout-Ms.
constexpr std::chrono::seconds spawn_limit{30};
constexpr std::chrono::seconds unary_limit{30};
// How long SendSignal with SIGKILL waits for the process's end before it answers anyway.
constexpr std::chrono::seconds kill_confirm_bound{3};
// The name USER and LOGNAME carry when the sandbox's layout names no user.
constexpr std::string_view default_user = "user";

// A terminal as a process table holds it (its output, its signals); its input and size go to the
// terminal itself (process_service::terminals). It has no stdin of its own, as under envd.
class terminal_process final : public process::impl {
  public:
    explicit terminal_process(std::shared_ptr<terminal> t) : terminal_(std::move(t)) {}
    std::uint64_t id() const override { return terminal_->id(); }
    int pid() const override { return terminal_->pid(); }
    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() override {
        return terminal_->async_next();
    }
    asio::awaitable<result<void>> async_write_stdin(std::string) override {
        co_return make_error(errc::invalid_argument, "stdin not enabled (the process has a pty)");
    }
    asio::awaitable<result<void>> async_close_stdin() override { co_return result<void>{}; }
    asio::awaitable<result<void>> async_signal(int signal) override {
        return terminal_->async_signal(signal);
    }

  private:
    std::shared_ptr<terminal> terminal_;
};

struct process_service {
    explicit process_service(serve_context& c) : context(c) {}
    serve_context& context;
    std::map<std::string, std::shared_ptr<process_table>, std::less<>> tables;  // by sandbox id
    // The pty processes of each sandbox's table, by pid: a pid listed is a pty (its output is
    // `pty` data, also once it ended); the terminal is reachable while the table holds it.
    std::map<std::string, std::map<std::uint32_t, std::weak_ptr<terminal>>, std::less<>> terminals;
    // What every process of this server may hold of output, together (process_table.hpp).
    std::shared_ptr<output_budget> output = std::make_shared<output_budget>();
};

using service_ptr = std::shared_ptr<process_service>;

// Ends the sandbox's table when the sandbox ends, or when the server stops.
asio::awaitable<void> watch_sandbox(service_ptr service, std::shared_ptr<registry_entry> sandbox,
                                    std::shared_ptr<process_table> table) {
    const auto forever = deadline::never();
    const auto outcome = co_await sandbox->ended.async_wait(forever);
    std::string reason = "moat serve is stopping";
    if (outcome == async_event::wait_outcome::set) reason = "the sandbox " + sandbox->id + " ended";
    table->close(std::move(reason));
    auto it = service->tables.find(sandbox->id);
    if (it != service->tables.end() && it->second == table) service->tables.erase(it);
    co_await table->async_shutdown();
}

std::shared_ptr<process_table> table_for(const service_ptr& service,
                                         const std::shared_ptr<registry_entry>& sandbox) {
    auto it = service->tables.find(sandbox->id);
    if (it != service->tables.end() && !it->second->is_closed()) return it->second;
    process_table_options options;
    options.budget = service->output;
    auto table = std::make_shared<process_table>(service->context.executor, std::move(options));
    service->tables.insert_or_assign(sandbox->id, table);
    service->terminals.erase(sandbox->id);
    service->context.background.spawn(watch_sandbox(service, sandbox, table));
    return table;
}

std::shared_ptr<process_table> existing_table(const service_ptr& service,
                                              const std::shared_ptr<registry_entry>& sandbox) {
    auto it = service->tables.find(sandbox->id);
    if (it == service->tables.end() || it->second->is_closed()) return nullptr;
    return it->second;
}

code code_of(const error& e) {
    return http::connect::from_errc(e.code);
}

// Whether the selected process of `table` is a pty, and its terminal while it lives.
struct pty_lookup {
    bool is_pty = false;
    std::shared_ptr<terminal> live;
};

pty_lookup find_pty(const service_ptr& service, const registry_entry& sandbox,
                    const process_table& table, const process_selector& selector) {
    auto info = table.info(selector);
    auto of_sandbox = service->terminals.find(sandbox.id);
    if (!info || of_sandbox == service->terminals.end()) return {};
    auto it = of_sandbox->second.find(info->pid);
    if (it == of_sandbox->second.end()) return {};
    return {true, it->second.lock()};
}

// envd's size for a pty that names none (or a side of 0); moat's bound above.
terminal_size size_of(const protocol::pty_size& pty) {
    const auto side = [](std::uint32_t v, std::uint16_t fallback) {
        if (v == 0) return fallback;
        return static_cast<std::uint16_t>(std::min<std::uint32_t>(v, terminal_size::max_side));
    };
    return {side(pty.rows, 24), side(pty.cols, 80)};
}

// envd's answer for pty input or a resize of a process without one.
const std::string_view no_tty = "tty not assigned to process";

process_selector by_pid(std::uint32_t pid) {
    process_selector s;
    s.pid = pid;
    return s;
}

error not_found(const process_selector& s) {
    if (s.pid) {
        return make_error(errc::file_not_found,
                          "process with pid " + std::to_string(*s.pid) + " not found");
    }
    return make_error(errc::file_not_found,
                      "process with tag " + s.tag.value_or("") + " not found");
}

// Who commands run as and where home is: the sandbox's layout (sandbox_info::layout), or its
// root.
struct sandbox_user {
    std::string name;
    std::string home;
    bool as_root = false;
};

sandbox_user user_of(const registry_entry& sandbox, bool as_root) {
    if (as_root) return {std::string(root_user), std::string(root_home), true};
    const auto& layout = sandbox.handle->info().layout;
    sandbox_user u{layout.user, layout.home};
    if (u.name.empty()) u.name = default_user;
    return u;
}

// envd's ExpandAndResolve: "" is the default directory (the layout's workdir), "~" and "~/x" are
// under the home, a relative path is relative to the home.
std::string resolve_cwd(const std::string& cwd, const sandbox_user& user) {
    if (cwd.empty()) return cwd;
    if (cwd == "~") return user.home;
    if (cwd.starts_with("~/")) return user.home + cwd.substr(1);
    if (cwd.front() == '/') return cwd;
    return user.home + "/" + cwd;
}

// envd's order, later entries winning: PATH (the sandbox's), HOME, USER, LOGNAME, the sandbox's
// own variables (create envVars; the backend applies them), the request's.
std::map<std::string, std::string> process_environment(
    const registry_entry& sandbox, const sandbox_user& user,
    const std::map<std::string, std::string>& envs) {
    std::map<std::string, std::string> env;
    const std::pair<std::string_view, std::string_view> defaults[] = {
        {"HOME", user.home},
        {"USER", user.name},
        {"LOGNAME", user.name},
    };
    for (const auto& [k, v] : defaults) {
        if (!sandbox.env_vars.contains(std::string(k))) env[std::string(k)] = std::string(v);
    }
    for (const auto& [k, v] : envs) env[k] = v;
    return env;
}

deadline earlier(deadline a, deadline b) {
    if (a.when() < b.when()) return a;
    return b;
}

std::string deadline_message(std::chrono::milliseconds timeout) {
    return "the command did not finish within its timeout of " + std::to_string(timeout.count()) +
           " ms (Connect-Timeout-Ms) and was killed";
}

// Ends the stream with a moat error, as the Connect code it maps to.
asio::awaitable<void> end_with(connect_stream& stream, const error& e) {
    const auto c = code_of(e);
    (void)co_await stream.async_end(c, e.detail);
}

struct follow_options {
    std::chrono::seconds keepalive = default_keepalive;
    deadline stream_end;                               // the stream's Connect-Timeout-Ms
    std::optional<std::chrono::milliseconds> timeout;  // for the message
    bool is_start = false;                             // the stream's deadline is the process's too
    const async_event* sandbox_ended = nullptr;        // the sandbox's end (registry_entry::ended)
    bool pty = false;                                  // output goes out as `pty` data
};

// Streams a subscription after its start event: data, keepalives, the end, the end-stream.
asio::awaitable<void> follow(connect_stream& stream, process_table::subscription& subscription,
                             follow_options options) {
    auto keepalive_due = deadline::after(options.keepalive);
    const std::string stream_timeout =
        deadline_message(options.timeout.value_or(std::chrono::milliseconds(0)));
    for (;;) {
        const auto wake = earlier(keepalive_due, options.stream_end);
        auto next = co_await subscription.async_next(wake);
        if (!next) {
            if (options.sandbox_ended && options.sandbox_ended->is_set()) {
                // As envd's stream when its sandbox dies: cut off, so the SDK asks /health,
                // hears 502 and says the sandbox was killed or reached its end of life.
                co_await stream.async_abort();
                co_return;
            }
            co_await end_with(stream, next.error());
            co_return;
        }
        if (next->type == process_event::kind::output) {
            std::string json;
            if (options.pty) {
                json = protocol::encode_pty_data_event(next->output.data);
            } else {
                json = encode_data_event(next->output.channel, next->output.data);
            }
            auto sent = co_await stream.async_send(json);
            if (!sent) co_return;  // the client went away; the process runs on
            keepalive_due = deadline::after(options.keepalive);
            continue;
        }
        if (next->type == process_event::kind::end) {
            if (options.is_start && next->end.timed_out) {
                // envd: the request's deadline ends the stream with deadline_exceeded; the kill's
                // end is retained for a later Connect.
                (void)co_await stream.async_end(code::deadline_exceeded, stream_timeout);
                co_return;
            }
            const auto json = encode_end_event(next->end);
            auto sent = co_await stream.async_send(json);
            if (!sent) co_return;
            (void)co_await stream.async_end();
            co_return;
        }
        if (options.stream_end.has_expired()) {
            std::string message = "the stream outlived its Connect-Timeout-Ms";
            if (options.is_start) message = stream_timeout;
            (void)co_await stream.async_end(code::deadline_exceeded, message);
            co_return;
        }
        if (keepalive_due.has_expired()) {
            const auto json = encode_keepalive_event();
            auto sent = co_await stream.async_send(json);
            if (!sent) co_return;
            keepalive_due = deadline::after(options.keepalive);
        }
    }
}

// A streaming call's (Start, Connect) options from its headers: the keep-alive period and the
// stream's end by its Connect-Timeout-Ms.
follow_options stream_options(const envd_call& call) {
    follow_options options;
    options.timeout = connect_timeout(call.request);
    if (options.timeout && options.timeout->count() > 0)
        options.stream_end = deadline::after(*options.timeout);
    options.keepalive = keepalive_interval(call.request).value_or(default_keepalive);
    options.sandbox_ended = &call.sandbox->ended;
    return options;
}

// Answers a process call with an error: the end of its stream (Start, Connect: `stream` set) or
// the unary error.
asio::awaitable<void> refuse(envd_call& call, connect_stream* stream, code c,
                             std::string_view message) {
    if (stream) {
        (void)co_await stream->async_end(c, message);
    } else {
        (void)co_await async_send_unary_error(call.response, c, message);
    }
}

// A call's request message (the unary body, or with `stream` the stream's one message), parsed
// by `parse`; nullopt once the call is answered with why not.
template <class T, class Parse>
asio::awaitable<std::optional<T>> read_request(envd_call& call, connect_stream* stream,
                                               Parse parse) {
    result<std::string> body;
    if (stream) {
        body = co_await async_read_stream_request(call.request);
    } else {
        body = co_await async_read_unary_request(call.request);
    }
    if (!body) {
        const auto c = code_of(body.error());
        co_await refuse(call, stream, c, body.error().detail);
        co_return std::nullopt;
    }
    auto parsed = parse(*body);
    if (!parsed) {
        co_await refuse(call, stream, code::invalid_argument, parsed.error().detail);
        co_return std::nullopt;
    }
    co_return std::move(*parsed);
}

// Sends the start event for `pid`, then follows the subscription.
asio::awaitable<void> start_and_follow(connect_stream& stream,
                                       process_table::subscription& subscription, std::uint32_t pid,
                                       follow_options options) {
    const auto started = encode_start_event(pid);
    auto sent = co_await stream.async_send(started);
    if (!sent) co_return;
    co_await follow(stream, subscription, options);
}

// The reason a process that never started gives (its stderr, at most a line), read to its end
// within `limit`.
asio::awaitable<std::string> start_failure_reason(process& p, deadline limit) {
    std::string reason;
    for (int i = 0; i < 16 && !limit.has_expired(); ++i) {
        auto next = co_await p.async_next();
        if (!next) break;
        const auto* chunk = std::get_if<output_chunk>(&*next);
        if (chunk == nullptr) break;  // the end
        if (chunk->channel == output_channel::err && reason.size() < 512)
            reason.append(chunk->data, 0, 512 - reason.size());
    }
    while (!reason.empty() && (reason.back() == '\n' || reason.back() == '\r')) reason.pop_back();
    if (const auto nl = reason.find('\n'); nl != std::string::npos) reason.resize(nl);
    if (reason.empty()) reason = "the program could not be run";
    co_return reason;
}

// The process a Start asks for: a spawn, or a command on a terminal (kept in `pty` too).
asio::awaitable<result<process>> launch(std::shared_ptr<registry_entry> sandbox,
                                        exec_request request, protocol::start_request start,
                                        deadline limit, std::shared_ptr<terminal>& pty) {
    if (!start.has_pty) {
        co_return co_await sandbox->handle->async_spawn(std::move(request), limit, lane::side);
    }
    const terminal_size size = size_of(start.pty);
    auto opened =
        co_await sandbox->handle->async_open_terminal(std::move(request), size, limit, lane::side);
    if (!opened) co_return std::move(opened).error();
    pty = std::make_shared<terminal>(std::move(*opened));
    co_return process(std::make_unique<terminal_process>(pty));
}

asio::awaitable<void> start_process(service_ptr service, envd_call& call) {
    connect_stream stream(call.response);
    auto options = stream_options(call);
    options.is_start = true;
    auto parsed = co_await read_request<protocol::start_request>(call, &stream,
                                                                 protocol::parse_start_request);
    if (!parsed) co_return;
    auto table = table_for(service, call.sandbox);
    if (auto room = table->check_capacity(); !room) {
        co_await end_with(stream, room.error());
        co_return;
    }
    bool as_root = false;
    if (auto refused = check_rpc_user(call, as_root)) {
        const std::string message = *refused;
        (void)co_await stream.async_end(code::unauthenticated, message);
        co_return;
    }
    const auto user = user_of(*call.sandbox, as_root);
    const std::string cwd = resolve_cwd(parsed->process.cwd, user);
    const auto start_limit = deadline::after(spawn_limit);
    if (!cwd.empty()) {
        auto stat = co_await call.sandbox->handle->async_stat(cwd, start_limit, lane::side);
        if (!stat && stat.error().code == errc::file_not_found) {
            const std::string message = "cwd '" + cwd + "' does not exist";
            (void)co_await stream.async_end(code::invalid_argument, message);
            co_return;
        }
        if (!stat) {
            co_await end_with(stream, stat.error());
            co_return;
        }
    }

    exec_request request;
    request.argv.push_back(parsed->process.cmd);
    for (const auto& a : parsed->process.args) request.argv.push_back(a);
    request.env = process_environment(*call.sandbox, user, parsed->process.envs);
    request.cwd = cwd;
    request.as_root = user.as_root;
    request.wall_limit = exec_request::max_spawn_wall_limit;
    if (options.timeout && options.timeout->count() > 0) {
        request.wall_limit = std::min(*options.timeout, exec_request::max_spawn_wall_limit);
    }
    std::shared_ptr<terminal> pty;
    auto spawned = co_await launch(call.sandbox, std::move(request), *parsed, start_limit, pty);
    if (!spawned) {
        co_await end_with(stream, spawned.error());
        co_return;
    }
    if (spawned->pid() == 0) {
        // The program could not be started (missing, not executable): envd fails Start itself, as
        // Go's cmd.Start fails; there is no process, so no pid to report. Its one-line reason is
        // what the local backend wrote on the command's stderr before its end (127 or 126).
        const auto reason = co_await start_failure_reason(*spawned, start_limit);
        (void)co_await stream.async_end(code::invalid_argument,
                                        "error starting process: " + reason);
        co_return;
    }
    auto pid = table->add(std::move(*spawned), parsed->process, parsed->tag);
    if (!pid) {
        co_await end_with(stream, pid.error());
        co_return;
    }
    auto& ptys = service->terminals[call.sandbox->id];
    if (pty) {
        ptys[*pid] = pty;
    } else {
        ptys.erase(*pid);  // a reused pid
    }
    options.pty = pty != nullptr;
    const auto selector = by_pid(*pid);
    // Attached before anything suspends: until a subscription is there the pump drains without
    // backpressure into the bounded buffer, and a fast printer would overrun it unread.
    auto subscription = table->subscribe(selector);
    if (!subscription) {
        co_await end_with(stream, subscription.error());
        co_return;
    }
    if (!parsed->stdin_open && !pty) (void)co_await table->async_close_stdin(selector);
    co_await start_and_follow(stream, *subscription, *pid, options);
}

asio::awaitable<void> connect_process(service_ptr service, envd_call& call) {
    connect_stream stream(call.response);
    auto options = stream_options(call);
    auto selector =
        co_await read_request<process_selector>(call, &stream, protocol::parse_selector_request);
    if (!selector) co_return;
    auto table = existing_table(service, call.sandbox);
    result<process_table::subscription> subscription = not_found(*selector);
    if (table) subscription = table->subscribe(*selector);
    if (!subscription) {
        co_await end_with(stream, subscription.error());
        co_return;
    }
    const auto pid = subscription->pid();
    options.pty = find_pty(service, *call.sandbox, *table, *selector).is_pty;
    co_await start_and_follow(stream, *subscription, pid, options);
}

// The unary calls' request message, parsed; nullopt once the error is answered.
template <class T, class Parse>
asio::awaitable<std::optional<T>> read_unary(envd_call& call, Parse parse) {
    return read_request<T>(call, nullptr, parse);
}

deadline unary_deadline(const envd_call& call) {
    const auto timeout = connect_timeout(call.request);
    if (timeout && timeout->count() > 0) return deadline::after(*timeout);
    return deadline::after(unary_limit);
}

asio::awaitable<void> answer(envd_call& call, const result<void>& outcome) {
    if (outcome) {
        (void)co_await async_send_unary(call.response, "{}");
        co_return;
    }
    const auto c = code_of(outcome.error());
    co_await refuse(call, nullptr, c, outcome.error().detail);
}

result<std::string> parse_list(std::string_view json) {
    // ListRequest has no fields; only its shape is checked.
    if (json.find('{') == std::string_view::npos) {
        return make_error(errc::invalid_argument, "the List request is not a JSON object");
    }
    return std::string();
}

asio::awaitable<void> list_processes(service_ptr service, envd_call& call) {
    auto parsed = co_await read_unary<std::string>(call, parse_list);
    if (!parsed) co_return;
    std::vector<process_info> processes;
    if (auto table = existing_table(service, call.sandbox)) processes = table->list();
    const std::vector<protocol::listed_process> listed(processes.begin(), processes.end());
    auto json = protocol::encode_list_response(listed);
    (void)co_await async_send_unary(call.response, std::move(json));
}

asio::awaitable<void> send_input(service_ptr service, envd_call& call) {
    auto parsed =
        co_await read_unary<protocol::send_input_request>(call, protocol::parse_send_input_request);
    if (!parsed) co_return;
    auto table = existing_table(service, call.sandbox);
    if (!table) {
        const result<void> missing = not_found(parsed->process);
        co_await answer(call, missing);
        co_return;
    }
    const auto limit = unary_deadline(call);
    if (parsed->is_pty) {
        auto live = table->check_live(parsed->process);
        if (!live) {
            co_await answer(call, live);
            co_return;
        }
        auto pty = find_pty(service, *call.sandbox, *table, parsed->process).live;
        if (!pty) {
            const std::string message = "error writing to tty: " + std::string(no_tty);
            (void)co_await async_send_unary_error(call.response, code::internal, message);
            co_return;
        }
        auto bytes = std::move(parsed->bytes);
        auto written = co_await with_timeout(pty->async_write(std::move(bytes)), limit);
        co_await answer(call, written);
        co_return;
    }
    auto selector = parsed->process;
    auto bytes = std::move(parsed->bytes);
    auto written = co_await table->async_write_stdin(std::move(selector), std::move(bytes), limit);
    if (!written && written.error().code == errc::invalid_argument) {
        // envd's wording and code for a stdin that is not open.
        const std::string message = "error writing to stdin: " + written.error().detail;
        (void)co_await async_send_unary_error(call.response, code::internal, message);
        co_return;
    }
    co_await answer(call, written);
}

asio::awaitable<void> close_stdin(service_ptr service, envd_call& call) {
    auto parsed = co_await read_unary<process_selector>(call, protocol::parse_selector_request);
    if (!parsed) co_return;
    auto table = existing_table(service, call.sandbox);
    result<void> closed = not_found(*parsed);
    if (table) {
        auto selector = *parsed;
        closed = co_await table->async_close_stdin(std::move(selector));
    }
    co_await answer(call, closed);
}

// After a SIGKILL, waits (at most kill_confirm_bound) until the process's end is recorded, so the
// answer comes once it has exited and been reaped, as envd's does: a `kill -0` right after fails.
asio::awaitable<void> await_reaped(process_table& table, const process_selector& selector) {
    const auto limit = deadline::after(kill_confirm_bound);
    asio::steady_timer pause(co_await asio::this_coro::executor);
    while (table.check_live(selector) && !limit.has_expired()) {
        pause.expires_after(std::chrono::milliseconds(5));
        (void)co_await pause.async_wait(as_tuple(asio::use_awaitable));
    }
}

asio::awaitable<void> send_signal(service_ptr service, envd_call& call) {
    auto parsed = co_await read_unary<protocol::send_signal_request>(
        call, protocol::parse_send_signal_request);
    if (!parsed) co_return;
    auto table = existing_table(service, call.sandbox);
    result<void> live = not_found(parsed->process);
    if (table) live = table->check_live(parsed->process);
    if (!live) {
        co_await answer(call, live);
        co_return;
    }
    if (parsed->signal == 0) {
        const std::string message = "invalid signal: " + parsed->name;
        (void)co_await async_send_unary_error(call.response, code::unimplemented, message);
        co_return;
    }
    auto selector = parsed->process;
    const int signal = parsed->signal;
    auto signalled = co_await table->async_signal(selector, signal);
    if (signalled && signal == SIGKILL) co_await await_reaped(*table, selector);
    co_await answer(call, signalled);
}

asio::awaitable<void> update_process(service_ptr service, envd_call& call) {
    auto parsed =
        co_await read_unary<protocol::update_request>(call, protocol::parse_update_request);
    if (!parsed) co_return;
    auto table = existing_table(service, call.sandbox);
    result<void> live = not_found(parsed->process);
    if (table) live = table->check_live(parsed->process);
    if (live && parsed->has_pty) {
        auto pty = find_pty(service, *call.sandbox, *table, parsed->process).live;
        if (!pty) {
            const std::string message = "error resizing tty: " + std::string(no_tty);
            (void)co_await async_send_unary_error(call.response, code::internal, message);
            co_return;
        }
        live = co_await pty->async_resize(size_of(parsed->pty));
    }
    co_await answer(call, live);
}

asio::awaitable<void> stream_input(envd_call& call) {
    connect_stream stream(call.response);
    const std::string message =
        "process.Process/StreamInput is not implemented by moat serve: use SendInput";
    (void)co_await stream.async_end(code::unimplemented, message);
}

}  // namespace

void add_process_service(envd_routes& routes, serve_context& context) {
    auto service = std::make_shared<process_service>(context);
    routes.add("POST", "/process.Process/Start", with_service(service, start_process));
    routes.add("POST", "/process.Process/Connect", with_service(service, connect_process));
    routes.add("POST", "/process.Process/List", with_service(service, list_processes));
    routes.add("POST", "/process.Process/SendInput", with_service(service, send_input));
    routes.add("POST", "/process.Process/CloseStdin", with_service(service, close_stdin));
    routes.add("POST", "/process.Process/SendSignal", with_service(service, send_signal));
    routes.add("POST", "/process.Process/Update", with_service(service, update_process));
    routes.add("POST", "/process.Process/StreamInput", stream_input);
}

}  // namespace moat::serve
