#include "cli/cli_runtime.hpp"

#include <moat/e2b_backend.hpp>
#include <moat/local_backend.hpp>

#include "cli/host_files.hpp"
#include "cli/terminal_session.hpp"
#include "core/json_writer.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>

#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <exception>

namespace moat::cli {
namespace {

int signal_received = 0;
backend_choice selected_backend = backend_choice::local;
std::optional<sandbox_network> local_network_limit;

struct store_exit_code {
    int* code;
    bool* done;
    void operator()(const std::exception_ptr& failure, int value) const {
        *code = failure ? exit_failure : value;
        *done = true;
        if (!failure) return;
        // Never silent: an escaped exception is a moat bug, and the exit code alone hides it.
        try {
            std::rethrow_exception(failure);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "moat: internal error: %s\n", e.what());
        } catch (...) {
            std::fprintf(stderr, "moat: internal error: an unknown exception\n");
        }
    }
};

}  // namespace

std::optional<backend_choice> parse_backend_choice(std::string_view name) {
    if (name == "local") return backend_choice::local;
    if (name == "e2b") return backend_choice::e2b;
    return std::nullopt;
}

void select_backend(backend_choice choice) {
    selected_backend = choice;
}

std::string data_dir_from_environment() {
    const char* dir = std::getenv("MOAT_DATA_DIR");
    return dir != nullptr ? std::string(dir) : std::string();
}

void limit_local_network(sandbox_network limit) {
    local_network_limit = std::move(limit);
}

int run_with_backend(const std::function<asio::awaitable<int>(backend&)>& body) {
    // The CLI is the application: it may own signals. Ctrl-C cancels the work, which kills what
    // it started before the command exits.
    std::signal(SIGPIPE, SIG_IGN);
    asio::io_context io;
    std::unique_ptr<backend> local;
    if (selected_backend == backend_choice::e2b) {
        local = make_e2b_backend(io.get_executor(), e2b_config_from_environment());
    } else {
        local_options options;
        options.data_dir = data_dir_from_environment();
        options.network_limit = local_network_limit;
        local = make_local_backend(io.get_executor(), std::move(options));
    }
    asio::cancellation_signal cancel;
    asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
    signals.async_wait([&cancel](const std::error_code& ec, int number) {
        if (ec) return;
        signal_received = number;
        cancel.emit(asio::cancellation_type::terminal);
    });
    int code = exit_failure;
    bool done = false;
    asio::co_spawn(io, body(*local),
                   asio::bind_cancellation_slot(cancel.slot(), store_exit_code{&code, &done}));
    while (!done && io.run_one() > 0) {
    }
    if (!done) std::fprintf(stderr, "moat: internal error: the work stopped before it finished\n");
    // Shut down: the backend stops its helper; the remaining reader tasks end shortly after.
    signals.cancel();
    local.reset();
    io.run_for(std::chrono::seconds(2));
    return code;
}

int report_error(std::string_view command, const error& e) {
    std::fprintf(stderr, "moat %.*s: %s\n", static_cast<int>(command.size()), command.data(),
                 e.to_string().c_str());
    if (e.code == errc::sandbox_not_found || e.code == errc::sandbox_unavailable)
        return exit_no_sandbox;
    if (e.code == errc::invalid_argument || e.code == errc::invalid_path) return exit_usage;
    return exit_failure;
}

