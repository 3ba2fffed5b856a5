#include "tools/python_kernel.hpp"

#include <moat/with_timeout.hpp>

#include "core/asio_compat.hpp"
#include "core/json_writer.hpp"
#include "tools/cell_output.hpp"
#include "tools/kernel_link.hpp"
#include "tools/python_driver.hpp"

#include <simdjson.h>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

namespace moat {

namespace {

using clock = std::chrono::steady_clock;

// Time for a killed relay's end to be reported, or a finished one's exit, before we stop waiting.
constexpr auto reap_grace = std::chrono::seconds(3);
// Starting the supervisor and the relay's answer past its turn wait.
constexpr auto start_bound = std::chrono::seconds(15);
// The supervisor's kill of an interpreter whose cell was stopped (it waits 5 s for the reap).
constexpr auto stop_bound = std::chrono::seconds(8);
// Attempts to reach an interpreter that is not there yet (each one may start a supervisor).
constexpr int start_rounds = 4;
// The longest a cell waits for another worker's cell.
constexpr std::chrono::milliseconds max_turn_wait = std::chrono::seconds(30);
// A relay's or supervisor's first line, and the stderr kept for an error message.
constexpr std::size_t max_greeting = 256;
constexpr std::size_t max_kept_err = 4096;

// The first line a relay, a supervisor or a direct connection sends, and what followed it.
struct greeting {
    bool complete = false;  // a whole line arrived (else the program ended first)
    std::string line;       // the line, or what arrived of it so far
    std::string rest;
    std::string err;                    // its stderr so far (its own Python errors), capped
    std::optional<exec_result> exited;  // it ended before or right after its line
};

// Reads into `g` until its line is complete or the link ends. Resumable: a wait cancelled by a
// timeout keeps what arrived in `g`, and a later call goes on from there.
asio::awaitable<result<void>> read_greeting(kernel_link& link, greeting& g,
                                            std::size_t max_line = max_greeting) {
    while (!g.complete && !g.exited) {
        auto next = co_await link.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            if (chunk->channel == output_channel::err) {
                const auto room = max_kept_err - std::min(max_kept_err, g.err.size());
                g.err.append(chunk->data.substr(0, room));
                continue;
            }
            g.line += chunk->data;
            const auto newline = g.line.find('\n');
            if (newline != std::string::npos) {
                g.complete = true;
                g.rest = g.line.substr(newline + 1);
                g.line.resize(newline);
                co_return result<void>{};
            }
            if (g.line.size() > max_line) {
                co_return make_error(
                    errc::backend_failure,
                    "the Python relay's first line is over " + std::to_string(max_line) + " bytes");
            }
            continue;
        }
        g.exited = std::get<exec_result>(std::move(*next));
    }
    co_return result<void>{};
}

// The first line of a program's stderr, for an error message.
std::string first_line(const std::string& text) {
    const auto newline = text.find('\n');
    return text.substr(0, std::min<std::size_t>(newline, 200));
}

struct cell_read {
    std::optional<exec_result> exited;  // set when the relay ended before the end record
};

asio::awaitable<result<cell_read>> read_cell(kernel_link& link, cell_output& results) {
    cell_read read;
    while (!results.is_done() && !results.is_broken()) {
        auto next = co_await link.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            if (chunk->channel == output_channel::out) {
                results.feed(chunk->data);
            } else {
                results.feed_unframed(chunk->data);
            }
            continue;
        }
        read.exited = std::get<exec_result>(std::move(*next));
        break;
    }
    co_return read;
}

// Interrupts the cell at `when`, or at once when the caller asks (`trigger`), then waits
// python_kernel::interrupt_grace and returns: the cell did not end, and the exchange is stopped.
// Returns early (cancelled) when the cell ends first.
asio::awaitable<void> interrupt_at(kernel_link& link, deadline when, bool& interrupted,
                                   std::shared_ptr<cell_interrupt> trigger) {
    asio::steady_timer timer(co_await asio::this_coro::executor, when.when());
    struct registration {
        cell_interrupt* trigger;
        ~registration() {
            if (trigger) trigger->waiting = nullptr;
        }
    } registered{trigger.get()};
    if (trigger) {
        trigger->waiting = &timer;
        if (trigger->requested()) timer.expires_at(clock::now());
    }
    auto [waited] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
    const auto stopped = (co_await asio::this_coro::cancellation_state).cancelled();
    if (stopped != asio::cancellation_type::none) co_return;  // the cell ended first
    if (waited && !(trigger && trigger->requested())) co_return;
    interrupted = true;
    registered.trigger = nullptr;
    if (trigger) trigger->waiting = nullptr;
    std::string interrupt = "i";
    (void)co_await link.async_write(std::move(interrupt));
    timer.expires_after(python_kernel::interrupt_grace);
    co_await timer.async_wait(as_tuple(asio::use_awaitable));
}

