// The worker's side of a session's Python interpreter, a resident of the sandbox shared by every
// worker attached to it (see python_driver.hpp for the protocol): each cell goes through a link to
// its supervisor (kernel_link.hpp: a connection the sandbox's agent makes, or a relay command on a
// backend without that); the first cell that finds no interpreter starts the supervisor.
// Confined to one executor; one cell at a time per worker (the tool session serialises calls),
// and one at a time across workers (the sandbox's turn lock).
#pragma once

#include <moat/cell_result.hpp>
#include <moat/deadline.hpp>
#include <moat/exec.hpp>
#include <moat/result.hpp>
#include <moat/sandbox.hpp>

#include "tools/cell_events.hpp"
#include "tools/kernel_link.hpp"

#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

#include <sys/types.h>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat {

// Lets a caller interrupt a running cell now, as its time limit would (an E2B client that went
// away mid-cell): a KeyboardInterrupt in the cell, and a kill python_kernel::interrupt_grace
// later if it has not ended. Confined to the kernel's executor; for one cell.
class cell_interrupt {
  public:
    void request() noexcept;
    bool requested() const noexcept { return requested_; }

    // python_kernel's: the wait an interrupt request ends (null when none runs).
    asio::steady_timer* waiting = nullptr;

  private:
    bool requested_ = false;
};

// Where and how a cell runs.
struct cell_options {
    // The context: "" is the sandbox's default one (the tool layer's); others come from
    // python_kernel::async_create_context.
    std::string context;
    // Set in the interpreter's environment for this cell only, then removed or put back (a
    // `!` line and subprocesses see them too).
    std::map<std::string, std::string> env;
    // When set, the caller may interrupt the cell before its time limit.
    std::shared_ptr<cell_interrupt> interrupt;
};

// A context: an interpreter of its own in the sandbox (own namespace, own working directory),
// beside the default one, shared by every worker attached to the sandbox.
struct python_context {
    std::string id;        // "" for the default context
    std::string language;  // "python", "bash" or "javascript"
    std::string cwd;       // its working directory when it was created
};

struct cell_outcome {
    enum class ending {
        completed,    // the cell ran to its end (ok or with an exception)
        interrupted,  // past its time limit: KeyboardInterrupt ended it, the interpreter kept
        timed_out,    // past its time limit and still running 2 s after the interrupt: killed
        crashed,      // the interpreter exited during the cell (os._exit, a signal, OOM)
        busy,         // another worker's cell held the interpreter for the whole turn wait
    };
    ending how = ending::completed;
    bool raised = false;         // completed (or interrupted) with an exception
    std::string exception_type;  // "KeyError"; "" unless raised
    captured_output out;
    captured_output err;
    cell_result cell;   // the cell's events in order, its error and execution count
    int exit_code = 0;  // crashed: the interpreter's exit code (128+N for signal N)
    int signal = 0;
    bool oom_killed = false;
    bool started_interpreter = false;  // this cell started a new interpreter
    // The interpreter's generation (1 for the sandbox's first, +1 per restart by any worker);
    // 0 when the cell did not reach one (busy), or for a cell of another context while the
    // default one has none.
    std::uint64_t generation = 0;
    // The cell's number in the sandbox (its file .cells/NNN.py); 0 when it did not reach one.
    std::uint64_t cell_number = 0;
    std::chrono::milliseconds duration{0};
};

class python_kernel {
  public:
    python_kernel(std::string python, output_limits capture);
    ~python_kernel();
    python_kernel(const python_kernel&) = delete;
    python_kernel& operator=(const python_kernel&) = delete;

    // How long a cell past its time limit has to end after its interrupt before the interpreter
    // is killed.
    static constexpr std::chrono::seconds interrupt_grace{2};

