// The worker's side of a session's Python interpreter, a resident of the sandbox shared by every
// worker attached to it (see python_driver.hpp for the protocol): each cell goes through a relay
// command this worker spawns; the first cell that finds no interpreter starts its supervisor.
// Confined to one executor; one cell at a time per worker (the tool session serialises calls),
// and one at a time across workers (the sandbox's turn lock).
#pragma once

#include <moat/cell_result.hpp>
#include <moat/deadline.hpp>
#include <moat/exec.hpp>
#include <moat/result.hpp>
#include <moat/sandbox.hpp>

#include "tools/cell_events.hpp"

#include <asio/awaitable.hpp>

#include <sys/types.h>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace moat {

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
    // 0 when the cell did not reach one (busy).
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
    asio::awaitable<result<cell_outcome>> async_run(
        std::shared_ptr<sandbox> box, std::string code, std::chrono::milliseconds timeout,
        deadline limit, std::function<void(output_channel, std::string_view)> on_output = {},
        cell_event_sink on_event = {});

  private:
    asio::awaitable<result<void>> start_resident(sandbox& box, deadline limit);
    // Waits (bounded) until the supervisor has finished with every earlier connection: the kill
    // of an interpreter whose relay was stopped is complete.
    asio::awaitable<void> confirm_stopped(sandbox& box);

    std::string python_;
    output_limits capture_;
};

}  // namespace moat
