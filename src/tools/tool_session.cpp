#include <moat/log.hpp>
#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include <moat/task_group.hpp>

#include "core/async_event.hpp"
#include "core/base64.hpp"
#include "core/exception_boundary.hpp"
#include "core/output_capture.hpp"
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

constexpr std::size_t max_artifacts = 100;
constexpr int max_artifact_depth = 4;
// Model code decides the shape of the artifacts directory, so a walk is bounded in work, not only
// in what it returns: at most this many directory listings and entries looked at (each listing
// returns at most file_limits::max_dir_entries; a larger directory is skipped).
constexpr std::size_t max_artifact_listings = 64;
constexpr std::size_t max_artifact_visits = 2000;

// A command longer than this goes to the shell on its stdin rather than in its argv, which the
// exec wire format bounds.
constexpr std::size_t max_inline_command = 16 * 1024;

// What the interpreter keeps of each stream before shaping: more than a model sees, so the shaper
// can count what it omits, yet bounded.
constexpr output_limits capture_limits{256 * 1024, 256 * 1024};

const char* notice_rebuilt =
    "the environment was rebuilt: files and variables from earlier calls are gone";
const char* notice_restarted = "the interpreter restarted: variables and imports are gone";
const char* notice_strays_killed =
    "processes the command left running in the background were stopped when it ended: a "
    "command's processes end with it";

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

// `list_files` is how the model sees that tool (with the session's prefix).
std::string hint_for_python_error(const std::string& type, const std::string& list_files,
                                  const std::string& workdir, bool network_off) {
    if (type == "NameError")
        return "a name is not defined: define it first (if an earlier call defined it, the "
               "interpreter has restarted since, so run that code again)";
    if (type == "ModuleNotFoundError" || type == "ImportError") {
        if (network_off) {
            return "the module is not installed and the network is off: use the standard library "
                   "or what is installed";
        }
        return "the module is not installed: install it with pip (only the hosts the tool "
               "description names are reachable) or use the standard library";
    }
    if (type == "KeyError")
        return "the key does not exist: print the available keys first (list(d), df.columns)";
    if (type == "FileNotFoundError")
        return "the file does not exist: check with " + list_files + " (the working directory is " +
               workdir + ")";
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
        case errc::store_unavailable:
            return "the session store is unavailable right now; try again shortly";
        default:
            return "the sandbox is unavailable";
    }
}

// A client's temporary file or a hidden one: not an artifact.
bool is_hidden_artifact(std::string_view name) {
    return name.empty() || name.front() == '.' || name.ends_with(".tmp");
}

// A file error as a code a program can branch on ("" when it is not a per-path file error).
std::string file_error_code(const error& failure) {
    if (failure.code.category() != error_category()) return "";
    switch (static_cast<errc>(failure.code.value())) {
        case errc::file_not_found:
            return "file_not_found";
        case errc::is_directory:
            return "is_directory";
        case errc::permission_denied:
            return "permission_denied";
        case errc::invalid_path:
            return "invalid_path";
        case errc::too_large:
            return "too_large";
        default:
            return "";
    }
}

bool is_callers_stop(const error& failure) {
    return failure.code == errc::cancelled || failure.code == errc::deadline_exceeded;
}

// A path as the model gave it, made absolute (relative to the working directory) and lexically
// normal.
std::string sandbox_path(std::string_view given, const std::string& workdir) {
    std::filesystem::path path(given);
    if (path.is_relative()) path = std::filesystem::path(workdir) / path;
    auto normal = path.lexically_normal().string();
    if (normal.size() > 1 && normal.back() == '/') normal.pop_back();
    return normal;
}

// `path` (normal, absolute) is `dir` or lies under it.
bool is_under(std::string_view path, std::string_view dir) {
    if (dir == "/") return true;
    return path == dir ||
           (path.starts_with(dir) && path.size() > dir.size() && path[dir.size()] == '/');
}

// The stderr of a failed cell without its last traceback (the result carries that separately).
std::string_view before_traceback(std::string_view err, const std::string& workdir) {
    auto at = err.rfind("Traceback (most recent call last):");
    if (at == std::string_view::npos) at = err.rfind("  File \"" + workdir + "/.cells/");
    if (at == std::string_view::npos) return err;
    return err.substr(0, at);
}

