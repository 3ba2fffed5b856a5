#include "serve/code_interpreter.hpp"

#include <moat/log.hpp>

#include "core/asio_compat.hpp"
#include "core/base64.hpp"
#include "core/json_writer.hpp"
#include "core/utf8.hpp"
#include "e2b_protocol/code_interpreter_messages.hpp"
#include "serve/server_secret.hpp"
#include "tools/python_kernel.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <type_traits>

namespace moat::serve {

namespace protocol = e2b_protocol;

namespace {

using std::chrono::milliseconds;

// The id the default python context (the interpreter's own, "" to python_kernel) is known by.
constexpr std::string_view default_context_id = "default";
// What one execution may have queued for a client that reads slower than the cell writes; past
// it output is dropped and the end of the answer says how much.
constexpr std::size_t max_queued_bytes = 32 * 1024 * 1024;
// A line after this long without one, so the client (and any proxy) sees the answer alive.
constexpr auto keepalive_after = std::chrono::seconds(5);
// The answer's head goes out with the first line, or after this long without one (the SDK's
// timeoutMs runs from the head; an unknown context is known well within it and answers 404).
constexpr auto head_after = std::chrono::milliseconds(300);
// Output is sent a line at a time, as Jupyter's kernels send it; a line still open goes out after
// this long (a progress bar, a prompt without a newline).
constexpr auto partial_line_after = std::chrono::milliseconds(50);
// Context operations (their supervisor answers at once unless a cell holds the sandbox's turn).
constexpr auto manage_limit = std::chrono::seconds(40);

asio::awaitable<void> send_json_error(http::server_response& response, int status,
                                      std::string_view message) {
    (void)co_await response.async_send_error(status, message);
}

asio::awaitable<void> send_json(http::server_response& response, int status, std::string body) {
    http::header_list headers;
    headers.add("Content-Type", "application/json");
    (void)co_await response.async_send(status, std::move(headers), std::move(body));
}

// The body, up to `cap` bytes (too_large past it).
asio::awaitable<result<std::string>> read_capped(http::server_request& request, std::size_t cap) {
    std::string body;
    for (;;) {
        auto piece = co_await request.async_read_some();
        if (!piece) co_return std::move(piece).error();
        if (piece->empty()) co_return body;
        if (body.size() + piece->size() > cap) {
            co_return make_error(errc::too_large,
                                 "the request body is over " + std::to_string(cap) + " bytes");
        }
        body.append(*piece);
    }
}

// The body read (up to `cap`) and parsed by `parse`; nullopt once it has answered why not: 413
// past the cap, 400 for a broken body, 422 for one that does not validate (FastAPI's answer).
template <class Parse>
asio::awaitable<std::optional<typename std::invoke_result_t<Parse, std::string_view>::value_type>>
read_json(http::server_request& request, http::server_response& response, std::size_t cap,
          Parse parse) {
    auto body = co_await read_capped(request, cap);
    if (!body) {
        co_await send_json_error(response, body.error().code == errc::too_large ? 413 : 400,
                                 body.error().detail);
        co_return std::nullopt;
    }
    auto parsed = parse(*body);
    if (!parsed) {
        co_await send_json_error(response, 422, parsed.error().detail);
        co_return std::nullopt;
    }
    co_return std::move(*parsed);
}

// The bytes of `text` that end in a whole UTF-8 sequence; the rest (at most 3 bytes of a
// sequence cut by the chunking) waits for the next chunk.
std::size_t whole_utf8_prefix(std::string_view text) {
    const std::size_t from = text.size() > 3 ? text.size() - 3 : 0;
    for (std::size_t i = text.size(); i-- > from;) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if ((byte & 0xC0) != 0x80) {  // a lead byte (or ASCII): is its sequence complete?
            const auto step = decode_utf8(text, i);
            if (step.is_valid || i + step.length < text.size()) return text.size();
            const std::size_t needed = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
            return i + needed > text.size() ? i : text.size();
        }
    }
    return text.size();
}

// What one execution has for its client, in order.
struct execution_lines {
    explicit execution_lines(const asio::any_io_executor& ex) : wake(ex) {}
    std::deque<std::string> lines;
    std::size_t queued_bytes = 0;
    std::uint64_t dropped_bytes = 0;
    asio::steady_timer wake;              // cancelled when a line arrives or the cell ends
    asio::cancellation_signal stop_cell;  // kills the cell (the server stops)
    std::shared_ptr<cell_interrupt> interrupt = std::make_shared<cell_interrupt>();
    bool done = false;         // the cell ended and its last lines are queued
    bool client_gone = false;  // a write failed
    std::string carry[2];      // stdout's and stderr's cut UTF-8 sequence
    std::string open_line[2];  // stdout's and stderr's text after their last newline

