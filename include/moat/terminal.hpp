// Terminals: a command on a pseudo-terminal of the sandbox's own (backend::async_open_terminal,
// sandbox::async_open_terminal), as a person or a coding agent drives an interactive shell.
//
// The command's stdin, stdout and stderr are the terminal, which is also its controlling
// terminal: it sees a tty (`test -t 0`), its size (`stty size`) and a window-size change
// (SIGWINCH), and a ^C byte written as input interrupts its foreground job (the terminal's line
// discipline turns it into SIGINT) instead of ending anything on the caller's side. Output is
// one stream (stdout and stderr merged, with the terminal's own echo and \r\n), in chunks as they
// come; the last item is the exec_result.
//
// Local backend: each sandbox has its own devpts instance, mounted when the sandbox is made;
// the host's terminals are never visible in it. pid 1 keeps the terminal's master while the
// command runs, so a terminal can be reattached by the command's pid (async_attach_terminal)
// from another handle, backend or process attached to the sandbox, after the first one went away.
// At most 256 terminals are open in one sandbox at once.
#pragma once

#include <moat/exec.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <variant>

namespace moat {

// A terminal's size in character cells; each side 1..max_side.
struct terminal_size {
    std::uint16_t rows = 24;
    std::uint16_t cols = 80;

    static constexpr std::uint16_t max_side = 1000;
    bool operator==(const terminal_size&) const = default;
};

// A command running on a terminal, or a reattachment to one.
//
// Lifetime: a terminal opened with exec_request::resident = false is the caller's, like a
// process: destroying the handle before the end kills the command (and the sandbox's end ends
// it). A resident one, and any reattachment, is the sandbox's: dropping the handle leaves the
// command running, to be reattached or killed (async_signal) later; it ends by itself, by its
// wall limit or with the sandbox. The request's wall limit applies (at most
// exec_request::max_spawn_wall_limit), and the default, 60 s, is short for an interactive
// shell: set it.
//
// async_next: the next output chunk (channel out), then the exec_result (empty captured output).
// A terminal whose reader stops pulling pushes back on the command once the terminal's buffer
// is full, as a real terminal nobody reads does. Two handles reading the same terminal at once
// (a reattachment while the first still reads) each get some of the chunks, not all of them.
// Per-Operation Cancellation: terminal, as exec_stream::async_next: the command is killed and
// its end confirmed, whatever its lifetime (to leave a command running, drop the handle).
// async_write: input bytes, written whole, waiting while the terminal's input is full (terminal
// cancellation stops the wait: errc::cancelled); errc::invalid_argument once the terminal has
// closed (the command and everything that held it ended).
// async_resize: the new size, each side 1..terminal_size::max_side (else invalid_argument); the
// command's foreground job gets SIGWINCH.
// async_signal: a signal (1..64) to the command's process group (use it to kill: the command's
// own group, not only the foreground job).
class terminal {
  public:
    struct impl {
        virtual ~impl() = default;
        virtual std::uint64_t id() const = 0;
        virtual int pid() const = 0;
        virtual asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() = 0;
        virtual asio::awaitable<result<void>> async_write(std::string data) = 0;
        virtual asio::awaitable<result<void>> async_resize(terminal_size size) = 0;
        virtual asio::awaitable<result<void>> async_signal(int signal) = 0;
    };

    terminal() = default;
    explicit terminal(std::unique_ptr<impl> i) : impl_(std::move(i)) {}

    // The backend's id for this handle's view of the command, and the command's pid inside the
    // sandbox (what async_attach_terminal takes).
    std::uint64_t id() const { return impl_->id(); }
    int pid() const { return impl_->pid(); }
    explicit operator bool() const noexcept { return impl_ != nullptr; }

    asio::awaitable<result<std::variant<output_chunk, exec_result>>> async_next() {
        return impl_->async_next();
    }
    asio::awaitable<result<void>> async_write(std::string data) {
        return impl_->async_write(std::move(data));
    }
    asio::awaitable<result<void>> async_resize(terminal_size size) {
        return impl_->async_resize(size);
    }
    asio::awaitable<result<void>> async_signal(int signal) { return impl_->async_signal(signal); }

  private:
    std::unique_ptr<impl> impl_;
};

}  // namespace moat
