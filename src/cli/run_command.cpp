// moat run: one command in a fresh sandbox, output streamed live, sandbox destroyed after.
#include <moat/local_backend.hpp>

#include "cli/arguments.hpp"
#include "cli/commands.hpp"
#include "core/json_writer.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <asio/this_coro.hpp>

#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>

namespace moat::cli {
namespace {

struct run_options {
    sandbox_spec spec;
    exec_request request;
    bool json = false;
};

run_options parse_run_options(int argc, char** argv) {
    run_options o;
    int i = 0;
    for (; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--") {
            ++i;
            break;
        }
        if (arg == "--json") {
            o.json = true;
        } else if (auto seconds = flag_value("--timeout", argc, argv, i)) {
            const auto t = parse_seconds(*seconds);
            if (!t || *t > exec_request::max_wall_limit) {
                throw usage_error("--timeout: expected seconds between 0.001 and 600, got '" +
                                  *seconds + "'");
            }
            o.request.wall_limit = *t;
        } else if (auto megabytes = flag_value("--memory", argc, argv, i)) {
            auto mb = parse_unsigned(*megabytes);
            if (!mb || *mb < 16 || *mb > (std::uint64_t{1} << 30)) {
                throw usage_error("--memory: expected megabytes, at least 16, got '" + *megabytes +
                                  "'");
            }
            o.spec.limits.memory_bytes = *mb << 20;
        } else if (auto count = flag_value("--pids", argc, argv, i)) {
            auto n = parse_unsigned(*count);
            if (!n || *n < 1 || *n > 1'000'000) {
                throw usage_error("--pids: expected a count between 1 and 1000000, got '" + *count +
                                  "'");
            }
            o.spec.limits.pids = static_cast<std::uint32_t>(*n);
        } else if (auto pair = flag_value("--env", argc, argv, i)) {
            const auto eq = pair->find('=');
            if (eq == 0 || eq == std::string::npos) {
                throw usage_error("--env: expected K=V, got '" + *pair + "'");
            }
            o.spec.env[pair->substr(0, eq)] = pair->substr(eq + 1);
        } else if (auto dir = flag_value("--workdir", argc, argv, i)) {
            if (dir->empty() || dir->front() != '/') {
                throw usage_error("--workdir: expected an absolute path, got '" + *dir + "'");
            }
            o.spec.workdir = *dir;
        } else if (arg.starts_with("-")) {
            throw usage_error("unknown option '" + std::string(arg) + "'");
        } else {
            break;  // the command starts here ("--" is optional)
        }
    }
    for (; i < argc; ++i) o.request.argv.emplace_back(argv[i]);
    if (o.request.argv.empty()) throw usage_error("missing command (moat run [options] -- CMD...)");
    o.spec.labels["moat.cli"] = "run";
    return o;
}

// Blocking write of a whole chunk; false if the reader went away.
bool write_all(int fd, std::string_view data) {
    while (!data.empty()) {
        const ssize_t n = ::write(fd, data.data(), data.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
}

void print_json(const std::string& id, const result<exec_result>& r) {
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

void report_end(const exec_result& r, const run_options& o) {
    if (r.timed_out) {
        std::fprintf(stderr, "moat: the command ran past its %.3g s wall limit and was killed\n",
                     static_cast<double>(o.request.wall_limit.count()) / 1000.0);
    } else if (r.oom_killed) {
        std::fprintf(stderr, "moat: the command was killed: out of memory (limit %llu MiB)\n",
                     static_cast<unsigned long long>(o.spec.limits.memory_bytes >> 20));
    }
}

asio::awaitable<result<exec_result>> stream_to_terminal(backend& b, std::string id,
                                                        exec_request request) {
    auto stream = co_await b.async_exec_stream(std::move(id), std::move(request));
    if (!stream) co_return std::move(stream).error();
    bool terminal_open = true;
    for (;;) {
        auto next = co_await stream->async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            const int fd = chunk->channel == output_channel::out ? STDOUT_FILENO : STDERR_FILENO;
            if (terminal_open && !write_all(fd, chunk->data)) terminal_open = false;
            continue;
        }
        co_return std::get<exec_result>(std::move(*next));
    }
}

asio::awaitable<int> run_in_sandbox(backend& b, run_options o) {
    auto created = co_await b.async_create(o.spec);
    if (!created) {
        std::fprintf(stderr, "moat run: cannot create a sandbox: %s\n",
                     created.error().to_string().c_str());
        co_return exit_failure;
    }
    const std::string id = created->id;
    result<exec_result> outcome = make_error(errc::cancelled, "not started");
    if (o.json) {
        outcome = co_await b.async_exec(id, o.request);
    } else {
        outcome = co_await stream_to_terminal(b, id, o.request);
    }
    // Destroy whatever happened, cancellation included, and confirm it.
    co_await asio::this_coro::reset_cancellation_state();
    auto destroyed = co_await b.async_destroy(id);

    int code = exit_failure;
    if (o.json) print_json(id, outcome);
    if (outcome) {
        if (!o.json) report_end(*outcome, o);
        code = outcome->exit_code;
    } else if (outcome.error().code == errc::cancelled) {
        if (!o.json) std::fputs("moat run: interrupted; the command was killed\n", stderr);
        code = 130;
    } else if (!o.json) {
        std::fprintf(stderr, "moat run: %s\n", outcome.error().to_string().c_str());
    }
    if (!destroyed) {
        std::fprintf(stderr, "moat run: destroy of %s failed: %s\n", id.c_str(),
                     destroyed.error().to_string().c_str());
        if (code == 0) code = exit_failure;
    }
    co_return code;
}

struct store_exit_code {
    int* code;
    bool* done;
    void operator()(const std::exception_ptr& failure, int value) const {
        *code = failure ? exit_failure : value;
        *done = true;
    }
};

}  // namespace

int run_command(int argc, char** argv) {
    run_options options = parse_run_options(argc, argv);
    // The CLI is the application: it may own signals. Ctrl-C cancels the run, which kills the
    // command and destroys the sandbox before exiting.
    std::signal(SIGPIPE, SIG_IGN);
    asio::io_context io;
    auto backend = make_local_backend(io.get_executor());
    asio::cancellation_signal cancel;
    asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
    signals.async_wait([&cancel](const std::error_code& ec, int) {
        if (!ec) cancel.emit(asio::cancellation_type::terminal);
    });
    int code = exit_failure;
    bool done = false;
    asio::co_spawn(io, run_in_sandbox(*backend, std::move(options)),
                   asio::bind_cancellation_slot(cancel.slot(), store_exit_code{&code, &done}));
    while (!done && io.run_one() > 0) {
    }
    // Shut down: the backend stops its helper; the remaining reader tasks end shortly after.
    signals.cancel();
    backend.reset();
    io.run_for(std::chrono::seconds(2));
    return code;
}

}  // namespace moat::cli