// A background process (start_process), shared by the session and the pump that reads it.
struct background_entry {
    explicit background_entry(asio::any_io_executor executor) : ended(std::move(executor)) {}
    background_process info;
    process handle;
    std::size_t cap = 0;
    std::string out;  // the latest bytes: at most 2 * cap, of which the last cap are shown
    std::string err;
    async_event ended;
};

// Keeps the latest `cap` bytes of a stream in `kept`, trimming in amortized O(1) per byte.
void keep_latest(std::string& kept, std::string_view data, std::size_t cap) {
    if (data.size() >= cap) {
        kept.assign(data.substr(data.size() - cap));
        return;
    }
    kept.append(data);
    if (kept.size() > 2 * cap) kept.erase(0, kept.size() - cap);
}

// What a model sees of a kept stream: its last `cap` bytes, and how much came before them.
captured_output latest_output(const std::string& kept, std::size_t cap, std::uint64_t total) {
    captured_output c;
    const std::string_view shown =
        std::string_view(kept).substr(kept.size() - std::min(cap, kept.size()));
    c.total_bytes = total;
    if (shown.size() == total) {
        c.head = std::string(shown);
    } else {
        c.tail = std::string(shown);
        c.omitted_bytes = total - shown.size();
    }
    return c;
}

// Reads a background process to its end, so it never blocks on a full pipe. Cancellation (the
// session's end) kills it: the stream does that when its read is cancelled.
asio::awaitable<void> pump_background(std::shared_ptr<background_entry> entry) {
    for (;;) {
        auto next = co_await entry->handle.async_next();
        if (!next) break;  // the sandbox went away, or the session ended: it is gone
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            if (chunk->channel == output_channel::out) {
                entry->info.stdout_bytes += chunk->data.size();
                keep_latest(entry->out, chunk->data, entry->cap);
            } else {
                entry->info.stderr_bytes += chunk->data.size();
                keep_latest(entry->err, chunk->data, entry->cap);
            }
            continue;
        }
        const auto& ended = std::get<exec_result>(*next);
        entry->info.exit_code = ended.signal != 0 ? 128 + ended.signal : ended.exit_code;
        break;
    }
    entry->info.is_running = false;
    entry->ended.set();
}

// How long stop_process waits after SIGTERM, then after SIGKILL.
constexpr auto stop_grace = std::chrono::seconds(3);
constexpr std::size_t max_shown_command = 200;

}  // namespace

struct tool_session::state {
    state(session_manager& s, std::string k, tool_options o, asio::any_io_executor executor)
        : sessions(s),
          layout(s.layout()),
          network(s.network()),
          key(std::move(k)),
          options(std::move(o)),
          kernel(options.python, capture_limits),
          pumps(executor, "background processes"),
          calls(std::move(executor)) {}

    session_manager& sessions;
    const sandbox_layout& layout;    // the manager's: where the working and artifacts dirs are
    const sandbox_network& network;  // the manager's: what the tools may reach
    std::string key;
    tool_options options;
    python_kernel kernel;
    task_group pumps;  // one per background process, until it ends
    std::vector<std::shared_ptr<background_entry>> background;
    int next_process_id = 1;
    operation_queue calls;
    int failures = 0;
    bool uses_turns = false;
    std::optional<sandbox_info> box_info;  // the sandbox the last call used
    bool ended = false;
    // The generation of the sandbox's interpreter (python_kernel) this session last saw or
    // announced: a later one was started by a restart the model has not been told about, whoever
    // restarted it (another worker sharing the sandbox, a cancelled cell). 0: none yet.
    std::uint64_t generation = 0;
    std::string sandbox_id;  // the sandbox the last call used

    shaped_text shape(const captured_output& output) const {
        return shape_for_model(output, options.shaping);
    }

    // A tool's name as the model sees it.
    std::string named(std::string_view tool) const {
        return options.tool_prefix + std::string(tool);
    }

