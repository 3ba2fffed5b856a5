#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include "core/exception_boundary.hpp"
#include "handle/operation_queue.hpp"
#include "tools/python_kernel.hpp"
#include "tools/tool_arguments.hpp"

#include <asio/this_coro.hpp>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>

namespace moat {

namespace {

constexpr std::string_view workspace = "/workspace";
constexpr std::string_view artifacts_dir = "/workspace/out";
constexpr std::size_t max_artifacts = 100;
constexpr int max_artifact_depth = 4;

// What the interpreter keeps of each stream before shaping: more than a model sees, so the shaper
// can count what it omits, yet bounded.
constexpr output_limits capture_limits{256 * 1024, 256 * 1024};

const char* notice_rebuilt =
    "the environment was rebuilt: files and variables from earlier calls are gone";
const char* notice_restarted = "the interpreter restarted: variables and imports are gone";

std::string seconds_text(std::chrono::milliseconds d) {
    const auto ms = d.count();
    if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
    return std::to_string(static_cast<double>(ms) / 1000.0).substr(0, 5) + " s";
}

const char* signal_name(int signal) {
    switch (signal) {
        case SIGKILL:
            return "SIGKILL";
        case SIGSEGV:
            return "SIGSEGV";
        case SIGABRT:
            return "SIGABRT";
        case SIGBUS:
            return "SIGBUS";
        case SIGFPE:
            return "SIGFPE";
        case SIGTERM:
            return "SIGTERM";
        case SIGILL:
            return "SIGILL";
        case SIGXCPU:
            return "SIGXCPU";
        case SIGPIPE:
            return "SIGPIPE";
        default:
            return "a signal";
    }
}

std::string hint_for_python_error(const std::string& type) {
    if (type == "NameError")
        return "a name is not defined: define it first (if an earlier call defined it, the "
               "interpreter has restarted since, so run that code again)";
    if (type == "ModuleNotFoundError" || type == "ImportError")
        return "the module is not installed and the network is off: use the standard library "
               "or what is installed";
    if (type == "KeyError")
        return "the key does not exist: print the available keys first (list(d), df.columns)";
    if (type == "FileNotFoundError")
        return "the file does not exist: check with list_files (the working directory is "
               "/workspace)";
    if (type == "SyntaxError" || type == "IndentationError" || type == "TabError")
        return "fix the syntax at the line the traceback shows";
    if (type == "MemoryError") return "the data does not fit in memory: process it in parts";
    return "read the last line of the traceback and fix the code";
}

// Errors from the sandbox layer as a model may read them: file errors name only the sandbox path;
// anything else is described by kind, since its detail may name host paths.
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
        default:
            return "the sandbox is unavailable";
    }
}

bool is_callers_stop(const error& failure) {
    return failure.code == errc::cancelled || failure.code == errc::deadline_exceeded;
}

// A path as the model gave it, made absolute (relative to /workspace) and lexically normal.
std::string sandbox_path(std::string_view given) {
    std::filesystem::path path(given);
    if (path.is_relative()) path = std::filesystem::path(workspace) / path;
    auto normal = path.lexically_normal().string();
    if (normal.size() > 1 && normal.back() == '/') normal.pop_back();
    return normal;
}

// The stderr of a failed cell without its last traceback (the result carries that separately).
std::string_view before_traceback(std::string_view err) {
    auto at = err.rfind("Traceback (most recent call last):");
    if (at == std::string_view::npos) at = err.rfind("  File \"/workspace/.cells/");
    if (at == std::string_view::npos) return err;
    return err.substr(0, at);
}

}  // namespace

struct tool_session::state {
    state(session_manager& s, std::string k, tool_options o, asio::any_io_executor executor)
        : sessions(s),
          key(std::move(k)),
          options(std::move(o)),
          kernel(options.python, capture_limits),
          calls(std::move(executor)) {}

    session_manager& sessions;
    std::string key;
    tool_options options;
    python_kernel kernel;
    operation_queue calls;
    int failures = 0;
    bool uses_turns = false;
    bool ended = false;
    bool interpreter_lost = false;  // a cancelled cell took the interpreter with it
    std::string sandbox_id;         // the sandbox the last call used

    shaped_text shape(const captured_output& output) const {
        return shape_for_model(output, options.shaping);
    }