// read_cell, with the cell interrupted at `when` (or when the caller asks) if it is still running
// then, and stopped interrupt_grace after that.
asio::awaitable<result<cell_read>> read_cell_interrupting(kernel_link& link, cell_output& results,
                                                          deadline when, bool& interrupted,
                                                          std::shared_ptr<cell_interrupt> trigger) {
    using namespace asio::experimental::awaitable_operators;
    auto reading = read_cell(link, results);
    auto interrupting = interrupt_at(link, when, interrupted, std::move(trigger));
    auto first = co_await (std::move(reading) || std::move(interrupting));
    if (first.index() == 0) co_return std::move(std::get<0>(first));
    co_return make_error(errc::deadline_exceeded,
                         "the cell did not end within the grace after its interrupt");
}

// Waits (bounded) for a program's end, discarding what it still prints.
asio::awaitable<void> await_end(kernel_link& link) {
    const auto limit = deadline::after(reap_grace);
    for (;;) {
        auto pulled = link.async_next();  // a named local (g++ 12)
        auto next = co_await with_timeout(std::move(pulled), limit);
        if (!next || std::holds_alternative<exec_result>(*next)) break;
    }
}

// "go <generation> <fresh> <cell number>": false if the line is not that. (The generation is 0
// for a cell of another context while the default one has not started.)
bool parse_go(std::string_view line, std::uint64_t& generation, bool& fresh,
              std::uint64_t& number) {
    if (!line.starts_with("go ")) return false;
    line.remove_prefix(3);
    std::uint64_t fields[3] = {0, 0, 0};
    const char* at = line.data();
    const char* end = line.data() + line.size();
    for (int i = 0; i < 3; ++i) {
        if (i != 0 && (at == end || *at++ != ' ')) return false;
        const auto parsed = std::from_chars(at, end, fields[i]);
        if (parsed.ec != std::errc() || parsed.ptr == at) return false;
        at = parsed.ptr;
    }
    if (at != end || fields[1] > 1) return false;
    generation = fields[0];
    fresh = fields[1] == 1;
    number = fields[2];
    return true;
}

// The supervisor's own end records: "NNN crashed <exit code> <signal>", "NNN killed".
bool parse_crash(std::string_view line, int& exit_code, int& signal) {
    const auto first_space = line.find(' ');
    if (first_space == std::string_view::npos) return false;
    line.remove_prefix(first_space + 1);
    if (line == "killed") {
        exit_code = 128 + SIGKILL;
        signal = SIGKILL;
        return true;
    }
    if (!line.starts_with("crashed ")) return false;
    line.remove_prefix(8);
    const auto parsed_code = std::from_chars(line.data(), line.data() + line.size(), exit_code);
    if (parsed_code.ec != std::errc() || parsed_code.ptr == line.data() + line.size()) {
        return false;
    }
    const char* rest = parsed_code.ptr + 1;
    const auto parsed_signal = std::from_chars(rest, line.data() + line.size(), signal);
    return parsed_signal.ec == std::errc();
}

// The interpreter isolated from the sandbox's environment and site (-I -S), running `source` with
// one argument: how every program of the protocol (supervisor, relay) starts.
std::vector<std::string> isolated_python(const std::string& python, std::string_view source,
                                         std::string argument) {
    return {python, "-I", "-S", "-c", std::string(source), std::move(argument)};
}

// Where the supervisor listens, as the sandbox's agent resolves it (the supervisor runs in the
// workdir), or "" when that path does not fit a unix socket address.
std::string supervisor_socket(const sandbox& box) {
    std::string path = box.info().layout.workdir;
    if (path.empty() || path.front() != '/') return {};
    if (path.back() != '/') path += '/';
    path += ".cells/.kernel/sock";
    constexpr std::size_t max_socket_path = 107;  // sockaddr_un::sun_path, with its terminator
    if (path.size() > max_socket_path) return {};
    return path;
}