    // Counts a finished run_python / run_shell call for the retry ceiling and adds its notice.
    // Other tools never count: a framework's own probes (a `read_file` of a missing file) are not
    // the model's code failing.
    tool_result finish(tool_result r) {
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

    static tool_result failed(std::string tool, tool_status status, std::string message,
                              std::string hint) {
        tool_result r;
        r.tool = std::move(tool);
        r.status = status;
        r.message = std::move(message);
        r.hint = std::move(hint);
        return r;
    }

    static tool_result bad_arguments(std::string tool, std::string message, std::string hint) {
        auto r = failed(std::move(tool), tool_status::error, std::move(message), std::move(hint));
        r.argument_error = true;
        r.error_code = "invalid_arguments";
        return r;
    }

    static tool_result unavailable(std::string tool, const error& failure) {
        // The model reads only the kind; the operator's log keeps what went wrong.
        detail::log(log_level::warning, "tools", tool + ": " + failure.to_string());
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

    bool network_off() const noexcept { return network.mode == network_mode::none; }

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
        // The manager's word, which reaches exactly one call per rebuild across every worker that
        // shares the store (an idle-ended session that comes back counts: its marker).
        bool rebuilt = false;
        // This call has another sandbox than this object's last call had (a rebuild, or one that
        // another worker announced): the interpreter numbering starts again.
        bool moved = false;
    };

    asio::awaitable<result<leased>> lease(deadline limit) {
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

    struct artifact_listing {
        std::vector<artifact> found;
        bool truncated = false;  // a bound stopped the walk before it saw everything
    };

    // Walks the artifacts directory depth-first, bounded in listings and in entries visited (see
    // above).
    asio::awaitable<artifact_listing> list_artifacts(sandbox& box, deadline limit) {
        artifact_listing listing;
        auto& found = listing.found;
        std::vector<std::pair<std::string, int>> dirs{{"", 0}};
        std::size_t listings = 0;
        std::size_t visits = 0;
        while (!dirs.empty()) {
            if (listings == max_artifact_listings || visits >= max_artifact_visits ||
                found.size() >= max_artifacts) {
                listing.truncated = true;
                break;
            }
            auto [relative, depth] = dirs.back();
            dirs.pop_back();
            std::string dir(layout.artifacts_dir);
            if (!relative.empty()) dir += "/" + relative;
            ++listings;
            auto entries = co_await box.async_list_dir(dir, limit);
            if (!entries) {
                if (entries.error().code == errc::too_large) listing.truncated = true;
                continue;
            }
            for (const auto& entry : *entries) {
                if (visits == max_artifact_visits || found.size() == max_artifacts) {
                    listing.truncated = true;
                    break;
                }
                ++visits;
                if (is_hidden_artifact(entry.name)) continue;
                std::string path = relative.empty() ? entry.name : relative + "/" + entry.name;
                if (entry.type == file_type::directory) {
                    if (depth + 1 < max_artifact_depth)
                        dirs.emplace_back(std::move(path), depth + 1);
                } else if (entry.type == file_type::regular) {
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
        co_return listing;
    }

    // Any file's exact bytes (the application's reads: artifacts, workspace files).
    asio::awaitable<result<std::string>> read_exact(std::string full, deadline limit) {
        auto got = co_await lease(limit);
        if (!got) co_return std::move(got).error();
        std::vector<std::string> paths{std::move(full)};
        auto read = co_await got->lease.box->async_read_files(std::move(paths), limit);
        if (!read) co_return std::move(read).error();
        co_return std::move(read->front().content);
    }

    asio::awaitable<void> add_artifacts(tool_result& r, sandbox& box, deadline limit) {
        auto listing = co_await list_artifacts(box, limit);
        r.artifacts = std::move(listing.found);
        r.artifacts_truncated = listing.truncated;
    }

    asio::awaitable<result<tool_result>> run_python(std::string code,
                                                    std::chrono::milliseconds timeout,
                                                    deadline limit, output_callback on_output) {
        auto got = co_await lease(limit);
        if (!got) co_return failed_step("run_python", std::move(got).error());
        auto box = got->lease.box;
        if (got->moved) generation = 0;  // a new sandbox: its interpreters count from 1
        auto ran =
            co_await kernel.async_run(box, std::move(code), timeout, limit, std::move(on_output));
        // A stopped call may have taken the interpreter with it: the next cell sees a later
        // generation then, and says so.
        if (!ran) co_return failed_step("run_python", std::move(ran).error());
        tool_result r;
        r.tool = "run_python";
        r.duration = ran->duration;
        const auto& outcome = *ran;
        if (outcome.how == cell_outcome::ending::busy) {
            r.status = tool_status::error;
            r.error_code = "busy";
            r.message =
                "another call is running Python in this conversation's sandbox and did "
                "not finish within " +
                seconds_text(
                    std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(30))) +
                "; this code did not run";
            r.hint = "call " + named("run_python") + " again";
            if (got->rebuilt) r.notices.emplace_back(notice_rebuilt);
            co_return r;
        }
        const bool restarted_unseen = generation != 0 && outcome.generation > generation;
        if (got->rebuilt) {
            r.notices.emplace_back(notice_rebuilt);
        } else if (restarted_unseen && outcome.how == cell_outcome::ending::completed) {
            r.notices.emplace_back(notice_restarted);
        }
        generation = outcome.generation;
        // A result that says the interpreter restarted announces its successor too.
        if (outcome.how != cell_outcome::ending::completed) generation = outcome.generation + 1;
        auto shaped_out = shape(outcome.out);
        r.stdout_text = std::move(shaped_out.text);
        r.stdout_omitted = shaped_out.omitted_chars;
        switch (outcome.how) {
            case cell_outcome::ending::completed:
                if (!outcome.raised) {
                    r.status = tool_status::ok;
                    r.exit_code = 0;
                    set_stderr(r, shape(outcome.err));
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
                        set_stderr(r, shape_for_model(before_traceback(err_text, layout.workdir),
                                                      options.shaping));
                    } else {
                        set_stderr(r, shape(outcome.err));
                    }
                }
                r.hint = hint_for_python_error(r.error_type, named("list_files"), layout.workdir,
                                               network_off());
                break;
            case cell_outcome::ending::timed_out:
                r.status = tool_status::timeout;
                r.exit_code = 124;
                set_stderr(r, shape(outcome.err));
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
                set_stderr(r, shape(outcome.err));
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
            case cell_outcome::ending::busy:
                break;  // answered above
        }
        co_await add_artifacts(r, *box, limit);
        co_return r;
    }

    static void set_stderr(tool_result& r, shaped_text shaped) {
        r.stderr_text = std::move(shaped.text);
        r.stderr_omitted = shaped.omitted_chars;
    }

    asio::awaitable<result<tool_result>> run_shell(std::string command,
                                                   std::chrono::milliseconds timeout,
                                                   deadline limit, output_callback on_output) {
        auto got = co_await lease(limit);
        if (!got) co_return failed_step("run_shell", std::move(got).error());
        auto box = got->lease.box;
        exec_request request;
        if (command.size() > max_inline_command) {
            // Past the wire format's bound: the shell reads the command from its stdin (then at
            // its end, as an inline command's stdin is) and runs it as sh -c would.
            request.argv = {"/bin/sh", "-c", "eval \"$(cat)\""};
            request.stdin_data = std::move(command);
        } else {
            request.shell = std::move(command);
        }
        request.wall_limit = timeout;
        request.output = capture_limits;
        auto ran = co_await exec_shell(*box, std::move(request), limit, std::move(on_output));
        if (!ran) co_return failed_step("run_shell", std::move(ran).error());
        tool_result r;
        r.tool = "run_shell";
        r.duration = std::chrono::duration_cast<std::chrono::milliseconds>(ran->duration);
        if (got->rebuilt) r.notices.emplace_back(notice_rebuilt);
        auto shaped_out = shape(ran->out);
        r.stdout_text = std::move(shaped_out.text);
        r.stdout_omitted = shaped_out.omitted_chars;
        set_stderr(r, shape(ran->err));
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
                r.hint = network_off() ? "command not found: it is not installed in the sandbox, "
                                         "and the network is off"
                                       : "command not found: it is not installed in the sandbox";
            } else if (!r.error_type.empty()) {
                r.hint = hint_for_python_error(r.error_type, named("list_files"), layout.workdir,
                                               network_off());
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
        if (ran->strays_killed) r.notices.emplace_back(notice_strays_killed);
        co_await add_artifacts(r, *box, limit);
        co_return r;
    }

    // Runs a command to its end; with `on_output`, as a stream whose chunks go to it as they
    // arrive while the same head + tail capture as async_exec's is kept for the result.
    static asio::awaitable<result<exec_result>> exec_shell(sandbox& box, exec_request request,
                                                           deadline limit,
                                                           output_callback on_output) {
        if (!on_output) co_return co_await box.async_exec(std::move(request), limit);
        const output_limits limits = request.output;
        auto stream = co_await box.async_exec_stream(std::move(request), limit);
        if (!stream) co_return std::move(stream).error();
        output_capture out(limits);
        output_capture err(limits);
        for (;;) {
            auto next = co_await stream->async_next();
            if (!next) co_return std::move(next).error();
            if (auto* chunk = std::get_if<output_chunk>(&*next)) {
                auto& capture = chunk->channel == output_channel::out ? out : err;
                capture.append(chunk->data);
                on_output(chunk->channel, chunk->data);
                continue;
            }
            auto ended = std::get<exec_result>(std::move(*next));
            ended.out = out.finish();
            ended.err = err.finish();
            co_return ended;
        }
    }

    asio::awaitable<result<tool_result>> write_file(std::string given, std::string content,
                                                    deadline limit) {
        const std::string path = sandbox_path(given, layout.workdir);
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
            r.error_code = file_error_code(outcome.error());
            r.hint = "write under " + layout.workdir + " (the sandbox's root is read-only)";
            co_return r;
        }
        r.bytes = size;
        co_return r;
    }

    asio::awaitable<result<tool_result>> read_file(std::string given, file_encoding encoding,
                                                   deadline limit) {
        const std::string path = sandbox_path(given, layout.workdir);
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
            r.error_code = file_error_code(content.error());
            if (content.error().code == errc::file_not_found) {
                r.hint = "check the path with " + named("list_files") +
                         " (relative paths start at " + layout.workdir + ")";
            } else {
                r.hint = "read a regular file under " + layout.workdir;
            }
            co_return r;
        }
        r.bytes = content->size();
        r.encoding = encoding;
        if (encoding == file_encoding::base64) {
            r.content = base64_encode(*content);
        } else {
            auto shaped = shape_for_model(*content, options.shaping);
            r.content = std::move(shaped.text);
            r.content_omitted = shaped.omitted_chars;
        }
        co_return r;
    }

    asio::awaitable<result<tool_result>> list_files(std::string given, deadline limit) {
        const std::string path =
            sandbox_path(given.empty() ? layout.workdir : given, layout.workdir);
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
            r.error_code = file_error_code(listed.error());
            r.hint = "list " + layout.workdir + " to see what exists";
            co_return r;
        }
        r.entries = std::move(*listed);
        std::sort(r.entries.begin(), r.entries.end(),
                  [](const dir_entry& a, const dir_entry& b) { return a.name < b.name; });
        co_return r;
    }

