// What the tool session's files share: the session's state (tool_session::state) and the
// contract between them.
//
// - tool_session.cpp: the session itself: one call at a time in the session's queue (take_turn),
//   the arguments checked before a call takes its turn, a tool called by name, the sandbox leased
//   for each call (lease), the retry ceiling (finish), the results that say a call did not happen
//   (failed, bad_arguments, unavailable, failed_step) and the session's end. It also defines the
//   shared helpers below.
// - sandbox_tools.cpp: the tools' own work in the sandbox (run_shell, write_file, read_file,
//   list_files, the artifacts walk), each turning what happened into a tool_result worded for the
//   model.
// - python_tool.cpp: run_python: a cell through the session's interpreter (python_kernel), its
//   results as the model reads them, its figures and images saved as artifacts.
// - background_processes.cpp: start_process, list_processes, read_process_output, stop_process,
//   and the pumps that read each background process until it ends (background_entry is its own).
//
// Every member below runs on the manager's executor and is called only by a call that holds the
// session's turn (or by async_end, which takes it), so none of them locks anything.
#pragma once

#include <moat/session_manager.hpp>
#include <moat/task_group.hpp>
#include <moat/tools.hpp>

#include "handle/operation_queue.hpp"
#include "tools/python_kernel.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat {

namespace tool_detail {

// A command longer than this goes to the shell on its stdin rather than in its argv, which the
// exec wire format bounds.
inline constexpr std::size_t max_inline_command = 16 * 1024;

// What the interpreter keeps of each stream before shaping: more than a model sees, so the shaper
// can count what it omits, yet bounded.
inline constexpr output_limits capture_limits{256 * 1024, 256 * 1024};

// The notice of a result whose call found a rebuilt sandbox.
inline constexpr const char* notice_rebuilt =
    "the environment was rebuilt: files and variables from earlier calls are gone";

// A duration as a model reads it ("30 s", "1.5 s").
std::string seconds_text(std::chrono::milliseconds d);

// The caller's own cancellation or deadline: an error, never a result for the model.
bool is_callers_stop(const error& failure);

// Errors from the sandbox layer as a model may read them: file errors name only the sandbox path;
// anything else is described by kind, since its detail may name host paths.
std::string model_message(const error& failure);

// A path as the model gave it, made absolute (relative to the working directory) and lexically
// normal.
std::string sandbox_path(std::string_view given, const std::string& workdir);

// `path` (normal, absolute) is `dir` or lies under it.
bool is_under(std::string_view path, std::string_view dir);

// The notice of a result whose call found (or caused) a restarted interpreter.
inline constexpr const char* notice_restarted =
    "the interpreter restarted: variables and imports are gone";

// "SIGSEGV" for SIGSEGV, "a signal" for one without a name here (sandbox_tools.cpp).
const char* signal_name(int signal);

// What the model should do about a Python exception of `type`; `list_files` is how the model
// sees that tool, `network` says whether pip can install and from where (sandbox_tools.cpp).
std::string hint_for_python_error(const std::string& type, const std::string& list_files,
                                  const std::string& workdir, const sandbox_network& network);

// A background process (start_process); defined in background_processes.cpp.
struct background_entry;

}  // namespace tool_detail

struct tool_session::state {
    state(session_manager& s, std::string k, tool_options o, asio::any_io_executor executor)
        : sessions(s),
          layout(s.layout()),
          network(s.network()),
          key(std::move(k)),
          options(std::move(o)),
          kernel(options.python, tool_detail::capture_limits),
          pumps(executor, "background processes"),
          calls(std::move(executor)) {}

    session_manager& sessions;
    const sandbox_layout& layout;    // the manager's: where the working and artifacts dirs are
    const sandbox_network& network;  // the manager's: what the tools may reach
    std::string key;
    tool_options options;
    python_kernel kernel;
    task_group pumps;  // one per background process, until it ends
    std::vector<std::shared_ptr<tool_detail::background_entry>> background;
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

    bool network_off() const noexcept { return network.mode == network_mode::none; }

    static void set_stderr(tool_result& r, shaped_text shaped) {
        r.stderr_text = std::move(shaped.text);
        r.stderr_omitted = shaped.omitted_chars;
    }