// Whether `limit`, the caller's, ends no later than `bound`: a timeout then is the caller's.
bool caller_first(deadline limit, deadline bound) {
    return !limit.is_never() && limit.when() <= bound.when();
}

// Sends a direct link's frame and reads the supervisor's first line into `answer`: "busy" when
// the turn did not come within `turn_wait`. The supervisor queues a direct connection until the
// exchange before it ends, then offers it the turn ("turn"), which the worker takes ("y"); a
// worker past its turn wait closes the link instead, and its frame runs nothing.
asio::awaitable<result<void>> take_turn(kernel_link& link, std::string frame, greeting& answer,
                                        std::chrono::milliseconds turn_wait, std::size_t max_line,
                                        deadline limit) {
    const auto turn_bound = earliest(limit, deadline::after(turn_wait));
    const auto busy = [&link, &answer]() -> result<void> {
        link.close();
        answer.complete = true;
        answer.line = "busy";
        return {};
    };
    // The turn wait covers sending the frame too: a large one fills the socket until the
    // supervisor reads it, and a frame cut short runs nothing.
    auto sending = link.async_write("t\n" + frame);  // a named local (g++ 12)
    auto sent = co_await with_timeout(std::move(sending), turn_bound);
    co_await asio::this_coro::reset_cancellation_state();
    greeting offer;
    if (sent) {
        auto waiting = read_greeting(link, offer);  // a named local (g++ 12)
        auto read = co_await with_timeout(std::move(waiting), turn_bound);
        co_await asio::this_coro::reset_cancellation_state();
        sent = std::move(read);
    }
    if (!sent) {
        if (sent.error().code == errc::deadline_exceeded && !caller_first(limit, turn_bound)) {
            co_return busy();
        }
        co_return std::move(sent).error();
    }
    if (!offer.complete || offer.line != "turn" || !offer.rest.empty()) {
        answer = std::move(offer);  // the supervisor's end, or what it said instead
        co_return result<void>{};
    }
    const auto answer_bound = earliest(limit, deadline::after(start_bound));
    std::string take = "y";
    auto taking = link.async_write(std::move(take));  // a named local (g++ 12)
    auto taken = co_await with_timeout(std::move(taking), answer_bound);
    co_await asio::this_coro::reset_cancellation_state();
    if (!taken) co_return std::move(taken).error();
    auto answering = read_greeting(link, answer, max_line);  // a named local (g++ 12)
    auto answered = co_await with_timeout(std::move(answering), answer_bound);
    co_await asio::this_coro::reset_cancellation_state();
    co_return answered;
}

}  // namespace

asio::awaitable<result<std::optional<kernel_link>>> python_kernel::reach(
    sandbox& box, std::chrono::milliseconds relay_wait, std::chrono::milliseconds wall,
    deadline limit) {
    if (const auto path = supervisor_socket(box); !path.empty()) {
        auto connected = co_await box.async_connect_unix(path, limit);
        if (connected) co_return std::optional<kernel_link>(kernel_link(std::move(*connected)));
        if (connected.error().code == errc::connection_refused) {
            co_return std::optional<kernel_link>();  // no supervisor (yet)
        }
        if (connected.error().code != errc::not_supported) co_return std::move(connected).error();
    }
    // A backend without unix connections (e2b): a relay, which takes the turn itself.
    exec_request call;
    call.argv = isolated_python(python_, python_relay_source(), std::to_string(relay_wait.count()));
    call.wall_limit = std::min<std::chrono::milliseconds>(exec_request::max_spawn_wall_limit,
                                                          wall + relay_wait + start_bound);
    auto spawned = co_await box.async_spawn(std::move(call), limit);
    if (!spawned) co_return std::move(spawned).error();
    co_return std::optional<kernel_link>(kernel_link(std::move(*spawned)));
}

asio::awaitable<void> python_kernel::confirm_stopped(sandbox& box) {
    const auto limit = deadline::after(stop_bound + start_bound);
    auto reached = co_await reach(box, stop_bound, stop_bound, limit);
    if (!reached || !*reached) co_return;  // no supervisor: nothing is left to stop
    kernel_link ping = std::move(**reached);
    std::string frame = "p\n";
    auto sent = co_await with_timeout(ping.async_write(std::move(frame)), limit);
    if (!sent) co_return;
    greeting answer;
    auto greeted_op = read_greeting(ping, answer);  // a named local (g++ 12)
    (void)co_await with_timeout(std::move(greeted_op), limit);
    co_await await_end(ping);
}

