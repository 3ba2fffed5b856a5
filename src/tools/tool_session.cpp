// The tool session itself: one call at a time in the session's queue, each call's arguments
// checked before it takes its turn, a tool called by name, the sandbox leased from the manager for
// each call, the retry ceiling, the application's reads (artifacts, workspace files) and the
// session's end. What each tool does in the sandbox is in sandbox_tools.cpp, the background
// processes in background_processes.cpp; tool_session_state.hpp is their contract.
#include "tools/tool_session_state.hpp"

#include <moat/log.hpp>

#include "core/exception_boundary.hpp"
#include "tools/tool_arguments.hpp"

#include <filesystem>
#include <functional>

namespace moat {

namespace tool_detail {

std::string seconds_text(std::chrono::milliseconds d) {
    const auto ms = d.count();
    if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
    return std::to_string(static_cast<double>(ms) / 1000.0).substr(0, 5) + " s";
}

std::string model_message(const error& failure) {
    if (failure.code.category() != error_category()) return "the sandbox is unavailable";
    switch (static_cast<errc>(failure.code.value())) {
        case errc::file_not_found:
        case errc::invalid_path:
        case errc::is_directory:
        case errc::permission_denied:
        case errc::too_large:
        case errc::invalid_argument:
            return failure.detail;
        case errc::limit_exceeded:
            return "too many sandboxes are running on this host right now";
        case errc::shutting_down:
            return "the code tool is shutting down";
        case errc::store_unavailable:
            return "the session store is unavailable right now; try again shortly";
        default:
            return "the sandbox is unavailable";
    }
}

bool is_callers_stop(const error& failure) {
    return failure.code == errc::cancelled || failure.code == errc::deadline_exceeded;
}

std::string sandbox_path(std::string_view given, const std::string& workdir) {
    std::filesystem::path path(given);
    if (path.is_relative()) path = std::filesystem::path(workdir) / path;
    auto normal = path.lexically_normal().string();
    if (normal.size() > 1 && normal.back() == '/') normal.pop_back();
    return normal;
}

bool is_under(std::string_view path, std::string_view dir) {
    if (dir == "/") return true;
    return path == dir ||
           (path.starts_with(dir) && path.size() > dir.size() && path[dir.size()] == '/');
}

}  // namespace tool_detail

using tool_detail::is_callers_stop;
using tool_detail::is_under;
using tool_detail::max_inline_command;
using tool_detail::model_message;
using tool_detail::sandbox_path;

tool_result tool_session::state::finish(tool_result r) {
    const bool is_run = r.tool == "run_python" || r.tool == "run_shell";
    if (!is_run || options.failures_before_stop <= 0) return r;
    if (r.status == tool_status::ok) {
        if (!uses_turns) failures = 0;
        return r;
    }
    ++failures;
    if (failures >= options.failures_before_stop) {
        r.notices.push_back("this is failed attempt " + std::to_string(failures) +
                            (uses_turns ? " in this turn" : " in a row") +
                            ": stop retrying, tell the user what went wrong and what you "
                            "tried");
    }
    return r;
}

tool_result tool_session::state::failed(std::string tool, tool_status status, std::string message,
                                        std::string hint) {
    tool_result r;
    r.tool = std::move(tool);
    r.status = status;
    r.message = std::move(message);
    r.hint = std::move(hint);
    return r;
}

tool_result tool_session::state::bad_arguments(std::string tool, std::string message,
                                               std::string hint) {
    auto r = failed(std::move(tool), tool_status::error, std::move(message), std::move(hint));
    r.argument_error = true;
    r.error_code = "invalid_arguments";
    return r;
}

tool_result tool_session::state::unavailable(std::string tool, const error& failure) {
    // The model reads only the kind; the operator's log keeps what went wrong.
    detail::log(log_level::warning, "tools", tool + ": " + failure.to_string());
    return failed(std::move(tool), tool_status::unavailable, model_message(failure),
                  "call the tool again: a new sandbox will be created (files and variables "
                  "from earlier calls will be gone); if it keeps failing, tell the user the "
                  "code tool is unavailable");
}

result<tool_result> tool_session::state::failed_step(const char* tool, error failure) {
    if (is_callers_stop(failure)) return failure;
    return unavailable(tool, failure);
}

asio::awaitable<std::optional<error>> tool_session::state::take_turn(deadline limit) {
    const auto granted = co_await calls.async_acquire(limit);
    switch (granted) {
        case operation_queue::turn::granted:
            co_return std::nullopt;
        case operation_queue::turn::deadline_passed:
            co_return make_error(errc::deadline_exceeded,
                                 "the deadline passed while an earlier call ran");
        case operation_queue::turn::cancelled:
            co_return make_error(errc::cancelled, "cancelled while an earlier call ran");
        case operation_queue::turn::refused:
            break;
    }
    co_return make_error(errc::shutting_down, "the session has ended");
}

asio::awaitable<result<tool_session::state::leased>> tool_session::state::lease(deadline limit) {
    if (ended) co_return make_error(errc::shutting_down, "the session has ended");
    auto got = co_await sessions.async_acquire(key, limit);
    if (!got) co_return std::move(got).error();
    leased l;
    l.rebuilt = got->rebuilt;
    l.moved = got->rebuilt || (!sandbox_id.empty() && sandbox_id != got->box->id());
    sandbox_id = got->box->id();
    box_info = got->box->info();
    l.lease = std::move(*got);
    co_return l;
}

asio::awaitable<result<std::string>> tool_session::state::read_exact(std::string full,
                                                                     deadline limit) {
    auto got = co_await lease(limit);
    if (!got) co_return std::move(got).error();
    std::vector<std::string> paths{std::move(full)};
    auto read = co_await got->lease.box->async_read_files(std::move(paths), limit);
    if (!read) co_return std::move(read).error();
    co_return std::move(read->front().content);
}

namespace {

using tool_operation = std::function<asio::awaitable<result<tool_result>>()>;

// One call: waits for the session's turn, runs, counts the outcome for the retry ceiling.
asio::awaitable<result<tool_result>> call_in_turn(std::shared_ptr<tool_session::state> s,
                                                  tool_operation operation, deadline limit) {
    if (auto refused = co_await s->take_turn(limit)) co_return std::move(*refused);
    result<tool_result> outcome = make_error(errc::backend_failure, "no outcome");
    try {
        outcome = co_await operation();
    } catch (...) {
        outcome = error_from_exception(std::current_exception());
    }
    s->calls.release();
    if (!outcome) co_return outcome;
    co_return s->finish(std::move(*outcome));
}

tool_result invalid_arguments(std::shared_ptr<tool_session::state>& s, std::string tool,
                              std::string message) {
    std::string hint = "call one of ";
    bool first = true;
    for (const char* name :
         {"run_python", "run_shell", "write_file", "read_file", "list_files", "start_process",
          "list_processes", "read_process_output", "stop_process"}) {
        if (!first) hint += ", ";
        first = false;
        hint += s->named(name);
    }
    hint += " with the arguments its schema names";
    return s->finish(
        tool_session::state::bad_arguments(std::move(tool), std::move(message), std::move(hint)));
}

// The checks run_python and run_shell share: a time limit in range and a non-blank program.
std::optional<tool_result> check_run_arguments(std::shared_ptr<tool_session::state>& s,
                                               const char* tool, std::chrono::milliseconds wall,
                                               const char* field, const std::string& program) {
    if (wall.count() <= 0 || wall > s->options.max_timeout) {
        return invalid_arguments(s, tool,
                                 "timeout_seconds: must be greater than 0 and at most " +
                                     std::to_string(s->options.max_timeout.count()));
    }
    if (program.find_first_not_of(" \t\r\n") == std::string::npos) {
        return invalid_arguments(s, tool, std::string(field) + ": is empty");
    }
    if (program.size() > max_program_bytes) {
        auto r = s->finish(tool_session::state::bad_arguments(
            tool,
            std::string(field) + ": too long (" + std::to_string(program.size()) +
                " bytes; at most " + std::to_string(max_program_bytes) + ")",
            "write the program to a script file with " + s->named("write_file") +
                " (in parts if needed) and run it with " + s->named("run_shell") +
                ", e.g. python3 script.py or sh script.sh"));
        return r;
    }
    return std::nullopt;
}

// run_python or run_shell: the checks they share, then the run in the session's turn.
using program_run = asio::awaitable<result<tool_result>> (tool_session::state::*)(
    std::string, std::chrono::milliseconds, deadline, output_callback);

asio::awaitable<result<tool_result>> run_program(std::shared_ptr<tool_session::state> s,
                                                 const char* tool, const char* field,
                                                 program_run run, std::string program,
                                                 std::optional<std::chrono::milliseconds> timeout,
                                                 deadline limit, output_callback on_output) {
    const auto wall = timeout.value_or(s->options.default_timeout);
    if (auto refused = check_run_arguments(s, tool, wall, field, program)) {
        co_return std::move(*refused);
    }
    tool_operation operation = [s, run, program = std::move(program), wall, limit,
                                on_output = std::move(on_output)]() mutable {
        return ((*s).*run)(std::move(program), wall, limit, std::move(on_output));
    };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

}  // namespace

tool_session::tool_session(session_manager& sessions, std::string session_key, tool_options options)
    : state_(std::make_shared<state>(sessions, std::move(session_key), std::move(options),
                                     sessions.get_executor())) {}

tool_session::~tool_session() = default;

const std::string& tool_session::session_key() const noexcept {
    return state_->key;
}

asio::any_io_executor tool_session::get_executor() const {
    return state_->sessions.get_executor();
}

std::optional<moat::sandbox_info> tool_session::current_sandbox() const {
    return state_->box_info;
}

const sandbox_layout& tool_session::layout() const noexcept {
    return state_->layout;
}

const sandbox_network& tool_session::network() const noexcept {
    return state_->network;
}

std::vector<tool_definition> tool_session::definitions() const {
    return tool_definitions(state_->layout, state_->options.tool_prefix, state_->network);
}

void tool_session::begin_turn() {
    state_->uses_turns = true;
    state_->failures = 0;
}

asio::awaitable<result<tool_result>> tool_session::async_run_python(
    std::string code, std::optional<std::chrono::milliseconds> timeout, deadline limit,
    output_callback on_output) {
    return run_program(state_, "run_python", "code", &state::run_python, std::move(code), timeout,
                       limit, std::move(on_output));
}

asio::awaitable<result<tool_result>> tool_session::async_run_shell(
    std::string command, std::optional<std::chrono::milliseconds> timeout, deadline limit,
    output_callback on_output) {
    return run_program(state_, "run_shell", "command", &state::run_shell, std::move(command),
                       timeout, limit, std::move(on_output));
}

asio::awaitable<result<tool_result>> tool_session::async_write_file(std::string path,
                                                                    std::string content,
                                                                    deadline limit) {
    auto s = state_;
    if (path.empty()) co_return invalid_arguments(s, "write_file", "path: is empty");
    tool_operation operation = [s, path = std::move(path), content = std::move(content),
                                limit]() mutable {
        return s->write_file(std::move(path), std::move(content), limit);
    };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

asio::awaitable<result<tool_result>> tool_session::async_read_file(std::string path,
                                                                   deadline limit) {
    co_return co_await async_read_file(std::move(path), file_encoding::text, limit);
}

asio::awaitable<result<tool_result>> tool_session::async_read_file(std::string path,
                                                                   file_encoding encoding,
                                                                   deadline limit) {
    auto s = state_;
    if (path.empty()) co_return invalid_arguments(s, "read_file", "path: is empty");
    tool_operation operation = [s, path = std::move(path), encoding, limit]() mutable {
        return s->read_file(std::move(path), encoding, limit);
    };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

asio::awaitable<result<tool_result>> tool_session::async_list_files(std::string path,
                                                                    deadline limit) {
    auto s = state_;
    tool_operation operation = [s, path = std::move(path), limit]() mutable {
        return s->list_files(std::move(path), limit);
    };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

asio::awaitable<result<tool_result>> tool_session::async_start_process(std::string command,
                                                                       std::string cwd,
                                                                       deadline limit) {
    auto s = state_;
    if (command.find_first_not_of(" \t\r\n") == std::string::npos)
        co_return invalid_arguments(s, "start_process", "command: is empty");
    if (command.size() > max_inline_command) {
        co_return s->finish(tool_session::state::bad_arguments(
            "start_process",
            "command: too long (" + std::to_string(command.size()) + " bytes; at most " +
                std::to_string(max_inline_command) + ")",
            "write the program to a script file with " + s->named("write_file") +
                " and start that"));
    }
    tool_operation operation = [s, command = std::move(command), cwd = std::move(cwd),
                                limit]() mutable {
        return s->start_process(std::move(command), std::move(cwd), limit);
    };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

namespace {

asio::awaitable<result<tool_result>> listed_processes(std::shared_ptr<tool_session::state> s) {
    co_return s->list_processes();
}

asio::awaitable<result<tool_result>> process_output(std::shared_ptr<tool_session::state> s,
                                                    int id) {
    co_return s->read_process_output(id);
}

}  // namespace

asio::awaitable<result<tool_result>> tool_session::async_list_processes(deadline limit) {
    auto s = state_;
    tool_operation operation = [s]() { return listed_processes(s); };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

asio::awaitable<result<tool_result>> tool_session::async_read_process_output(int id,
                                                                             deadline limit) {
    auto s = state_;
    tool_operation operation = [s, id]() { return process_output(s, id); };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

asio::awaitable<result<tool_result>> tool_session::async_stop_process(int id, deadline limit) {
    auto s = state_;
    tool_operation operation = [s, id]() { return s->stop_process(id); };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

asio::awaitable<result<tool_result>> tool_session::async_call(std::string_view named_tool,
                                                              std::string_view arguments_json,
                                                              deadline limit,
                                                              output_callback on_output) {
    auto s = state_;
    // With a prefix, only the prefixed names exist; what remains is the tool's own name.
    const std::string& prefix = s->options.tool_prefix;
    std::string_view tool = named_tool;
    const bool has_prefix = prefix.empty() || tool.starts_with(prefix);
    if (has_prefix) tool.remove_prefix(prefix.size());
    const double max_seconds = static_cast<double>(s->options.max_timeout.count());
    auto parsed = parse_tool_arguments(has_prefix ? tool : named_tool, arguments_json, max_seconds);
    if (!has_prefix && parsed) {
        parsed = make_error(errc::invalid_argument,
                            "unknown tool '" + std::string(named_tool.substr(0, 64)) + "'");
    }
    if (!parsed) co_return invalid_arguments(s, std::string(tool), parsed.error().detail);
    auto& args = *parsed;
    std::optional<std::chrono::milliseconds> timeout;
    if (args.timeout_seconds) {
        timeout = std::chrono::milliseconds(
            static_cast<std::int64_t>(*args.timeout_seconds * 1000.0 + 0.5));
        if (timeout->count() <= 0) timeout = std::chrono::milliseconds(1);
    }
    if (tool == "run_python") {
        co_return co_await async_run_python(std::move(args.code), timeout, limit,
                                            std::move(on_output));
    }
    if (tool == "run_shell") {
        co_return co_await async_run_shell(std::move(args.command), timeout, limit,
                                           std::move(on_output));
    }
    if (tool == "write_file")
        co_return co_await async_write_file(std::move(args.path), std::move(args.content), limit);
    if (tool == "read_file") {
        const auto encoding = args.base64 ? file_encoding::base64 : file_encoding::text;
        co_return co_await async_read_file(std::move(args.path), encoding, limit);
    }
    if (tool == "start_process") {
        co_return co_await async_start_process(std::move(args.command), std::move(args.cwd), limit);
    }
    if (tool == "list_processes") co_return co_await async_list_processes(limit);
    if (tool == "read_process_output") co_return co_await async_read_process_output(args.id, limit);
    if (tool == "stop_process") co_return co_await async_stop_process(args.id, limit);
    co_return co_await async_list_files(std::move(args.path), limit);
}

asio::awaitable<result<std::vector<artifact>>> tool_session::async_list_artifacts(deadline limit) {
    auto s = state_;
    auto got = co_await s->lease(limit);
    if (!got) co_return std::move(got).error();
    auto box = got->lease.box;
    auto listing = co_await s->list_artifacts(*box, limit);
    co_return std::move(listing.found);
}

asio::awaitable<result<std::string>> tool_session::async_read_artifact(std::string path,
                                                                       deadline limit) {
    auto s = state_;
    const std::string& dir = s->layout.artifacts_dir;
    const std::string full = sandbox_path(dir + "/" + path, s->layout.workdir);
    if (full == dir || !is_under(full, dir)) {
        co_return make_error(errc::invalid_path, path + ": not under " + dir);
    }
    co_return co_await s->read_exact(full, limit);
}

asio::awaitable<result<std::string>> tool_session::async_read_workspace_file(std::string path,
                                                                             deadline limit) {
    auto s = state_;
    const std::string& dir = s->layout.workdir;
    const std::string full = sandbox_path(path, dir);
    if (full == dir || !is_under(full, dir)) {
        co_return make_error(errc::invalid_path, path + ": not under " + dir);
    }
    co_return co_await s->read_exact(full, limit);
}

asio::awaitable<result<void>> tool_session::async_end() {
    auto s = state_;
    if (s->ended) co_return result<void>{};
    const auto never = deadline::never();
    if (auto refused = co_await s->take_turn(never)) co_return std::move(*refused);
    s->ended = true;
    co_await s->stop_background();
    s->calls.release();
    s->calls.refuse_all();
    auto ended = co_await s->sessions.async_end(s->key);
    // No session: no call ever needed a sandbox (or the manager already ended it).
    if (!ended && ended.error().code == errc::sandbox_not_found) co_return result<void>{};
    co_return ended;
}

}  // namespace moat