    // Runs `code` in `box`'s interpreter, starting one first if there is none there. The cell
    // waits for another worker's cell at most `timeout` (30 s at most), else the outcome is busy;
    // then `timeout` is the cell's limit: past it the cell is interrupted (SIGINT: a
    // KeyboardInterrupt in the cell, the outcome interrupted, the namespace kept), and if it has
    // not ended interrupt_grace later the interpreter is killed and the outcome says timed_out.
    // Errors: the interpreter could not be started or reached (the sandbox's error), or the
    // caller's cancellation / `limit` (the cell's relay is killed, confirmed, and with it the
    // interpreter). `on_output`, if set, receives the cell's own output (never the driver's
    // records) as it arrives; `on_event` its display results and error, in order with it.
    // (No defaults: a caller in a coroutine passes named arguments, since g++ 12 miscompiles a
    // braced default argument built inside a co_await expression.)
    asio::awaitable<result<cell_outcome>> async_run(
        std::shared_ptr<sandbox> box, std::string code, std::chrono::milliseconds timeout,
        deadline limit, std::function<void(output_channel, std::string_view)> on_output,
        cell_event_sink on_event, cell_options options);

    // Contexts, kept by the sandbox's supervisor (started first if there is none). create: a
    // context for `language` whose interpreter starts in `cwd` ("" the working directory; a
    // missing directory is errc::invalid_argument), started by its first cell; at most 32 per
    // sandbox. Languages: "python" ("" too), "bash" (a persistent shell: cwd, variables and
    // exports carry across cells; a non-zero status is the error ExitCode) and "javascript"
    // ("js": a persistent node process, each cell evaluated in its main context, the value of
    // its last expression as util.inspect shows it); another, or one whose program is not in the
    // sandbox, is errc::not_supported. Their cells have the same results, interrupt and env.
    // restart: its interpreter is killed (confirmed) and its next cell starts a new one; remove:
    // that, and the context is gone (the default one cannot be removed). An unknown id is
    // errc::invalid_argument ("no such context"), as is a cell for one. Each waits for a running
    // cell (the sandbox's turn) at most 30 s, else errc::backend_failure ("busy").
    asio::awaitable<result<python_context>> async_create_context(std::shared_ptr<sandbox> box,
                                                                 std::string language,
                                                                 std::string cwd,
                                                                 deadline limit = {});
    asio::awaitable<result<void>> async_restart_context(std::shared_ptr<sandbox> box,
                                                        std::string id, deadline limit = {});
    asio::awaitable<result<void>> async_remove_context(std::shared_ptr<sandbox> box, std::string id,
                                                       deadline limit = {});
    asio::awaitable<result<std::vector<python_context>>> async_list_contexts(
        std::shared_ptr<sandbox> box, deadline limit = {});

  private:
    // A link for one exchange whose frame was sent, with the supervisor's first line ("go ...",
    // "busy", an answer), or an error.
    struct link_answer {
        kernel_link link;
        bool complete = false;  // a whole first line arrived
        std::string line;
        std::string rest;  // what followed the line
        std::string err;   // the relay's stderr, for an error message
    };
    // A link to `box`'s supervisor: a direct connection (nullopt when none listens), or a relay
    // (which says "none" itself) that waits for its turn at most `relay_wait`.
    asio::awaitable<result<std::optional<kernel_link>>> reach(sandbox& box,
                                                              std::chrono::milliseconds relay_wait,
                                                              std::chrono::milliseconds wall,
                                                              deadline limit);
    // Sends `frame` over a new link (starting the supervisor when there is none), bounded by the
    // turn wait and `limit`.
    asio::awaitable<result<link_answer>> open_link(sandbox& box, std::string frame,
                                                   std::chrono::milliseconds turn_wait,
                                                   std::chrono::milliseconds wall,
                                                   std::size_t max_line, deadline limit);
    // A context operation: the supervisor's answer after "ok ".
    asio::awaitable<result<std::string>> manage(sandbox& box, std::string request, deadline limit);
    // restart or remove.
    asio::awaitable<result<void>> context_operation(sandbox& box, std::string_view op,
                                                    std::string id, deadline limit);

    asio::awaitable<result<void>> start_resident(sandbox& box, deadline limit);
    // Waits (bounded) until the supervisor has finished with every earlier connection: the kill
    // of an interpreter whose relay was stopped is complete.
    asio::awaitable<void> confirm_stopped(sandbox& box);

    std::string python_;
    output_limits capture_;
};

}  // namespace moat
