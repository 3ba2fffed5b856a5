// The processes one sandbox runs under `moat serve` (envd's process service keeps the same table):
// the live ones, each with its output drained into a bounded buffer, and the ends of those that
// finished, kept for a while so that a late Connect still learns how they ended.
//
// A process belongs to the table, not to the stream that started it: a client that disconnects
// leaves it running. The table pulls each process's output as it comes (one pump per process), so
// a process never waits on a client. Each process keeps its most recent output, up to
// output_buffer_bytes, whether a client has read it or not; past that the oldest output is
// dropped, and what is dropped before any subscription had it is counted
// (process_info::dropped_bytes). Any number of subscriptions follow one process: a subscription
// starts at the oldest output still buffered (so a client that re-attaches gets what it missed,
// and what it had already seen within the window, rather than losing output its old stream was
// sent as it went away), then follows live output, then gets the end exactly once. While a
// subscription is attached, nothing it has not read is dropped: the pump holds the next chunk
// (and so the pipe pushes back on the process) until the slowest attached subscription has
// room. A client that is stuck is bounded by its own stream (the HTTP write timeout drops it,
// which detaches it); with nobody attached the pump never waits.
//
// Bounds: at most max_processes live processes (add() fails with limit_exceeded past it), each
// holding at most output_buffer_bytes; at most max_retained_ends finished processes, each kept
// retained_end_age after its end (their buffered output with them). Each buffered chunk is charged
// 64 bytes of bookkeeping against the cap, so many small chunks cannot outgrow it. Memory per
// sandbox is thus at most (max_processes + max_retained_ends) * output_buffer_bytes, plus one
// chunk in hand per waiting pump; across a server's tables, output_budget bounds the total.
//
// close() is the sandbox's end: every subscription fails at once with sandbox_unavailable (its
// detail the reason given), every pump is cancelled, which kills its process, and later calls
// fail the same way.
//
// Confined to one executor. The table must outlive its subscriptions' waits; async_shutdown()
// waits for the pumps.
#pragma once

#include "e2b_protocol/process_messages.hpp"

#include <moat/deadline.hpp>
#include <moat/exec.hpp>
#include <moat/result.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moat::serve {

// What a process was started with (envd's ProcessConfig), and which process a call means: by
// pid, or by the tag it was started with.
using e2b_protocol::process_config;
using e2b_protocol::process_selector;

// How a process ended, in the values of Go's os.ProcessState (envd's EndEvent): killed by a
// signal means exit_code -1, exited false, status "signal: killed"; an exit means exited true and
// status "exit status N". `error` is what Go's cmd.Wait() returns: set for a non-zero exit or a
// signal, absent for exit status 0.
struct process_end : e2b_protocol::end_event {
    // Its wall limit (the Start call's Connect-Timeout-Ms) killed it.
    bool timed_out = false;
};

// The end as envd would report it for this exec_result.
process_end end_from_result(const exec_result& r);

// A process as List reports it (pid, config, tag), and what the table knows of it beside.
struct process_info : e2b_protocol::listed_process {
    std::size_t buffered_bytes = 0;   // output in its buffer now (at most output_buffer_bytes)
    std::uint64_t dropped_bytes = 0;  // output dropped from a full buffer before anyone read it
    std::optional<process_end> end;   // once it has finished
};

// What the process tables of one server share: a cap on the output all their processes hold
// together. Past it, a process keeps only what the others leave of the capacity, but always at
// least min_share_bytes of its newest output; output pushed out that way is counted as dropped,
// like output pushed out of a full buffer, and an attached subscription still loses nothing (the
// pump waits for it instead). So every process of the server holds at most capacity_bytes
// together, plus min_share_bytes per process and one pipe read each in hand.
struct output_budget {
    std::size_t capacity_bytes = 256 * 1024 * 1024;
    std::size_t min_share_bytes = 64 * 1024;
    std::size_t used_bytes = 0;  // what the processes hold now (with each chunk's bookkeeping)
};