    bool has_open_lines() const { return !open_line[0].empty() || !open_line[1].empty(); }
    void flush_open_lines() {
        for (int i = 0; i < 2; ++i) {
            if (open_line[i].empty()) continue;
            push(protocol::encode_stream_line(i == 1, open_line[i],
                                              std::chrono::system_clock::now()));
            open_line[i].clear();
        }
    }

    void push(std::string line, bool always = false) {
        if (!always && queued_bytes + line.size() > max_queued_bytes) {
            dropped_bytes += line.size();
            return;
        }
        queued_bytes += line.size();
        lines.push_back(std::move(line));
        wake.cancel();
    }
    void output(output_channel channel, std::string_view data) {
        const int i = channel == output_channel::err ? 1 : 0;
        std::string text = std::move(carry[i]);
        text.append(data);
        const auto whole = whole_utf8_prefix(text);
        carry[i] = text.substr(whole);
        text.resize(whole);
        // Text from the other channel ends this one's open line first: the order is kept.
        if (!open_line[1 - i].empty()) {
            push(protocol::encode_stream_line(1 - i == 1, open_line[1 - i],
                                              std::chrono::system_clock::now()));
            open_line[1 - i].clear();
        }
        open_line[i].append(text);
        const auto last_newline = open_line[i].rfind('\n');
        if (last_newline == std::string::npos) return;
        push(protocol::encode_stream_line(i == 1, open_line[i].substr(0, last_newline + 1),
                                          std::chrono::system_clock::now()));
        open_line[i].erase(0, last_newline + 1);
    }
    void event(const cell_event& e) {
        if (const auto* result = std::get_if<display_result>(&e)) {
            std::vector<std::pair<std::string, std::string>> reps;
            for (const auto& r : result->representations) {
                // The wire carries binary representations as base64, as Jupyter does.
                const bool binary =
                    r.media_type.starts_with("image/") && r.media_type != "image/svg+xml";
                reps.emplace_back(r.media_type, binary ? base64_encode(r.data) : r.data);
            }
            push(protocol::encode_result_line(reps, result->is_main_result));
        } else if (const auto* failure = std::get_if<cell_error>(&e)) {
            push(protocol::encode_error_line(failure->name, failure->value, failure->traceback));
        }
    }
};

}  // namespace

struct code_interpreter::state {
    explicit state(serve_context& c) : context(c), kernel("python3", output_limits{}) {}
    serve_context& context;
    python_kernel kernel;
    // Per sandbox, the context that serves a language named without a context (javascript,
    // bash, ...; python is the interpreter's own), made on first need.
    std::map<std::string, std::map<std::string, std::string>, std::less<>> language_contexts;
    // Per sandbox, the context ids this server has seen exist (created or listed): an /execute
    // naming another is checked against the interpreter's list before it runs, so an unknown
    // one is a 404 whatever the timing.
    std::map<std::string, std::set<std::string>, std::less<>> known_contexts;
    // (sandbox, context) that have run a cell: a later cell that starts a new interpreter there
    // says the context was restarted.
    std::set<std::pair<std::string, std::string>> ran;