    // Counts a finished call for the retry ceiling and adds its notice.
    tool_result finish(tool_result r) {
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

    static tool_result failed(std::string tool, tool_status status, std::string message,
                              std::string hint) {
        tool_result r;
        r.tool = std::move(tool);
        r.status = status;
        r.message = std::move(message);
        r.hint = std::move(hint);
        return r;
    }

    static tool_result unavailable(std::string tool, const error& failure) {
        return failed(std::move(tool), tool_status::unavailable, model_message(failure),
                      "call the tool again: a new sandbox will be created (files and variables "
                      "from earlier calls will be gone); if it keeps failing, tell the user the "
                      "code tool is unavailable");
    }

    // A step that failed: the caller's own cancellation or deadline stays an error; anything
    // else is an unavailable result for the model.
    static result<tool_result> failed_step(const char* tool, error failure) {
        if (is_callers_stop(failure)) return failure;
        return unavailable(tool, failure);
    }

    // Takes this call's turn in the session's queue.
    asio::awaitable<std::optional<error>> take_turn(deadline limit) {
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

    struct leased {
        session_lease lease;
        bool rebuilt = false;
    };

    asio::awaitable<result<leased>> lease(deadline limit) {
        if (ended) co_return make_error(errc::shutting_down, "the session has ended");
        auto got = co_await sessions.async_acquire(key, limit);
        if (!got) co_return std::move(got).error();
        leased l;
        l.rebuilt = got->rebuilt || (!sandbox_id.empty() && sandbox_id != got->box->id());
        sandbox_id = got->box->id();
        l.lease = std::move(*got);
        co_return l;
    }

    asio::awaitable<std::vector<artifact>> list_artifacts(sandbox& box, deadline limit) {
        std::vector<artifact> found;
        std::vector<std::pair<std::string, int>> dirs{{"", 0}};
        while (!dirs.empty() && found.size() < max_artifacts) {
            auto [relative, depth] = dirs.back();
            dirs.pop_back();
            std::string dir(artifacts_dir);
            if (!relative.empty()) dir += "/" + relative;
            auto entries = co_await box.async_list_dir(dir, limit);
            if (!entries) continue;
            for (const auto& entry : *entries) {
                std::string path = relative.empty() ? entry.name : relative + "/" + entry.name;
                if (entry.type == file_type::directory) {
                    if (depth + 1 < max_artifact_depth)
                        dirs.emplace_back(std::move(path), depth + 1);
                } else if (entry.type == file_type::regular && found.size() < max_artifacts) {
                    artifact a;
                    a.media_type = media_type_for(entry.name);
                    a.path = std::move(path);
                    a.size = entry.size;
                    found.push_back(std::move(a));
                }
            }
        }
        std::sort(found.begin(), found.end(),
                  [](const artifact& a, const artifact& b) { return a.path < b.path; });
        co_return found;
    }

    asio::awaitable<result<tool_result>> run_python(std::string code,
                                                    std::chrono::milliseconds timeout,
                                                    deadline limit) {
        auto got = co_await lease(limit);
        if (!got) co_return failed_step("run_python", std::move(got).error());
        auto box = got->lease.box;
        auto ran = co_await kernel.async_run(box, std::move(code), timeout, limit);
        if (!ran) {
            // The interpreter was killed with the call: say so when the next cell starts one.
            interpreter_lost = true;
            co_return failed_step("run_python", std::move(ran).error());
        }
        tool_result r;
        r.tool = "run_python";
        r.duration = ran->duration;
        const auto& outcome = *ran;
        if (got->rebuilt) {
            r.notices.emplace_back(notice_rebuilt);
        } else if (outcome.started_interpreter && interpreter_lost) {
            r.notices.emplace_back(notice_restarted);
        }
        interpreter_lost = false;
        r.stdout_text = shape(outcome.out).text;
        switch (outcome.how) {
            case cell_outcome::ending::completed:
                if (!outcome.raised) {
                    r.status = tool_status::ok;
                    r.exit_code = 0;
                    r.stderr_text = shape(outcome.err).text;
                    if (outcome.out.total_bytes == 0 && outcome.err.total_bytes == 0) {
                        r.notices.emplace_back(
                            "ran successfully but printed nothing; use print() to see values");
                    }
                    break;
                }
                r.status = tool_status::error;
                r.exit_code = 1;
                {
                    const std::string err_text = outcome.err.text();
                    r.error_type = outcome.exception_type.empty() ? python_error_type(err_text)
                                                                  : outcome.exception_type;
                    r.traceback = python_traceback(err_text);
                    if (!outcome.err.is_truncated() && !r.traceback.empty()) {
                        r.stderr_text =
                            shape_for_model(before_traceback(err_text), options.shaping).text;
                    } else {
                        r.stderr_text = shape(outcome.err).text;
                    }
                }
                r.hint = hint_for_python_error(r.error_type);
                break;
            case cell_outcome::ending::timed_out:
                r.status = tool_status::timeout;
                r.exit_code = 124;
                r.stderr_text = shape(outcome.err).text;
                r.message =
                    "the code ran past its " + seconds_text(timeout) + " limit and was stopped";
                r.hint =
                    "make it faster, work on less data, or pass a larger timeout_seconds "
                    "(at most " +
                    std::to_string(options.max_timeout.count()) +
                    "); re-run the code that defined the variables you need";
                r.notices.emplace_back(notice_restarted);
                break;
            case cell_outcome::ending::crashed:
                r.status = tool_status::error;
                r.exit_code = outcome.exit_code;
                r.stderr_text = shape(outcome.err).text;
                if (outcome.oom_killed) {
                    r.message = "the interpreter was killed: the sandbox ran out of memory";
                    r.hint = "use less memory: process the data in parts";
                } else if (outcome.signal != 0) {
                    r.message = std::string("the interpreter crashed (") +
                                signal_name(outcome.signal) + ")";
                    r.hint =
                        "avoid the call that crashed it; re-run the code that defined the "
                        "variables you need";
                } else {
                    r.message = "the interpreter exited with code " +
                                std::to_string(outcome.exit_code) +
                                " (os._exit or a fatal error) instead of finishing the cell";
                    r.hint =
                        "do not exit the interpreter; re-run the code that defined the "
                        "variables you need";
                }
                r.notices.emplace_back(notice_restarted);
                break;
        }
        r.artifacts = co_await list_artifacts(*box, limit);
        co_return r;
    }

    asio::awaitable<result<tool_result>> run_shell(std::string command,
                                                   std::chrono::milliseconds timeout,
                                                   deadline limit) {
        auto got = co_await lease(limit);
        if (!got) co_return failed_step("run_shell", std::move(got).error());
        auto box = got->lease.box;
        exec_request request;
        request.shell = std::move(command);
        request.wall_limit = timeout;
        request.output = capture_limits;
        auto ran = co_await box->async_exec(std::move(request), limit);
        if (!ran) co_return failed_step("run_shell", std::move(ran).error());
        tool_result r;
        r.tool = "run_shell";
        r.duration = std::chrono::duration_cast<std::chrono::milliseconds>(ran->duration);
        if (got->rebuilt) r.notices.emplace_back(notice_rebuilt);
        r.stdout_text = shape(ran->out).text;
        r.stderr_text = shape(ran->err).text;
        if (ran->timed_out) {
            r.status = tool_status::timeout;
            r.exit_code = 124;
            r.message =
                "the command ran past its " + seconds_text(timeout) + " limit and was killed";
            r.hint =
                "make it faster, work on less data, or pass a larger timeout_seconds (at most " +
                std::to_string(options.max_timeout.count()) + ")";
        } else if (ran->signal != 0) {
            r.status = tool_status::error;
            r.exit_code = 128 + ran->signal;
            if (ran->oom_killed) {
                r.message = "the command was killed: the sandbox ran out of memory";
                r.hint = "use less memory: process the data in parts";
            } else {
                r.message = std::string("the command was killed by ") + signal_name(ran->signal);
                r.hint = "read stderr for the cause";
            }
        } else if (ran->exit_code != 0) {
            r.status = tool_status::error;
            r.exit_code = ran->exit_code;
            r.error_type = python_error_type(ran->err.text());
            if (ran->exit_code == 127) {
                r.hint =
                    "command not found: it is not installed in the sandbox, and the "
                    "network is off";
            } else if (!r.error_type.empty()) {
                r.hint = hint_for_python_error(r.error_type);
            } else {
                r.hint = "the command exited with code " + std::to_string(ran->exit_code) +
                         ": read stderr";
            }
        } else {
            r.status = tool_status::ok;
            r.exit_code = 0;
            if (ran->out.total_bytes == 0 && ran->err.total_bytes == 0)
                r.notices.emplace_back("the command ran successfully but printed nothing");
        }
        r.artifacts = co_await list_artifacts(*box, limit);
        co_return r;
    }

    asio::awaitable<result<tool_result>> write_file(std::string given, std::string content,
                                                    deadline limit) {
        const std::string path = sandbox_path(given);
        auto got = co_await lease(limit);
        if (!got) co_return failed_step("write_file", std::move(got).error());
        auto box = got->lease.box;
        const std::uint64_t size = content.size();
        std::vector<file_write> files(1);
        files[0].path = path;
        files[0].content = std::move(content);
        auto written = co_await box->async_write_files(files, limit);
        if (written && !written->front().outcome &&
            written->front().outcome.error().code == errc::file_not_found) {
            // The parent directory is missing: create it (as the sandbox's user) and retry.
            exec_request mkdir;
            mkdir.argv = {"mkdir", "-p", "--", std::filesystem::path(path).parent_path().string()};
            mkdir.wall_limit = std::chrono::seconds(10);
            auto made = co_await box->async_exec(std::move(mkdir), limit);
            if (!made && is_callers_stop(made.error())) co_return std::move(made).error();
            written = co_await box->async_write_files(std::move(files), limit);
        }
        if (!written) co_return failed_step("write_file", std::move(written).error());
        tool_result r;
        r.tool = "write_file";
        r.path = path;
        if (got->rebuilt) r.notices.emplace_back(notice_rebuilt);
        const auto& outcome = written->front().outcome;
        if (!outcome) {
            r.status = tool_status::error;
            r.message = model_message(outcome.error());
            r.hint = "write under /workspace (the sandbox's root is read-only)";
            co_return r;
        }
        r.bytes = size;
        co_return r;
    }

    asio::awaitable<result<tool_result>> read_file(std::string given, deadline limit) {
        const std::string path = sandbox_path(given);
        auto got = co_await lease(limit);
        if (!got) co_return failed_step("read_file", std::move(got).error());
        std::vector<std::string> paths{path};
        auto read = co_await got->lease.box->async_read_files(std::move(paths), limit);
        if (!read) co_return failed_step("read_file", std::move(read).error());
        tool_result r;
        r.tool = "read_file";
        r.path = path;
        if (got->rebuilt) r.notices.emplace_back(notice_rebuilt);
        const auto& content = read->front().content;
        if (!content && (content.error().code == errc::sandbox_unavailable ||
                         content.error().code == errc::backend_failure)) {
            co_return unavailable("read_file", content.error());
        }
        if (!content) {
            r.status = tool_status::error;
            r.message = model_message(content.error());
            r.hint = content.error().code == errc::file_not_found
                         ? "check the path with list_files (relative paths start at /workspace)"
                         : "read a regular file under /workspace";
            co_return r;
        }
        r.bytes = content->size();
        r.content = shape_for_model(*content, options.shaping).text;
        co_return r;
    }

    asio::awaitable<result<tool_result>> list_files(std::string given, deadline limit) {
        const std::string path = sandbox_path(given.empty() ? std::string(workspace) : given);
        auto got = co_await lease(limit);
        if (!got) co_return failed_step("list_files", std::move(got).error());
        auto listed = co_await got->lease.box->async_list_dir(path, limit);
        tool_result r;
        r.tool = "list_files";
        r.path = path;
        if (got->rebuilt) r.notices.emplace_back(notice_rebuilt);
        if (!listed) {
            if (is_callers_stop(listed.error())) co_return std::move(listed).error();
            const auto code = listed.error().code;
            if (code == errc::sandbox_unavailable || code == errc::backend_failure ||
                code == errc::protocol_error) {
                co_return unavailable("list_files", listed.error());
            }
            r.status = tool_status::error;
            r.message = model_message(listed.error());
            r.hint = "list /workspace to see what exists";
            co_return r;
        }
        r.entries = std::move(*listed);
        std::sort(r.entries.begin(), r.entries.end(),
                  [](const dir_entry& a, const dir_entry& b) { return a.name < b.name; });
        co_return r;
    }
};

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
    return s->finish(tool_session::state::failed(
        std::move(tool), tool_status::error, std::move(message),
        "call one of run_python, run_shell, write_file, read_file, list_files with the arguments "
        "its schema names"));
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
    return std::nullopt;
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

void tool_session::begin_turn() {
    state_->uses_turns = true;
    state_->failures = 0;
}

asio::awaitable<result<tool_result>> tool_session::async_run_python(
    std::string code, std::optional<std::chrono::milliseconds> timeout, deadline limit) {
    auto s = state_;
    const auto wall = timeout.value_or(s->options.default_timeout);
    if (auto refused = check_run_arguments(s, "run_python", wall, "code", code)) {
        co_return std::move(*refused);
    }
    tool_operation operation = [s, code = std::move(code), wall, limit]() mutable {
        return s->run_python(std::move(code), wall, limit);
    };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

asio::awaitable<result<tool_result>> tool_session::async_run_shell(
    std::string command, std::optional<std::chrono::milliseconds> timeout, deadline limit) {
    auto s = state_;
    const auto wall = timeout.value_or(s->options.default_timeout);
    if (auto refused = check_run_arguments(s, "run_shell", wall, "command", command)) {
        co_return std::move(*refused);
    }
    tool_operation operation = [s, command = std::move(command), wall, limit]() mutable {
        return s->run_shell(std::move(command), wall, limit);
    };
    co_return co_await call_in_turn(s, std::move(operation), limit);
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
    auto s = state_;
    if (path.empty()) co_return invalid_arguments(s, "read_file", "path: is empty");
    tool_operation operation = [s, path = std::move(path), limit]() mutable {
        return s->read_file(std::move(path), limit);
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

asio::awaitable<result<tool_result>> tool_session::async_call(std::string_view tool,
                                                              std::string_view arguments_json,
                                                              deadline limit) {
    auto s = state_;
    const double max_seconds = static_cast<double>(s->options.max_timeout.count());
    auto parsed = parse_tool_arguments(tool, arguments_json, max_seconds);
    if (!parsed) co_return invalid_arguments(s, std::string(tool), parsed.error().detail);
    auto& args = *parsed;
    std::optional<std::chrono::milliseconds> timeout;
    if (args.timeout_seconds) {
        timeout = std::chrono::milliseconds(
            static_cast<std::int64_t>(*args.timeout_seconds * 1000.0 + 0.5));
        if (timeout->count() <= 0) timeout = std::chrono::milliseconds(1);
    }
    if (tool == "run_python")
        co_return co_await async_run_python(std::move(args.code), timeout, limit);
    if (tool == "run_shell")
        co_return co_await async_run_shell(std::move(args.command), timeout, limit);
    if (tool == "write_file")
        co_return co_await async_write_file(std::move(args.path), std::move(args.content), limit);
    if (tool == "read_file") co_return co_await async_read_file(std::move(args.path), limit);
    std::string path = args.path.empty() ? std::string(workspace) : std::move(args.path);
    co_return co_await async_list_files(std::move(path), limit);
}

asio::awaitable<result<std::vector<artifact>>> tool_session::async_list_artifacts(deadline limit) {
    auto s = state_;
    auto got = co_await s->lease(limit);
    if (!got) co_return std::move(got).error();
    auto box = got->lease.box;
    co_return co_await s->list_artifacts(*box, limit);
}

asio::awaitable<result<std::string>> tool_session::async_read_artifact(std::string path,
                                                                       deadline limit) {
    auto s = state_;
    const std::string full = sandbox_path(std::string(artifacts_dir) + "/" + path);
    if (full.rfind(std::string(artifacts_dir) + "/", 0) != 0) {
        co_return make_error(errc::invalid_path, path + ": not under /workspace/out");
    }
    auto got = co_await s->lease(limit);
    if (!got) co_return std::move(got).error();
    std::vector<std::string> paths{full};
    auto read = co_await got->lease.box->async_read_files(std::move(paths), limit);
    if (!read) co_return std::move(read).error();
    co_return std::move(read->front().content);
}

asio::awaitable<result<void>> tool_session::async_end() {
    auto s = state_;
    if (s->ended) co_return result<void>{};
    const auto never = deadline::never();
    if (auto refused = co_await s->take_turn(never)) co_return std::move(*refused);
    s->ended = true;
    co_await s->kernel.async_stop();
    s->calls.release();
    s->calls.refuse_all();
    auto ended = co_await s->sessions.async_end(s->key);
    // No session: no call ever needed a sandbox (or the manager already ended it).
    if (!ended && ended.error().code == errc::sandbox_not_found) co_return result<void>{};
    co_return ended;
}

}  // namespace moat