python_kernel::python_kernel(std::string python, output_limits capture)
    : python_(std::move(python)), capture_(capture) {}

python_kernel::~python_kernel() = default;

asio::awaitable<result<void>> python_kernel::start_resident(sandbox& box, deadline limit) {
    exec_request start;
    start.argv =
        isolated_python(python_, python_resident_source(), std::string(python_driver_source()));
    start.wall_limit = exec_request::max_spawn_wall_limit;
    start.resident = true;
    auto spawned = co_await box.async_spawn(std::move(start), limit);
    if (!spawned) co_return std::move(spawned).error();
    kernel_link supervisor(std::move(*spawned));
    const auto bound = earliest(limit, deadline::after(start_bound));
    greeting greeted;
    auto greeted_op = read_greeting(supervisor, greeted);  // a named local (g++ 12)
    auto read = co_await with_timeout(std::move(greeted_op), bound);
    co_await asio::this_coro::reset_cancellation_state();
    if (!read) co_return std::move(read).error();
    if (greeted.complete && greeted.line == "ready") co_return result<void>{};
    if (greeted.complete && greeted.line == "running") {
        // Another worker's supervisor holds the lock and is about to listen.
        asio::steady_timer pause(co_await asio::this_coro::executor);
        pause.expires_after(std::chrono::milliseconds(50));
        co_await pause.async_wait(asio::use_awaitable);
        co_return result<void>{};
    }
    co_return make_error(
        errc::backend_failure,
        "the Python interpreter's supervisor did not start" +
            (greeted.err.empty() ? std::string() : ": " + first_line(greeted.err)));
}

asio::awaitable<result<python_kernel::link_answer>> python_kernel::open_link(
    sandbox& box, std::string frame, std::chrono::milliseconds turn_wait,
    std::chrono::milliseconds wall, std::size_t max_line, deadline limit) {
    for (int round = 0;; ++round) {
        auto reached = co_await reach(box, turn_wait, wall, limit);
        if (!reached) co_return std::move(reached).error();
        bool none = !*reached;
        std::optional<kernel_link> link = std::move(*reached);
        greeting got;
        if (link && link->is_direct()) {
            auto turn = co_await take_turn(*link, frame, got, turn_wait, max_line, limit);
            if (!turn) {
                if (turn.error().code == errc::deadline_exceeded ||
                    turn.error().code == errc::cancelled) {
                    co_return std::move(turn).error();
                }
                co_return make_error(
                    errc::backend_failure,
                    "the Python interpreter did not answer: " + turn.error().detail);
            }
        } else if (link) {
            std::string sent = frame;
            auto written = co_await link->async_write(std::move(sent));
            if (!written && written.error().code == errc::cancelled) {
                co_return std::move(written).error();
            }
            const auto bound = earliest(limit, deadline::after(turn_wait + start_bound));
            auto greeted_op = read_greeting(*link, got, max_line);  // a named local (g++ 12)
            auto read = co_await with_timeout(std::move(greeted_op), bound);
            co_await asio::this_coro::reset_cancellation_state();
            if (!read) {
                if (read.error().code == errc::deadline_exceeded && caller_first(limit, bound)) {
                    co_return std::move(read).error();
                }
                if (read.error().code == errc::cancelled) co_return std::move(read).error();
                co_return make_error(errc::backend_failure,
                                     "the Python relay did not answer: " + read.error().detail);
            }
            if (got.complete && got.line == "none") {
                none = true;
                co_await await_end(*link);
            }
        }
        if (none) {
            if (round + 1 == start_rounds) {
                co_return make_error(
                    errc::backend_failure,
                    "the sandbox's Python interpreter could not be reached after " +
                        std::to_string(start_rounds) + " starts");
            }
            auto started = co_await start_resident(box, limit);
            if (!started) co_return std::move(started).error();
            continue;
        }
        co_return link_answer{std::move(*link), got.complete, std::move(got.line),
                              std::move(got.rest), std::move(got.err)};
    }
}

