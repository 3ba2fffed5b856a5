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
// What the model's code did is a result, never an error: an exception, a non-zero exit, a timeout
// are tool_results with their status, error_type and traceback. tool_result::is_tool_error()
// separates moat's own failures and bad arguments (what an MCP client sees as isError) from them.
//
// Threading: like every moat object, a tool_session is bound to the executor of its manager; call
// it from coroutines on that executor. Calls on one session run one at a time, in order.
#pragma once

#include <moat/cell_result.hpp>
#include <moat/deadline.hpp>
#include <moat/exec.hpp>
#include <moat/files.hpp>
#include <moat/model_text.hpp>
#include <moat/result.hpp>
#include <moat/sandbox_spec.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
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

// How read_file returns a file and write_file takes one: text (read back shaped for a model, as
// run output is) or base64 of the exact bytes (for programs: an editor that downloads, changes
// and uploads a file, binary data). Both have the file API's size limits (file_limits).
enum class file_encoding { text, base64 };

// Receives a running program's output as it arrives: raw bytes (not shaped), in order per
// channel, on the session's executor, before the call completes. It must not block; it sees
// every byte the program wrote, whatever the capture limits keep for the result.
using output_callback = std::function<void(output_channel channel, std::string_view data)>;

// A file under the artifacts directory (sandbox_layout::artifacts_dir of the session's sandboxes,
// /workspace/out by default), where a model leaves files for the user. Read the
// bytes with tool_session::async_read_artifact; they are never put into model-facing text.
// Names starting with '.' (files and directories) and names ending in ".tmp" are not artifacts:
// a client's temporary files are not listed.
struct artifact {
    std::string path;  // relative to the artifacts directory, e.g. "plot.png" or "tables/a.csv"
    std::uint64_t size = 0;
    std::string media_type;  // from the file name's extension; application/octet-stream if unknown
};

// A process started with start_process: it runs in the background across calls until it ends,
// stop_process stops it, or the session ends. Its stdout and stderr are read all the time (so it
// never blocks on a full pipe); the last tool_options::background_output_bytes of each are kept.
struct background_process {
    int id = 0;           // the session's number for it: 1, 2, ... (never reused in a session)
    std::string command;  // as given (at most 200 bytes of it)
    std::string cwd;
    bool is_running = true;
    std::optional<int> exit_code;    // once ended: its code, 128+N when signal N ended it
    std::uint64_t stdout_bytes = 0;  // written so far, whatever was kept
    std::uint64_t stderr_bytes = 0;
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
    std::vector<artifact> artifacts;   // run_python, run_shell: what the artifacts dir holds
    // run_python: the figures and images the cell displayed (matplotlib figures, display() of an
    // image), each saved by this call as a file under the artifacts directory
    // (figure-NNN-K.png: cell NNN, its Kth image); they are in `artifacts` too.
    std::vector<artifact> images;
    // run_python: the cell's whole record (every result with all its representations, the
    // error, the execution count; moat/cell_result.hpp), for the application. The model reads
    // stdout_text (where each result's text appears in order), error_type, traceback and images;
    // to_json leaves this out.
    cell_result cell;
    // start_process, stop_process, read_process_output: that process; list_processes: all the
    // session's (running ones and the last ended ones). stdout_text / stderr_text hold
    // read_process_output's kept output.
    std::vector<background_process> processes;
    bool artifacts_truncated = false;  // the listing stopped at its bound (see docs/tools.md)
    // Characters the shaping cut from stdout, stderr (run tools) and content (a text read_file).
    std::uint64_t stdout_omitted = 0;
    std::uint64_t stderr_omitted = 0;
    std::uint64_t content_omitted = 0;
    file_encoding encoding = file_encoding::text;  // read_file: how `content` is encoded
    // "invalid_arguments" for bad arguments (any tool); on a file tool's error:
    // "file_not_found", "is_directory", "permission_denied", "invalid_path" (not a regular file,
    // not a directory, outside the sandbox's view, malformed) or "too_large".
    std::string error_code;
    bool argument_error = false;  // the arguments were invalid (unknown tool, a bad field)

