// One Python interpreter kept alive inside a sandbox across a session's cells (see
// python_driver.hpp for the protocol). Confined to one executor; one cell at a time (the tool
// session serialises calls).
#pragma once

#include <moat/deadline.hpp>
#include <moat/exec.hpp>
#include <moat/result.hpp>
#include <moat/sandbox.hpp>

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
        completed,  // the cell ran to its end (ok or with an exception)
        timed_out,  // past its time limit: the interpreter was killed
        crashed,    // the interpreter exited during the cell (os._exit, a signal, OOM)
    };
    ending how = ending::completed;
    bool raised = false;         // completed with an exception
    std::string exception_type;  // "KeyError"; "" unless raised
    captured_output out;
    captured_output err;
    int exit_code = 0;  // crashed: the interpreter's exit code (128+N for signal N)
    int signal = 0;
    bool oom_killed = false;
    bool started_interpreter = false;  // this cell started a new interpreter
    std::chrono::milliseconds duration{0};
};

class python_kernel {
  public:
    python_kernel(std::string python, output_limits capture);
    ~python_kernel();
    python_kernel(const python_kernel&) = delete;
    python_kernel& operator=(const python_kernel&) = delete;

    // Runs `code` in `box`'s interpreter, starting one first if there is none there (a running
    // interpreter in another sandbox is killed). `timeout` is the cell's limit: past it the
    // interpreter is killed and the outcome says timed_out. Errors: the interpreter could not be
    // started (the sandbox's error), or the caller's cancellation / `limit` (the interpreter is
    // killed and confirmed gone first). `on_output`, if set, receives the cell's own output (never
    // the driver's records) as it arrives.
    asio::awaitable<result<cell_outcome>> async_run(
        std::shared_ptr<sandbox> box, std::string code, std::chrono::milliseconds timeout,
        deadline limit, std::function<void(output_channel, std::string_view)> on_output = {});

    // Kills the interpreter, if any, and waits (bounded) for its end.
    asio::awaitable<void> async_stop();

    struct running;

  private:
    std::string python_;
    output_limits capture_;
    std::unique_ptr<running> running_;
    std::uint64_t cells_ = 0;  // cells sent so far, across restarts: the next file's number
};

}  // namespace moat