bool write_all(int fd, std::string_view data) {
    while (!data.empty()) {
        const ssize_t n = ::write(fd, data.data(), data.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
}

int interrupting_signal() noexcept {
    return signal_received;
}

namespace {

asio::awaitable<result<exec_result>> stream_to_terminal(exec_stream stream, bool raw) {
    bool terminal_open = true;
    terminal_safe safe_out;
    terminal_safe safe_err;
    for (;;) {
        auto next = co_await stream.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            const bool is_out = chunk->channel == output_channel::out;
            const int fd = is_out ? STDOUT_FILENO : STDERR_FILENO;
            auto& safe = is_out ? safe_out : safe_err;
            if (terminal_open && !write_for_terminal(fd, chunk->data, safe, raw))
                terminal_open = false;
            continue;
        }
        if (terminal_open && !raw) {
            (void)write_for_terminal(STDOUT_FILENO, {}, safe_out, raw);
            (void)write_for_terminal(STDERR_FILENO, {}, safe_err, raw);
        }
        co_return std::get<exec_result>(std::move(*next));
    }
}

}  // namespace

asio::awaitable<result<exec_result>> exec_for_terminal(std::shared_ptr<sandbox> box,
                                                       exec_request request, bool json, bool raw) {
    if (json) co_return co_await box->async_exec(std::move(request));
    auto stream = co_await box->async_exec_stream(std::move(request));
    if (!stream) co_return std::move(stream).error();
    co_return co_await stream_to_terminal(std::move(*stream), raw);
}

bool write_for_terminal(int fd, std::string_view data, terminal_safe& safe, bool raw) {
    if (raw || !is_terminal(fd)) return write_all(fd, data);
    // An empty chunk ends the stream: what the filter held is written.
    const std::string shown = data.empty() ? safe.finish() : safe.filter(data);
    return write_all(fd, shown);
}

std::optional<int> read_stdin_into(std::string_view command, exec_request& request) {
    std::uint32_t mode = 0;
    auto input = read_host_input("-", file_limits{}.max_file_bytes, mode);
    if (!input) return report_error(command, input.error());
    request.stdin_data = std::move(*input);
    return std::nullopt;
}

int finish_command(std::string_view command, const std::string& id,
                   const result<exec_result>& outcome, const command_flags& flags) {
    if (flags.json) print_exec_json(id, outcome);
    return exec_exit_code(command, outcome, flags.json, flags.request.wall_limit);
}

int run_command_with_backend(std::string_view command, command_flags& flags,
                             const std::function<asio::awaitable<int>(backend&)>& body) {
    if (auto problem = terminal_flags_problem(flags)) throw usage_error(*problem);
    // -i without -t: stdin is the command's, read whole first (as --stdin).
    if (flags.read_stdin || (flags.interactive && !flags.terminal)) {
        if (auto failed = read_stdin_into(command, flags.request)) return *failed;
    }
    return run_with_backend(body);
}

void print_exec_json(const std::string& id, const result<exec_result>& r) {
    json_writer w;
    w.begin_object().key("sandbox_id").value(id);
    if (!r) {
        w.key("error").value(to_string(static_cast<errc>(r.error().code.value())));
        w.key("detail").value(r.error().detail);
    } else {
        w.key("exit_code").value(r->exit_code);
        w.key("signal").value(r->signal);
        w.key("timed_out").value(r->timed_out);
        w.key("oom_killed").value(r->oom_killed);
        w.key("strays_killed").value(r->strays_killed);
        w.key("duration_ms").value(static_cast<double>(r->duration.count()) / 1000.0);
        w.key("stdout").value(r->out.text());
        w.key("stderr").value(r->err.text());
        w.key("stdout_omitted_bytes").value(r->out.omitted_bytes);
        w.key("stderr_omitted_bytes").value(r->err.omitted_bytes);
    }
    w.end_object();
    std::string text = w.take() + "\n";
    write_all(STDOUT_FILENO, text);
}

void report_exec_end(const exec_result& r, std::chrono::milliseconds wall_limit) {
    if (r.timed_out) {
        std::fprintf(stderr, "moat: the command ran past its %.3g s wall limit and was killed\n",
                     static_cast<double>(wall_limit.count()) / 1000.0);
    } else if (r.oom_killed) {
        std::fputs("moat: the command was killed: out of memory (the sandbox's memory limit)\n",
                   stderr);
    }
    if (r.strays_killed) {
        std::fputs("moat: processes the command left running were stopped when it ended\n", stderr);
    }
}

int exec_exit_code(std::string_view command, const result<exec_result>& outcome, bool json,
                   std::chrono::milliseconds wall_limit) {
    if (outcome) {
        if (!json) report_exec_end(*outcome, wall_limit);
        return outcome->exit_code;
    }
    if (outcome.error().code == errc::cancelled) {
        if (!json) {
            std::fprintf(stderr, "moat %.*s: interrupted; the command was killed\n",
                         static_cast<int>(command.size()), command.data());
        }
        return signal_received != 0 ? 128 + signal_received : exit_interrupted;
    }
    if (json) return exit_failure;
    return report_error(command, outcome.error());
}

}  // namespace moat::cli