    // Forgets what belonged to sandboxes this server no longer has.
    void prune() {
        const auto gone = [this](const std::string& id) {
            auto entry = context.registry.find(id);
            return !entry || entry->ended.is_set();
        };
        std::erase_if(language_contexts, [&](const auto& e) { return gone(e.first); });
        std::erase_if(known_contexts, [&](const auto& e) { return gone(e.first); });
        std::erase_if(ran, [&](const auto& e) { return gone(e.first); });
    }
};

namespace {

using state_ptr = std::shared_ptr<code_interpreter::state>;

std::string public_id(const std::string& kernel_id) {
    return kernel_id.empty() ? std::string(default_context_id) : kernel_id;
}
std::string kernel_id(std::string_view public_context) {
    return public_context == default_context_id ? std::string() : std::string(public_context);
}

std::string home_of(const registry_entry& sandbox) {
    const auto& home = sandbox.handle->info().layout.home;
    return home.empty() ? std::string("/home/user") : home;
}

// The status and message for an error of python_kernel's.
int status_of(const error& e) {
    if (e.code == errc::invalid_argument) return 404;  // "no such context" (or a missing cwd)
    if (e.code == errc::not_supported) return 400;
    if (e.code == errc::sandbox_unavailable || e.code == errc::sandbox_not_found) return 502;
    return 500;
}

// The context for a language with no context named: the interpreter's own for python, else the
// sandbox's context for that language, made on first need.
asio::awaitable<result<std::string>> context_for_language(state_ptr s,
                                                          std::shared_ptr<registry_entry> sandbox,
                                                          std::string language) {
    if (language == "python") co_return std::string();
    s->prune();
    auto& known = s->language_contexts[sandbox->id];
    if (const auto it = known.find(language); it != known.end()) co_return it->second;
    auto made = co_await s->kernel.async_create_context(
        sandbox->handle, language, home_of(*sandbox), deadline::after(manage_limit));
    if (!made) co_return std::move(made).error();
    s->known_contexts[sandbox->id].insert(made->id);
    // Another request may have made one meanwhile: keep the first, the other stays listed.
    auto& again = s->language_contexts[sandbox->id];
    const auto [it, inserted] = again.emplace(language, made->id);
    co_return it->second;
}

// Whether the sandbox has the context: what this server has seen, else the interpreter's list.
asio::awaitable<result<bool>> context_exists(state_ptr s, std::shared_ptr<registry_entry> sandbox,
                                             std::string id) {
    if (id.empty()) co_return true;  // the default context always is
    if (s->known_contexts[sandbox->id].contains(id)) co_return true;
    auto listed =
        co_await s->kernel.async_list_contexts(sandbox->handle, deadline::after(manage_limit));
    if (!listed) co_return std::move(listed).error();
    auto& known = s->known_contexts[sandbox->id];
    for (const auto& c : *listed) known.insert(c.id);
    co_return known.contains(id);
}

asio::awaitable<void> run_cell(state_ptr s, std::shared_ptr<registry_entry> sandbox,
                               execution_lines& x, std::string code, cell_options options,
                               std::optional<error>& failure) {
    const std::string context_id = options.context;
    const milliseconds limit = s->context.options.code_cell_limit;
    auto* lines = &x;
    std::function<void(output_channel, std::string_view)> on_output =
        [lines](output_channel channel, std::string_view data) { lines->output(channel, data); };
    cell_event_sink on_event = [lines](const cell_event& e) {
        lines->flush_open_lines();  // a result comes after the output before it
        lines->event(e);
    };
    auto run = s->kernel.async_run(sandbox->handle, std::move(code), limit, deadline{},
                                   std::move(on_output), std::move(on_event), std::move(options));
    auto executor = co_await asio::this_coro::executor;
    auto outcome = co_await asio::co_spawn(
        executor, std::move(run),
        asio::bind_cancellation_slot(x.stop_cell.slot(), asio::use_awaitable));
    for (int i = 0; i < 2; ++i) {
        if (!x.carry[i].empty()) {
            x.push(
                protocol::encode_stream_line(i == 1, x.carry[i], std::chrono::system_clock::now()));
        }
    }
    if (!outcome) {
        failure = outcome.error();
    } else {
        const auto seconds = std::to_string(limit.count() / 1000);
        // A cell that starts a new interpreter where an earlier cell ran says so: the context's
        // variables are gone (a kill past the interrupt, a crash, a restart), and the client of
        // the cell that was killed may have gone before its end was told.
        const bool known = !s->ran.insert({sandbox->id, context_id}).second;
        if (known && outcome->started_interpreter) {
            x.push(protocol::encode_stream_line(
                       true,
                       "[moat: this context's interpreter was restarted before this cell (its "
                       "last cell was killed, it crashed, or it was restarted): the variables it "
                       "had are gone]\n",
                       std::chrono::system_clock::now()),
                   true);
        }
        switch (outcome->how) {
            case cell_outcome::ending::timed_out:
                x.push(protocol::encode_error_line(
                           "TimeoutError",
                           "the cell ran past " + seconds +
                               " s and did not stop when interrupted: its interpreter was killed "
                               "and restarted (the context's variables are gone)",
                           ""),
                       true);
                break;
            case cell_outcome::ending::crashed:
                x.push(protocol::encode_error_line(
                           "DeadKernelError",
                           "the interpreter exited during the cell" +
                               std::string(outcome->oom_killed ? " (out of memory)" : "") +
                               "; the context's next cell starts a new one",
                           ""),
                       true);
                break;
            case cell_outcome::ending::busy:
                x.push(
                    protocol::encode_error_line("BusyError",
                                                "another cell of this sandbox (in any context) ran "
                                                "for the whole 30 s this one waited; one cell runs "
                                                "at a time per sandbox",
                                                ""),
                    true);
                break;
            default:
                break;
        }
        if (outcome->cell.execution_count > 0) {
            x.push(protocol::encode_execution_count_line(outcome->cell.execution_count), true);
        }
    }
    x.done = true;
    x.wake.cancel();
}

// The answer's head: 200, NDJSON. False when the client is gone (the cell is then interrupted).
asio::awaitable<bool> begin_answer(execution_lines& x, http::server_response& response) {
    http::header_list headers;
    headers.add("Content-Type", "application/x-ndjson");
    auto begun = co_await response.async_begin(200, std::move(headers));
    if (begun) co_return true;
    x.client_gone = true;
    x.interrupt->request();
    co_return false;
}

// Writes the lines as they come (the head with the first), a keepalive after a quiet while;
// stops the cell when the client is gone.
asio::awaitable<void> write_lines(execution_lines& x, http::server_response& response,
                                  const std::optional<error>& failure) {
    for (;;) {
        while (!x.lines.empty()) {
            if (!response.is_started()) {
                const bool begun = co_await begin_answer(x, response);
                if (!begun) co_return;
            }
            std::string line = std::move(x.lines.front());
            x.lines.pop_front();
            x.queued_bytes -= line.size();
            auto written = co_await response.async_write(line);
            if (!written) {
                // As E2B's server: the client went away (its timeoutMs), so the cell is
                // interrupted and the context kept, unless it will not stop.
                x.client_gone = true;
                x.interrupt->request();
                co_return;
            }
        }
        if (x.done) co_return;
        const bool open = x.has_open_lines();
        milliseconds quiet = keepalive_after;
        if (open) quiet = partial_line_after;
        if (!response.is_started()) quiet = std::min(quiet, milliseconds(head_after));
        x.wake.expires_after(quiet);
        auto [waited] = co_await x.wake.async_wait(as_tuple(asio::use_awaitable));
        const auto cancelled = (co_await asio::this_coro::cancellation_state).cancelled();
        if (cancelled != asio::cancellation_type::none) {
            x.stop_cell.emit(asio::cancellation_type::terminal);
            co_return;
        }
        if (!waited && !response.is_started() && !open && !failure) {
            const bool begun = co_await begin_answer(x, response);
            if (!begun) co_return;
        } else if (!waited && open) {
            x.flush_open_lines();
        } else if (!waited && x.lines.empty() && !x.done && !failure) {
            x.push(protocol::encode_keepalive_line(), true);
        }
    }
}

asio::awaitable<void> execute(state_ptr s, std::shared_ptr<registry_entry> sandbox,
                              http::server_request& request, http::server_response& response) {
    const auto token = request.headers().find("X-Access-Token");
    if (!token || !constant_time_equals(*token, sandbox->access_token)) {
        co_await send_json_error(response, 401,
                                 "unauthorized access, please provide a valid access token");
        co_return;
    }
    auto parsed = co_await read_json(request, response, protocol::max_execute_body_bytes,
                                     protocol::parse_execute_request);
    if (!parsed) co_return;
    if (!parsed->context_id.empty() && !parsed->language.empty()) {
        co_await send_json_error(response, 400,
                                 "you can provide context_id or language, but not both");
        co_return;
    }
    s->prune();
    cell_options options;
    options.env = std::move(parsed->env_vars);
    if (!parsed->context_id.empty()) {
        options.context = kernel_id(parsed->context_id);
        auto exists = co_await context_exists(s, sandbox, options.context);
        if (!exists) {
            co_await send_json_error(response, status_of(exists.error()), exists.error().detail);
            co_return;
        }
        if (!*exists) {
            co_await send_json_error(response, 404, "Context " + parsed->context_id + " not found");
            co_return;
        }
    } else {
        const auto language = protocol::normalize_language(parsed->language);
        auto context = co_await context_for_language(s, sandbox, language);
        if (!context) {
            co_await send_json_error(response, status_of(context.error()),
                                     "cannot run " + language + ": " + context.error().detail);
            co_return;
        }
        options.context = std::move(*context);
    }
    using namespace asio::experimental::awaitable_operators;
    execution_lines x(co_await asio::this_coro::executor);
    options.interrupt = x.interrupt;
    std::optional<error> failure;
    auto cell = run_cell(s, sandbox, x, std::move(parsed->code), std::move(options), failure);
    auto writer = write_lines(x, response, failure);
    co_await (std::move(cell) && std::move(writer));
    if (x.client_gone) co_return;
    if (failure && !response.is_started()) {
        co_await send_json_error(response, status_of(*failure), failure->detail);
        co_return;
    }
    if (failure) {
        // Lines went out already: the failure is the answer's last error.
        (void)co_await response.async_write(
            protocol::encode_error_line("ExecutionError", failure->detail, ""));
    }
    if (x.dropped_bytes > 0) {
        (void)co_await response.async_write(protocol::encode_stream_line(
            true,
            "[moat: " + std::to_string(x.dropped_bytes) +
                " bytes of this cell's output were dropped: the client read it slower than the "
                "cell wrote it]\n",
            std::chrono::system_clock::now()));
    }
    if (!response.is_started()) {
        const bool begun = co_await begin_answer(x, response);
        if (!begun) co_return;
    }
    (void)co_await response.async_write(protocol::encode_end_line());
    (void)co_await response.async_end();
}

asio::awaitable<void> list_contexts(state_ptr s, std::shared_ptr<registry_entry> sandbox,
                                    http::server_response& response) {
    // As E2B's server, a default javascript context is listed beside python's, where node is.
    (void)co_await context_for_language(s, sandbox, "javascript");
    auto listed =
        co_await s->kernel.async_list_contexts(sandbox->handle, deadline::after(manage_limit));
    if (!listed) {
        co_await send_json_error(response, status_of(listed.error()), listed.error().detail);
        co_return;
    }
    std::vector<protocol::context_info> contexts;
    bool has_default = false;
    auto& known = s->known_contexts[sandbox->id];
    known.clear();
    for (const auto& c : *listed) {
        known.insert(c.id);
        has_default = has_default || c.id.empty();
        contexts.push_back({public_id(c.id), c.language, c.cwd});
    }
    if (!has_default) {
        contexts.insert(contexts.begin(), protocol::context_info{std::string(default_context_id),
                                                                 "python", home_of(*sandbox)});
    }
    co_await send_json(response, 200, protocol::encode_context_list(contexts));
}

asio::awaitable<void> create_context(state_ptr s, std::shared_ptr<registry_entry> sandbox,
                                     http::server_request& request,
                                     http::server_response& response) {
    auto parsed = co_await read_json(request, response, protocol::max_context_body_bytes,
                                     protocol::parse_context_request);
    if (!parsed) co_return;
    const auto language = protocol::normalize_language(parsed->language);
    const std::string cwd = parsed->cwd.empty() ? home_of(*sandbox) : parsed->cwd;
    auto made = co_await s->kernel.async_create_context(sandbox->handle, language, cwd,
                                                        deadline::after(manage_limit));
    if (!made) {
        co_await send_json_error(
            response, made.error().code == errc::invalid_argument ? 400 : 500,
            "cannot create a " + language + " context: " + made.error().detail);
        co_return;
    }
    s->known_contexts[sandbox->id].insert(made->id);
    const protocol::context_info made_context{made->id, made->language, made->cwd};
    std::string answer = protocol::encode_context(made_context);  // named (g++ 12)
    co_await send_json(response, 200, std::move(answer));
}

asio::awaitable<void> change_context(state_ptr s, std::shared_ptr<registry_entry> sandbox,
                                     std::string id, bool restart,
                                     http::server_response& response) {
    const auto limit = deadline::after(manage_limit);
    result<void> done;
    if (restart) {
        done = co_await s->kernel.async_restart_context(sandbox->handle, kernel_id(id), limit);
    } else {
        done = co_await s->kernel.async_remove_context(sandbox->handle, kernel_id(id), limit);
    }
    if (!done) {
        const int status = status_of(done.error());
        const std::string message =
            status == 404 ? "Context " + id + " not found" : done.error().detail;
        co_await send_json_error(response, status, message);
        co_return;
    }
    if (!restart) {
        s->ran.erase({sandbox->id, kernel_id(id)});
        s->known_contexts[sandbox->id].erase(kernel_id(id));
        for (auto& [language, context] : s->language_contexts[sandbox->id]) {
            if (context == id) context.clear();
        }
        std::erase_if(s->language_contexts[sandbox->id],
                      [](const auto& entry) { return entry.second.empty(); });
    }
    http::header_list headers;
    (void)co_await response.async_send(204, std::move(headers), std::string());
}

}  // namespace