    // moat's own failure or invalid arguments, as opposed to what the model's code did: an MCP
    // server reports these with isError. A Python exception, a non-zero exit, a timeout or a
    // missing file are not tool errors: they are results the model acts on.
    bool is_tool_error() const noexcept {
        return argument_error || status == tool_status::unavailable;
    }

    // The JSON rendering a model reads: {"status": ..., "exit_code": ..., "stdout": ...,
    // "stderr": ..., "truncated": ..., "omitted_chars": {...}, "duration_ms": ..., "error_type",
    // "error_code", "traceback", "message", "hint", "notices", "path", "encoding", "content",
    // "bytes", "entries", "images", "artifacts", "artifacts_truncated"}, one line. Fields that do
    // not apply are omitted: stdout/stderr/exit_code/truncated exist for the run tools; content,
    // encoding, truncated and bytes for a successful read_file (a failed read_file has no
    // "content", so a missing file never reads as an empty one); entries for a successful
    // list_files; omitted_chars ({"stdout": N, "stderr": M} or {"content": N}, only the cut ones)
    // when truncated; the optional texts and lists only when non-empty; "processes" (id, command,
    // cwd, running, exit_code once ended, stdout_bytes, stderr_bytes) for the process tools, with
    // stdout / stderr / truncated for read_process_output.
    std::string to_json() const;
};

// A tool as a model sees it. `input_schema` is a JSON Schema object (JSON text).
struct tool_definition {
    std::string name;
    std::string description;
    std::string input_schema;
};

// run_python {code, timeout_seconds?}, run_shell {command, timeout_seconds?},
// write_file {path, content, encoding?}, read_file {path, encoding?}, list_files {path?},
// start_process {command, cwd?}, list_processes {}, read_process_output {id}, stop_process {id}.
// Every bound a schema states (the timeout's range, the encodings) is also stated in the
// description text, for model APIs whose schema conversion drops keywords such as "maximum".
// The definitions describe a sandbox with `layout`: its working directory (relative paths, the
// default cwd and list_files' default), its home when that differs, and its artifacts directory
// are named in the descriptions. With a `prefix` the tools are named `prefix` + name
// ("moat_run_python") and their descriptions refer to each other by those names: for a framework
// whose own tools already use these names. `network` is what the sandbox may reach: the
// descriptions say the network is off (the default), or which hosts are reachable and how, so a
// model neither retries installs against a wall nor skips one that would work.
// tool_session::definitions() gives a session's own.
std::vector<tool_definition> tool_definitions(const sandbox_layout& layout = {},
                                              std::string_view prefix = {},
                                              const sandbox_network& network = {});

// The longest run_shell command or run_python cell: a longer one is an argument error that
// suggests writing a script file. Long commands are passed to the shell on its stdin, so this is
// the file limit, not the exec wire format's.
inline constexpr std::size_t max_program_bytes = file_limits{}.max_file_bytes;

struct tool_options {
    std::chrono::seconds default_timeout{30};  // a call's time limit when it names none
    std::chrono::seconds max_timeout{600};     // the most a call may ask for
    shaping_limits shaping;                    // per stream
    // Failed run_python / run_shell calls in a turn before "stop and report"; 0 turns it off.
    // Only the model's code counts: file tools (a framework's own probes) never do.
    int failures_before_stop = 3;
    std::string python = "python3";  // the interpreter inside the sandbox
    // The tool names a model sees: prefix + "run_python" and so on. async_call takes the prefixed
    // names (and only those, when a prefix is set); hints name the tools the same way.
    std::string tool_prefix;
    // Background processes (start_process): at most this many running at once per session, and
    // this much of each one's stdout and of its stderr kept (the latest bytes).
    int max_background_processes = 8;
    std::size_t background_output_bytes = 64 * 1024;
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