    std::size_t running_processes() const {
        return static_cast<std::size_t>(
            std::count_if(background.begin(), background.end(),
                          [](const auto& e) { return e->info.is_running; }));
    }

    std::shared_ptr<background_entry> find_process(int id) const {
        for (const auto& e : background)
            if (e->info.id == id) return e;
        return nullptr;
    }

    tool_result unknown_process(const char* tool, int id) const {
        return bad_arguments(tool,
                             "id: no background process " + std::to_string(id) + " in this session",
                             "call " + named("list_processes") + " to see the ids");
    }

    asio::awaitable<result<tool_result>> start_process(std::string command, std::string cwd,
                                                       deadline limit) {
        const auto most = static_cast<std::size_t>(std::max(0, options.max_background_processes));
        if (running_processes() >= most) {
            co_return failed("start_process", tool_status::error,
                             "at most " + std::to_string(most) +
                                 " background processes run at once in a session, and " +
                                 std::to_string(running_processes()) + " are running",
                             "stop one with " + named("stop_process") + " (" +
                                 named("list_processes") + " shows them)");
        }
        auto got = co_await lease(limit);
        if (!got) co_return failed_step("start_process", std::move(got).error());
        auto box = got->lease.box;
        exec_request request;
        request.argv = {"/bin/sh", "-c", command};
        request.cwd = sandbox_path(cwd.empty() ? layout.workdir : cwd, layout.workdir);
        request.wall_limit = exec_request::max_spawn_wall_limit;
        auto entry = std::make_shared<background_entry>(pumps.get_executor());
        entry->info.id = next_process_id;
        entry->info.command = command.substr(0, max_shown_command);
        entry->info.cwd = request.cwd;
        entry->cap = std::max<std::size_t>(1, options.background_output_bytes);
        auto spawned = co_await box->async_spawn(std::move(request), limit);
        if (!spawned) co_return failed_step("start_process", std::move(spawned).error());
        ++next_process_id;
        entry->handle = std::move(*spawned);
        pumps.spawn(pump_background(entry));
        // Bounded bookkeeping: the running ones plus the latest ended ones.
        while (background.size() >= 2 * most + 1) {
            const auto finished = std::find_if(background.begin(), background.end(),
                                               [](const auto& e) { return !e->info.is_running; });
            if (finished == background.end()) break;
            background.erase(finished);
        }
        background.push_back(entry);
        tool_result r;
        r.tool = "start_process";
        if (got->rebuilt) r.notices.emplace_back(notice_rebuilt);
        r.processes.push_back(entry->info);
        co_return r;
    }