code_interpreter::code_interpreter(serve_context& context)
    : state_(std::make_shared<state>(context)) {}

code_interpreter::~code_interpreter() = default;

asio::awaitable<void> code_interpreter::async_serve(std::shared_ptr<registry_entry> sandbox,
                                                    http::server_request& request,
                                                    http::server_response& response) {
    const auto method = request.method();
    const auto path = request.path();
    auto s = state_;
    if (method == "GET" && path == "/health") {
        http::header_list headers;
        headers.add("Content-Type", "application/json");
        (void)co_await response.async_send(200, std::move(headers), "\"OK\"");
    } else if (method == "POST" && path == "/execute") {
        co_await execute(s, std::move(sandbox), request, response);
    } else if (method == "GET" && path == "/contexts") {
        co_await list_contexts(s, std::move(sandbox), response);
    } else if (method == "POST" && path == "/contexts") {
        co_await create_context(s, std::move(sandbox), request, response);
    } else if (path.starts_with("/contexts/")) {
        auto rest = path.substr(std::string_view("/contexts/").size());
        const bool restart = rest.ends_with("/restart");
        if (restart) rest.remove_suffix(std::string_view("/restart").size());
        if (rest.empty() || rest.find('/') != std::string_view::npos ||
            (restart ? method != "POST" : method != "DELETE")) {
            co_await send_json_error(response, 404, "no such route on the code interpreter");
        } else {
            co_await change_context(s, std::move(sandbox), std::string(rest), restart, response);
        }
    } else {
        co_await send_json_error(response, 404, "no such route on the code interpreter");
    }
}

}  // namespace moat::serve