    // The sandbox the last call used (id, host pid, layers, ...), or nullopt before the first
    // call. A rebuilt sandbox replaces it on the next call.
    std::optional<moat::sandbox_info> current_sandbox() const;

    // The tools as this session's model sees them: tool_definitions for the layout and network
    // of its manager's sandboxes (session_manager::layout, network) and options.tool_prefix.
    std::vector<tool_definition> definitions() const;
    // The layout of the manager's sandboxes (session_manager::layout), which the tools use.
    const sandbox_layout& layout() const noexcept;
    // What the manager's sandboxes may reach (session_manager::network).
    const sandbox_network& network() const noexcept;

    // Marks the start of a model turn (one user message). After `failures_before_stop` failed
    // run_python / run_shell calls in one turn, results tell the model to stop retrying and
    // report to the user. Without turns (an MCP client), the count resets on every successful
    // run call instead.
    void begin_turn();

    // Runs a tool by name with its arguments as a JSON object (as a model or an MCP client sends
    // them). Unknown tools and invalid arguments are tool_results with status error, a message
    // naming the bad field and a hint (and argument_error set). Per-operation cancellation and
    // `limit`: the running program is killed (an interpreter is restarted on the next call) and
    // the call completes with errc::cancelled or errc::deadline_exceeded; no other error is
    // returned. `on_output`, if set, receives run_python's and run_shell's output while they run.
    asio::awaitable<result<tool_result>> async_call(std::string_view tool,
                                                    std::string_view arguments_json,
                                                    deadline limit = {},
                                                    output_callback on_output = {});

    // The tools, typed. A timeout of nullopt means options.default_timeout. write_file's
    // `content` is the file's bytes.
    asio::awaitable<result<tool_result>> async_run_python(
        std::string code, std::optional<std::chrono::milliseconds> timeout = {},
        deadline limit = {}, output_callback on_output = {});
    asio::awaitable<result<tool_result>> async_run_shell(
        std::string command, std::optional<std::chrono::milliseconds> timeout = {},
        deadline limit = {}, output_callback on_output = {});
    asio::awaitable<result<tool_result>> async_write_file(std::string path, std::string content,
                                                          deadline limit = {});
    asio::awaitable<result<tool_result>> async_read_file(std::string path, deadline limit = {});
    asio::awaitable<result<tool_result>> async_read_file(std::string path, file_encoding encoding,
                                                         deadline limit = {});
    // "" lists the working directory.
    asio::awaitable<result<tool_result>> async_list_files(std::string path = {},
                                                          deadline limit = {});

    // Background processes. start_process runs `/bin/sh -c command` in `cwd` (default
    // the working directory; relative to it) with the backend's spawn: it outlives the call, its
    // output is pumped into bounded buffers, and it ends at stop_process (SIGTERM, then SIGKILL
    // after 3 s), on its own, or with the session (async_end, a rebuilt sandbox). A session already
    // running max_background_processes gets an error result. `id` is background_process::id; an
    // unknown id is an argument error.
    asio::awaitable<result<tool_result>> async_start_process(std::string command,
                                                             std::string cwd = "",
                                                             deadline limit = {});
    asio::awaitable<result<tool_result>> async_list_processes(deadline limit = {});
    asio::awaitable<result<tool_result>> async_read_process_output(int id, deadline limit = {});
    asio::awaitable<result<tool_result>> async_stop_process(int id, deadline limit = {});

    // Files under the artifacts directory, and one of them as bytes (for the application, not
    // the model). Paths in the tool layer are relative to the working directory
    // (sandbox_layout::workdir of the manager's spec, /workspace by default).
    asio::awaitable<result<std::vector<artifact>>> async_list_artifacts(deadline limit = {});
    asio::awaitable<result<std::string>> async_read_artifact(std::string path, deadline limit = {});
    // Any regular file under the working directory as exact bytes (relative paths start there);
    // invalid_path for a path outside it, else the file API's errors.
    asio::awaitable<result<std::string>> async_read_workspace_file(std::string path,
                                                                   deadline limit = {});

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
