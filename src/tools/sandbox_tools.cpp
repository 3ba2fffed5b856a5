// The tools' own work in the sandbox: run_shell, write_file, read_file, list_files and the
// artifacts walk (run_python is in python_tool.cpp). Each turns what happened into a
// tool_result worded for the model: its status, what the program printed (shaped), and a message
// and hint for what went wrong; only the caller's own stop stays an error (tool_session_state.hpp).
#include "tools/tool_session_state.hpp"

#include "core/base64.hpp"
#include "core/output_capture.hpp"
#include "egress/network_policy.hpp"
#include "tools/tool_arguments.hpp"

#include <algorithm>
#include <csignal>
#include <filesystem>

namespace moat {

using tool_detail::capture_limits;
using tool_detail::hint_for_python_error;
using tool_detail::is_callers_stop;
using tool_detail::max_inline_command;
using tool_detail::model_message;
using tool_detail::notice_rebuilt;
using tool_detail::sandbox_path;
using tool_detail::seconds_text;
using tool_detail::signal_name;

namespace {

constexpr std::size_t max_artifacts = 100;
constexpr int max_artifact_depth = 4;
// Model code decides the shape of the artifacts directory, so a walk is bounded in work, not only
// in what it returns: at most this many directory listings and entries looked at (each listing
// returns at most file_limits::max_dir_entries; a larger directory is skipped).
constexpr std::size_t max_artifact_listings = 64;
constexpr std::size_t max_artifact_visits = 2000;

const char* notice_strays_killed =
    "processes the command left running in the background were stopped when it ended: a "
    "command's processes end with it";

}  // namespace

namespace tool_detail {

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
                                  const std::string& workdir, const sandbox_network& network) {
    if (type == "NameError")
        return "a name is not defined: define it first (if an earlier call defined it, the "
               "interpreter has restarted since, so run that code again)";
    if (type == "ModuleNotFoundError" || type == "ImportError") {
        if (network.mode == network_mode::none) {
            return "the module is not installed and the network is off: use the standard library "
                   "or what is installed";
        }
        if (!egress::reaches_pypi(network)) {
            return "the module is not installed, and PyPI is not on this sandbox's allow-list: pip "
                   "installs only from an index on the hosts the tool description names; else use "
                   "the standard library or what is installed";
        }
        return "the module is not installed: install it with pip (pip install PKG in a shell, "
               "%pip install PKG in a cell; it imports at once) or use the standard library";
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

}  // namespace tool_detail

namespace {

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

}  // namespace

asio::awaitable<tool_session::state::artifact_listing> tool_session::state::list_artifacts(
    sandbox& box, deadline limit) {
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
                if (depth + 1 < max_artifact_depth) dirs.emplace_back(std::move(path), depth + 1);
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

asio::awaitable<void> tool_session::state::add_artifacts(tool_result& r, sandbox& box,
                                                         deadline limit) {
    auto listing = co_await list_artifacts(box, limit);
    r.artifacts = std::move(listing.found);
    r.artifacts_truncated = listing.truncated;
}

asio::awaitable<result<tool_result>> tool_session::state::run_shell(
    std::string command, std::chrono::milliseconds timeout, deadline limit,
    output_callback on_output) {
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
        r.message = "the command ran past its " + seconds_text(timeout) + " limit and was killed";
        r.hint = "make it faster, work on less data, or pass a larger timeout_seconds (at most " +
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
            r.hint =
                hint_for_python_error(r.error_type, named("list_files"), layout.workdir, network);
        } else {
            r.hint =
                "the command exited with code " + std::to_string(ran->exit_code) + ": read stderr";
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

asio::awaitable<result<exec_result>> tool_session::state::exec_shell(sandbox& box,
                                                                     exec_request request,
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

asio::awaitable<result<std::vector<file_write_result>>> tool_session::state::write_files(
    sandbox& box, std::vector<file_write> files, deadline limit) {
    auto written = co_await box.async_write_files(files, limit);
    if (!written) co_return written;
    exec_request mkdir;
    mkdir.argv = {"mkdir", "-p", "--"};
    for (const auto& w : *written) {
        if (!w.outcome && w.outcome.error().code == errc::file_not_found) {
            mkdir.argv.push_back(std::filesystem::path(w.path).parent_path().string());
        }
    }
    if (mkdir.argv.size() == 3) co_return written;
    // A parent directory is missing: create them (as the sandbox's user) and write again.
    mkdir.wall_limit = std::chrono::seconds(10);
    auto made = co_await box.async_exec(std::move(mkdir), limit);
    if (!made && is_callers_stop(made.error())) co_return std::move(made).error();
    co_return co_await box.async_write_files(std::move(files), limit);
}

asio::awaitable<result<tool_result>> tool_session::state::write_file(std::string given,
                                                                     std::string content,
                                                                     deadline limit) {
    const std::string path = sandbox_path(given, layout.workdir);
    auto got = co_await lease(limit);
    if (!got) co_return failed_step("write_file", std::move(got).error());
    auto box = got->lease.box;
    const std::uint64_t size = content.size();
    std::vector<file_write> files(1);
    files[0].path = path;
    files[0].content = std::move(content);
    auto written = co_await write_files(*box, std::move(files), limit);
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

asio::awaitable<result<tool_result>> tool_session::state::read_file(std::string given,
                                                                    file_encoding encoding,
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
            r.hint = "check the path with " + named("list_files") + " (relative paths start at " +
                     layout.workdir + ")";
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

asio::awaitable<result<tool_result>> tool_session::state::list_files(std::string given,
                                                                     deadline limit) {
    const std::string path = sandbox_path(given.empty() ? layout.workdir : given, layout.workdir);
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

}  // namespace moat