asio::awaitable<result<cell_outcome>> python_kernel::async_run(
    std::shared_ptr<sandbox> box, std::string code, std::chrono::milliseconds timeout,
    deadline limit, std::function<void(output_channel, std::string_view)> on_output,
    cell_event_sink on_event, cell_options options) {
    cell_outcome outcome;
    std::string framed;
    if (options.context.empty() && options.env.empty()) {
        framed = std::to_string(code.size()) + "\n" + code;
    } else {
        json_writer request;
        request.begin_object().key("code").value(code).key("context").value(options.context);
        request.key("env").begin_object();
        for (const auto& [key, value] : options.env) request.key(key).value(value);
        request.end_object().end_object();
        const std::string json = request.take();
        framed = "x" + std::to_string(json.size()) + "\n" + json;
    }
    const auto turn_wait = std::min(timeout, max_turn_wait);
    auto opened =
        co_await open_link(*box, std::move(framed), turn_wait, timeout, max_greeting, limit);
    if (!opened) co_return std::move(opened).error();
    kernel_link link = std::move(opened->link);
    if (opened->complete && opened->line == "busy") {
        outcome.how = cell_outcome::ending::busy;
        co_await await_end(link);
        co_return outcome;
    }
    if (opened->complete && opened->line == "unknown") {
        co_await await_end(link);
        co_return make_error(errc::invalid_argument,
                             "no such context: " + options.context.substr(0, 64));
    }
    bool fresh = false;
    if (!opened->complete ||
        !parse_go(opened->line, outcome.generation, fresh, outcome.cell_number)) {
        co_await await_end(link);
        co_return make_error(
            errc::backend_failure,
            "the Python relay failed" +
                (opened->err.empty() ? std::string() : ": " + first_line(opened->err)));
    }
    outcome.started_interpreter = fresh;
    cell_output results(capture_);
    if (on_output) results.on_output(on_output);
    if (on_event) results.on_event(std::move(on_event));
    const auto started = clock::now();
    const auto cell_limit = deadline::after(timeout);
    const auto kill_limit = deadline::after(timeout + interrupt_grace);
    // The interrupt's own wait stops the cell at kill_limit; this bound is its backstop.
    const auto first = earliest(deadline::after(timeout + 2 * interrupt_grace), limit);
    results.feed(opened->rest);
    bool interrupted = false;
    auto exchange =
        read_cell_interrupting(link, results, cell_limit, interrupted, options.interrupt);
    auto read = co_await with_timeout(std::move(exchange), first);
    co_await asio::this_coro::reset_cancellation_state();
    outcome.duration =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - started);
    outcome.out = results.finish_out();
    outcome.err = results.finish_err();
    outcome.cell = results.finish_result();

    if (!read) {
        // The link's end (the connection closed, or the relay killed) has the supervisor kill the
        // interpreter. A ping, served after that, confirms it (bounded).
        link.close();
        co_await confirm_stopped(*box);
        const bool caller_first = !limit.is_never() && limit.when() <= kill_limit.when();
        if (read.error().code == errc::deadline_exceeded && !caller_first) {
            outcome.how = cell_outcome::ending::timed_out;
            outcome.exit_code = 124;
            co_return outcome;
        }
        co_return std::move(read).error();
    }
    if (results.is_broken() || read->exited) {
        // Only code that writes to the driver's own descriptors breaks the channel (the
        // supervisor then kills the interpreter), and only the supervisor's own end (a cell that
        // killed it) ends the link before the end record: either way the interpreter is gone.
        co_await await_end(link);
        outcome.how = cell_outcome::ending::crashed;
        outcome.signal = SIGKILL;
        outcome.exit_code = 128 + SIGKILL;
        co_return outcome;
    }
    co_await await_end(link);  // its end hands the turn on
    int exit_code = 0;
    int signal = 0;
    if (parse_crash(results.status_line(), exit_code, signal)) {
        outcome.how = cell_outcome::ending::crashed;
        outcome.exit_code = exit_code;
        outcome.signal = signal;
        co_return outcome;
    }
    const auto status = parse_marker_line(results.status_line());
    outcome.raised = status.raised;
    outcome.exception_type = status.exception_type;
    // An interrupt that arrived after the cell's end was ignored: the cell completed.
    if (interrupted && status.exception_type == "KeyboardInterrupt") {
        outcome.how = cell_outcome::ending::interrupted;
    }
    co_return outcome;
}

