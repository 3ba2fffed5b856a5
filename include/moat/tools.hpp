// The model-facing tool layer: the tools a language model calls (run_python, run_shell,
// write_file, read_file, list_files), their definitions (name, JSON Schema, a description written
// as a prompt), and results shaped for a model to read.
//
// A tool_session is one conversation's code tool. It leases the conversation's sandbox from a
// session_manager on every call (attach-or-create, so an idle-ended or lost sandbox is rebuilt and
// the result says so), keeps one Python interpreter per session inside that sandbox (variables and
// imports persist across cells), and turns everything that can happen into a tool_result: what the
// program did, a timeout, a crash, a lost sandbox. Only a caller's own cancellation or deadline is
// an error.
//
// Threading: like every moat object, a tool_session is bound to the executor of its manager; call
// it from coroutines on that executor. Calls on one session run one at a time, in order.
#pragma once

#include <moat/deadline.hpp>
#include <moat/files.hpp>
#include <moat/model_text.hpp>
#include <moat/result.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat {

class session_manager;

// ok: the call did what was asked (a program exited 0, a file was written). error: it did not
// (non-zero exit, a Python exception, a missing file, bad arguments). timeout: the program ran
// past its time limit and was killed. unavailable: the sandbox could not be reached or created;
// the next call builds a new one.
enum class tool_status { ok, error, timeout, unavailable };
const char* to_string(tool_status status) noexcept;

// A file under /workspace/out, the directory where a model leaves files for the user. Read the
// bytes with tool_session::async_read_artifact; they are never put into model-facing text.
struct artifact {
    std::string path;  // relative to /workspace/out, e.g. "plot.png" or "tables/summary.csv"
    std::uint64_t size = 0;
    std::string media_type;  // from the file name's extension; application/octet-stream if unknown
};

// One tool call's outcome, as the model will read it. Every text field is shaped (ANSI-free,
// valid UTF-8, clamped with a marker) and free of host details: no host paths, no host
// environment, no credentials.
struct tool_result {
    std::string tool;  // the tool that ran
    tool_status status = tool_status::ok;
    std::optional<int> exit_code;  // run_python, run_shell: 124 on timeout, 128+N on signal N
    std::string stdout_text;       // run_python, run_shell
    std::string stderr_text;
    std::chrono::milliseconds duration{0};
    std::string error_type;  // on error: the exception name ("KeyError"), or "" if none is known
    std::string traceback;   // on error from Python: the traceback, clamped
    std::string message;     // on error: one line naming what was wrong
    std::string hint;        // what the model should do next
    std::vector<std::string> notices;  // e.g. "the interpreter restarted: variables are gone"
    std::string path;                  // write_file, read_file, list_files: the path acted on
    std::string content;               // read_file: the file's text, shaped
    std::uint64_t bytes = 0;           // write_file, read_file: the file's size
    std::vector<dir_entry> entries;    // list_files
    std::vector<artifact> artifacts;   // run_python, run_shell: what /workspace/out now holds

    // The JSON rendering a model reads: {"status": ..., "exit_code": ..., "stdout": ...,
    // "stderr": ..., "duration_ms": ..., "error_type", "traceback", "message", "hint", "notices",
    // "path", "content", "bytes", "entries", "artifacts"}, one line. Fields that do not apply are
    // omitted: stdout/stderr/exit_code exist for the run tools; content/bytes/entries for a file
    // tool's successful call only (a failed read_file has no "content", so a missing file never
    // reads as an empty one); the optional texts and lists only when non-empty.
    std::string to_json() const;
};

// A tool as a model sees it. `input_schema` is a JSON Schema object (JSON text).
struct tool_definition {
    std::string name;
    std::string description;
    std::string input_schema;
};

// run_python {code, timeout_seconds?}, run_shell {command, timeout_seconds?},
// write_file {path, content}, read_file {path}, list_files {path?}.
const std::vector<tool_definition>& tool_definitions();

struct tool_options {
    std::chrono::seconds default_timeout{30};  // a call's time limit when it names none
    std::chrono::seconds max_timeout{600};     // the most a call may ask for
    shaping_limits shaping;                    // per stream
    int failures_before_stop = 3;              // failed calls in a turn before "stop and report"
    std::string python = "python3";            // the interpreter inside the sandbox
};

class tool_session {
  public:
    // Uses `sessions` (which must outlive this object) with `session_key`: every call leases that
    // key's sandbox.
    tool_session(session_manager& sessions, std::string session_key, tool_options options = {});
    ~tool_session();
    tool_session(const tool_session&) = delete;
    tool_session& operator=(const tool_session&) = delete;

    const std::string& session_key() const noexcept;
    // The executor of the session's manager.
    asio::any_io_executor get_executor() const;

    // Marks the start of a model turn (one user message). After `failures_before_stop` failed
    // calls in one turn, results tell the model to stop retrying and report to the user. Without
    // turns (an MCP client), the count resets on every successful call instead.
    void begin_turn();

    // Runs a tool by name with its arguments as a JSON object (as a model or an MCP client sends
    // them). Unknown tools and invalid arguments are tool_results with status error, a message
    // naming the bad field and a hint. Per-operation cancellation and `limit`: the running program
    // is killed (an interpreter is restarted on the next call) and the call completes with
    // errc::cancelled or errc::deadline_exceeded; no other error is returned.
    asio::awaitable<result<tool_result>> async_call(std::string_view tool,
                                                    std::string_view arguments_json,
                                                    deadline limit = {});

    // The tools, typed. A timeout of nullopt means options.default_timeout.
    asio::awaitable<result<tool_result>> async_run_python(
        std::string code, std::optional<std::chrono::milliseconds> timeout = {},
        deadline limit = {});
    asio::awaitable<result<tool_result>> async_run_shell(
        std::string command, std::optional<std::chrono::milliseconds> timeout = {},
        deadline limit = {});
    asio::awaitable<result<tool_result>> async_write_file(std::string path, std::string content,
                                                          deadline limit = {});
    asio::awaitable<result<tool_result>> async_read_file(std::string path, deadline limit = {});
    asio::awaitable<result<tool_result>> async_list_files(std::string path = "/workspace",
                                                          deadline limit = {});

    // Files under /workspace/out, and one of them as bytes (for the application, not the model).
    asio::awaitable<result<std::vector<artifact>>> async_list_artifacts(deadline limit = {});
    asio::awaitable<result<std::string>> async_read_artifact(std::string path, deadline limit = {});

    // Ends the session: stops the interpreter and has the manager destroy the sandbox (confirmed).
    asio::awaitable<result<void>> async_end();

    struct state;

  private:
    std::shared_ptr<state> state_;
};

// The media type for a file name, from its extension ("plot.png" -> "image/png");
// "application/octet-stream" when unknown.
std::string media_type_for(std::string_view file_name);

}  // namespace moat