struct process_table_options {
    std::size_t output_buffer_bytes = 1024 * 1024;
    // Shared with the server's other tables; none: this table is bounded by its own caps alone.
    std::shared_ptr<output_budget> budget;
    std::size_t max_processes = 64;
    std::size_t max_retained_ends = 32;
    std::chrono::milliseconds retained_end_age = std::chrono::seconds(30);  // envd's
    // The clock retention is measured on; empty means std::chrono::steady_clock::now.
    std::function<std::chrono::steady_clock::time_point()> clock;
};

// What a subscription yields next.
struct process_event {
    enum class kind {
        output,  // `output` holds a chunk of stdout or stderr
        end,     // `end` holds how the process ended; the last event
        idle,    // the wake-up deadline passed with nothing to report (time for a keepalive)
    };
    kind type = kind::idle;
    output_chunk output{output_channel::out, {}};
    process_end end;
};

class process_table {
  public:
    struct state;
    struct entry;
    struct subscriber;

    // One client's view of one process. Movable; destroying it detaches (the process runs on).
    class subscription {
      public:
        subscription() = default;
        subscription(subscription&& other) noexcept;
        subscription& operator=(subscription&& other) noexcept;
        ~subscription();

        std::uint32_t pid() const noexcept;

        // The next event: buffered or live output, then the end once. Waits until `wake` when
        // there is nothing to report, then yields kind::idle. Errors: sandbox_unavailable (the
        // table was closed, or the process's pump failed: the detail says why), invalid_argument
        // after the end was delivered. Per-Operation Cancellation: terminal and partial; the
        // subscription stays usable and the call completes with errc::cancelled.
        asio::awaitable<result<process_event>> async_next(deadline wake);

      private:
        friend class process_table;
        subscription(std::shared_ptr<state> table, std::shared_ptr<entry> e);
        void detach() noexcept;
        std::shared_ptr<state> table_;
        std::shared_ptr<entry> entry_;
        std::shared_ptr<subscriber> self_;
    };

    explicit process_table(asio::any_io_executor executor, process_table_options options = {});
    ~process_table();
    process_table(const process_table&) = delete;
    process_table& operator=(const process_table&) = delete;

    // Whether add() would take one more process: limit_exceeded past max_processes,
    // sandbox_unavailable once closed. Check before spawning, so a refused process never runs.
    result<void> check_capacity() const;

    // Takes ownership of a started process and begins draining its output; returns its pid. A
    // retained end with the same pid or tag is forgotten (a reused pid never reports an old end).
    // Errors as check_capacity (the process is then dropped, which kills it).
    result<std::uint32_t> add(process p, process_config config, std::optional<std::string> tag);

    // Attaches to a live process, or to a retained end (which then yields its unread output and
    // its end). An unknown selector is errc::file_not_found (moat's one "no such thing" code a
    // caller names; Connect maps it to not_found) with the detail "process with pid N not found"
    // or "process with tag T not found", envd's text. Every call taking a selector says the same.
    result<subscription> subscribe(const process_selector& selector);

    // Whether the selector names a live process (the not-found error as subscribe's if not).
    result<void> check_live(const process_selector& selector) const;

    // The live processes, in pid order.
    std::vector<process_info> list() const;
    // A live or retained process's buffer counters (tests and diagnostics).
    result<process_info> info(const process_selector& selector) const;

    // Writes to a live process's stdin, one write at a time per process (a second waits its
    // turn), bounded by `limit` (deadline_exceeded). invalid_argument once its stdin is closed.
    asio::awaitable<result<void>> async_write_stdin(process_selector selector, std::string data,
                                                    deadline limit);
    asio::awaitable<result<void>> async_close_stdin(process_selector selector);
    // Signals a live process's process group. A finished process is not found (as envd).
    asio::awaitable<result<void>> async_signal(process_selector selector, int signal);

    // The sandbox is gone: see the top of this file. Idempotent.
    void close(std::string reason);
    bool is_closed() const noexcept;
    // close("the table was shut down") unless closed, then waits for every pump to finish.
    // Cancellation: none.
    asio::awaitable<void> async_shutdown();

  private:
    std::shared_ptr<state> state_;
};

}  // namespace moat::serve