namespace {

// The longest answer of a context operation (a list of 32 contexts with their directories).
constexpr std::size_t max_answer = 64 * 1024;

std::string context_request(std::string_view op, std::string_view id) {
    json_writer w;
    w.begin_object().key("op").value(op).key("id").value(id).end_object();
    return w.take();
}

}  // namespace

asio::awaitable<result<std::string>> python_kernel::manage(sandbox& box, std::string request,
                                                           deadline limit) {
    std::string frame = "c" + std::to_string(request.size()) + "\n" + request;
    auto opened =
        co_await open_link(box, std::move(frame), max_turn_wait, max_turn_wait, max_answer, limit);
    if (!opened) co_return std::move(opened).error();
    co_await await_end(opened->link);
    const std::string_view line = opened->line;
    if (opened->complete && line.starts_with("ok ")) co_return std::string(line.substr(3));
    if (opened->complete && line == "busy") {
        co_return make_error(errc::backend_failure,
                             "busy: a cell held the sandbox's interpreter for 30 s");
    }
    if (opened->complete && line.starts_with("error ")) {
        const auto reason = line.substr(6);
        const auto code = reason.starts_with("unsupported language") ? errc::not_supported
                                                                     : errc::invalid_argument;
        co_return make_error(code, std::string(reason));
    }
    co_return make_error(errc::backend_failure, "the Python supervisor did not answer");
}

asio::awaitable<result<python_context>> python_kernel::async_create_context(
    std::shared_ptr<sandbox> box, std::string language, std::string cwd, deadline limit) {
    json_writer w;
    w.begin_object().key("op").value("create").key("language").value(language);
    w.key("cwd").value(cwd).end_object();
    std::string request = w.take();  // a named local (g++ 12)
    auto made = co_await manage(*box, std::move(request), limit);
    if (!made) co_return std::move(made).error();
    // "<id> <language>": the language by its full name ("js" is "javascript").
    const auto space = made->find(' ');
    if (space == std::string::npos) {
        co_return make_error(errc::protocol_error, "the context's creation was not confirmed");
    }
    python_context context;
    context.id = made->substr(0, space);
    context.language = made->substr(space + 1);
    context.cwd = std::move(cwd);
    co_return context;
}

asio::awaitable<result<void>> python_kernel::context_operation(sandbox& box, std::string_view op,
                                                               std::string id, deadline limit) {
    std::string request = context_request(op, id);  // a named local (g++ 12)
    auto done = co_await manage(box, std::move(request), limit);
    if (!done) co_return std::move(done).error();
    co_return result<void>{};
}

asio::awaitable<result<void>> python_kernel::async_restart_context(std::shared_ptr<sandbox> box,
                                                                   std::string id, deadline limit) {
    return context_operation(*box, "restart", std::move(id), limit);
}

asio::awaitable<result<void>> python_kernel::async_remove_context(std::shared_ptr<sandbox> box,
                                                                  std::string id, deadline limit) {
    return context_operation(*box, "remove", std::move(id), limit);
}

asio::awaitable<result<std::vector<python_context>>> python_kernel::async_list_contexts(
    std::shared_ptr<sandbox> box, deadline limit) {
    std::string request = context_request("list", "");  // a named local (g++ 12)
    auto listed = co_await manage(*box, std::move(request), limit);
    if (!listed) co_return std::move(listed).error();
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (parser.parse(*listed).get(root) != simdjson::SUCCESS || !root.is_array()) {
        co_return make_error(errc::protocol_error, "the context list is not a JSON array");
    }
    std::vector<python_context> contexts;
    for (simdjson::dom::element item : root.get_array()) {
        std::string_view id;
        std::string_view language;
        std::string_view cwd;
        if (item["id"].get(id) != simdjson::SUCCESS ||
            item["language"].get(language) != simdjson::SUCCESS ||
            item["cwd"].get(cwd) != simdjson::SUCCESS) {
            co_return make_error(errc::protocol_error, "a context entry lacks a field");
        }
        contexts.push_back({std::string(id), std::string(language), std::string(cwd)});
    }
    co_return contexts;
}

void cell_interrupt::request() noexcept {
    requested_ = true;
    if (waiting) waiting->cancel();
}

}  // namespace moat