    // --- the session (tool_session.cpp)

    // Counts a finished run_python / run_shell call for the retry ceiling and adds its notice.
    // Other tools never count: a framework's own probes (a `read_file` of a missing file) are not
    // the model's code failing.
    tool_result finish(tool_result r);

    static tool_result failed(std::string tool, tool_status status, std::string message,
                              std::string hint);
    static tool_result bad_arguments(std::string tool, std::string message, std::string hint);
    // The sandbox failed: the model reads only the kind; the operator's log keeps what went wrong.
    static tool_result unavailable(std::string tool, const error& failure);
    // A step that failed: the caller's own cancellation or deadline stays an error; anything
    // else is an unavailable result for the model.
    static result<tool_result> failed_step(const char* tool, error failure);

    // Takes this call's turn in the session's queue (none: granted; the caller releases it).
    asio::awaitable<std::optional<error>> take_turn(deadline limit);

    struct leased {
        session_lease lease;
        // The manager's word, which reaches exactly one call per rebuild across every worker that
        // shares the store (an idle-ended session that comes back counts: its marker).
        bool rebuilt = false;
        // This call has another sandbox than this object's last call had (a rebuild, or one that
        // another worker announced): the interpreter numbering starts again.
        bool moved = false;
    };

    // The session's sandbox from the manager, for one call.
    asio::awaitable<result<leased>> lease(deadline limit);

    // Any file's exact bytes (the application's reads: artifacts, workspace files).
    asio::awaitable<result<std::string>> read_exact(std::string full, deadline limit);

    // --- the tools' work in the sandbox (sandbox_tools.cpp; run_python: python_tool.cpp)

    struct artifact_listing {
        std::vector<artifact> found;
        bool truncated = false;  // a bound stopped the walk before it saw everything
    };

    // Walks the artifacts directory depth-first, bounded in listings and in entries visited.
    asio::awaitable<artifact_listing> list_artifacts(sandbox& box, deadline limit);
    asio::awaitable<void> add_artifacts(tool_result& r, sandbox& box, deadline limit);

    // Saves the images among r.cell's results under the artifacts directory (figure-NNN-K.ext)
    // and lists them in r.images; what could not be saved is a notice.
    asio::awaitable<void> save_images(tool_result& r, sandbox& box, std::uint64_t cell_number,
                                      deadline limit);
    asio::awaitable<result<tool_result>> run_python(std::string code,
                                                    std::chrono::milliseconds timeout,
                                                    deadline limit, output_callback on_output);
    asio::awaitable<result<tool_result>> run_shell(std::string command,
                                                   std::chrono::milliseconds timeout,
                                                   deadline limit, output_callback on_output);
    // Runs a command to its end; with `on_output`, as a stream whose chunks go to it as they
    // arrive while the same head + tail capture as async_exec's is kept for the result.
    static asio::awaitable<result<exec_result>> exec_shell(sandbox& box, exec_request request,
                                                           deadline limit,
                                                           output_callback on_output);
    // Writes `files`, creating missing parent directories (as the sandbox's user).
    static asio::awaitable<result<std::vector<file_write_result>>> write_files(
        sandbox& box, std::vector<file_write> files, deadline limit);
    asio::awaitable<result<tool_result>> write_file(std::string given, std::string content,
                                                    deadline limit);
    asio::awaitable<result<tool_result>> read_file(std::string given, file_encoding encoding,
                                                   deadline limit);
    asio::awaitable<result<tool_result>> list_files(std::string given, deadline limit);

    // --- background processes (background_processes.cpp)

    std::size_t running_processes() const;
    std::shared_ptr<tool_detail::background_entry> find_process(int id) const;
    tool_result unknown_process(const char* tool, int id) const;
    asio::awaitable<result<tool_result>> start_process(std::string command, std::string cwd,
                                                       deadline limit);
    tool_result list_processes() const;
    tool_result read_process_output(int id) const;
    asio::awaitable<result<tool_result>> stop_process(int id);
    // The session's end: every background process is killed (its read is cancelled) and its
    // pump has finished.
    asio::awaitable<void> stop_background();
};

}  // namespace moat