    tool_result list_processes() const {
        tool_result r;
        r.tool = "list_processes";
        for (const auto& e : background) r.processes.push_back(e->info);
        return r;
    }

    tool_result read_process_output(int id) const {
        auto entry = find_process(id);
        if (!entry) return unknown_process("read_process_output", id);
        tool_result r;
        r.tool = "read_process_output";
        auto out = shape(latest_output(entry->out, entry->cap, entry->info.stdout_bytes));
        r.stdout_text = std::move(out.text);
        r.stdout_omitted = out.omitted_chars;
        set_stderr(r, shape(latest_output(entry->err, entry->cap, entry->info.stderr_bytes)));
        r.processes.push_back(entry->info);
        return r;
    }

    asio::awaitable<result<tool_result>> stop_process(int id) {
        auto entry = find_process(id);
        if (!entry) co_return unknown_process("stop_process", id);
        // Cleanup is not cancellable and bounded: SIGTERM, a grace, SIGKILL, a grace.
        for (const int signal : {SIGTERM, SIGKILL}) {
            if (!entry->info.is_running) break;
            (void)co_await entry->handle.async_signal(signal);
            const auto grace = deadline::after(stop_grace);
            (void)co_await entry->ended.async_wait(grace);
        }
        tool_result r;
        r.tool = "stop_process";
        if (entry->info.is_running) {
            r.status = tool_status::error;
            r.message = "the process did not end within " + seconds_text(2 * stop_grace);
            r.hint = "call " + named("list_processes") + " later to see if it has ended";
        }
        r.processes.push_back(entry->info);
        co_return r;
    }

    // The session's end: every background process is killed (its read is cancelled) and its
    // pump has finished.
    asio::awaitable<void> stop_background() {
        pumps.cancel_all();
        co_await pumps.async_wait_all();
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
    auto s = state_;
    const auto wall = timeout.value_or(s->options.default_timeout);
    if (auto refused = check_run_arguments(s, "run_python", wall, "code", code)) {
        co_return std::move(*refused);
    }
    tool_operation operation = [s, code = std::move(code), wall, limit,
                                on_output = std::move(on_output)]() mutable {
        return s->run_python(std::move(code), wall, limit, std::move(on_output));
    };
    co_return co_await call_in_turn(s, std::move(operation), limit);
}

asio::awaitable<result<tool_result>> tool_session::async_run_shell(
    std::string command, std::optional<std::chrono::milliseconds> timeout, deadline limit,
    output_callback on_output) {
    auto s = state_;
    const auto wall = timeout.value_or(s->options.default_timeout);
    if (auto refused = check_run_arguments(s, "run_shell", wall, "command", command)) {
        co_return std::move(*refused);
    }
    tool_operation operation = [s, command = std::move(command), wall, limit,
                                on_output = std::move(on_output)]() mutable {
        return s->run_shell(std::move(command), wall, limit, std::move(on_output));
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
