#include "e2b/envd_process_stream.hpp"

#include <moat/with_timeout.hpp>

#include "core/async_event.hpp"
#include "core/base64.hpp"
#include "core/exception_boundary.hpp"
#include "e2b_protocol/process_messages.hpp"
#include "http/connect_envelope.hpp"

#include <asio/this_coro.hpp>

#include <csignal>
#include <deque>
#include <random>
#include <variant>

namespace moat::e2b {
namespace {

namespace connect = http::connect;
namespace protocol = e2b_protocol;
using protocol::data_event;
using protocol::end_event;
using protocol::parse_process_event;
using protocol::start_event;
using item = std::variant<output_chunk, exec_result>;
using steady = std::chrono::steady_clock;

// How long past its wall limit a command's stream may stay open before the client ends it itself
// (envd ends it at the limit; a server that ignores Connect-Timeout-Ms gets this much slack).
constexpr std::chrono::milliseconds wall_slack{1000};
// One SendInput call carries at most this much stdin.
constexpr std::size_t stdin_chunk_bytes = 64 * 1024;

std::string new_tag() {
    static thread_local std::mt19937_64 generator{std::random_device{}()};
    static constexpr char hex[] = "0123456789abcdef";
    std::string tag = "moat-";
    for (int i = 0; i < 16; ++i) tag.push_back(hex[generator() & 15]);
    return tag;
}

class envd_command final : public exec_stream::impl, public process::impl {
  public:
    envd_command(state_ptr s, http::response response, const exec_request& request, std::string tag)
        : s_(std::move(s)),
          response_(std::move(response)),
          decoder_(s_->options.max_frame_bytes),
          tag_(std::move(tag)),
          wall_limit_(request.wall_limit),
          resident_(request.resident) {}

    ~envd_command() override {
        // A resident outlives its handle: envd keeps a process whose stream closed running, and
        // it ends by itself, at its Connect-Timeout-Ms or with the sandbox.
        if (finished_ || resident_) return;
        // Dropped before its end: the command dies with its stream, as a local one does.
        if (s_->tasks) s_->tasks->spawn(async_kill_task(s_, tag_));
    }

    std::uint64_t id() const override { return pid_; }
    int pid() const override { return static_cast<int>(pid_); }

    // The first message: the start event with the pid. Bounded by `limit`.
    asio::awaitable<result<void>> async_await_start(deadline limit);

    asio::awaitable<result<item>> async_next() override;
    asio::awaitable<result<void>> async_write_stdin(std::string data) override;
    asio::awaitable<result<void>> async_close_stdin() override;
    asio::awaitable<result<void>> async_signal(int signal) override;

    // Ends the command (kill, confirm) and returns the error for `why`: cancelled, or
    // backend_failure when the end was not confirmed. For callers that saw a cancellation.
    asio::awaitable<error> async_abort(errc why, std::string what);

  private:
    asio::awaitable<result<item>> next();
    asio::awaitable<result<connect::envelope>> next_envelope(deadline limit);
    asio::awaitable<result<item>> end_of_stream(const std::string& payload);
    asio::awaitable<result<item>> wall_limit_passed();
    asio::awaitable<result<item>> fail(error e);
    asio::awaitable<bool> kill_and_confirm();
    void forget() {
        finished_ = true;
        s_->live.erase(tag_);
    }
    std::chrono::microseconds elapsed() const {
        return std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - started_);
    }

    state_ptr s_;
    std::optional<http::response> response_;
    connect::envelope_decoder decoder_;
    std::deque<connect::envelope> pending_;
    std::string tag_;
    std::uint32_t pid_ = 0;
    std::chrono::milliseconds wall_limit_;
    bool resident_ = false;  // exec_request::resident: not killed when dropped
    steady::time_point started_ = steady::now();
    std::optional<exec_result> end_;
    bool finished_ = false;
};

asio::awaitable<result<connect::envelope>> envd_command::next_envelope(deadline limit) {
    while (pending_.empty()) {
        if (!response_)
            co_return make_error(errc::backend_failure, "the command's stream is closed");
        std::optional<result<std::string_view>> piece;
        if (limit.is_never()) {
            auto read = co_await response_->async_read_some();
            piece.emplace(std::move(read));
        } else {
            auto op = response_->async_read_some();
            auto read = co_await with_timeout(std::move(op), limit);
            piece.emplace(std::move(read));
        }
        if (!*piece) co_return std::move(*piece).error();
        if ((*piece)->empty()) {
            auto finished = decoder_.finish();
            if (!finished) co_return std::move(finished).error();
            co_return make_error(errc::protocol_error,
                                 "envd's stream ended without its end-stream message");
        }
        std::vector<connect::envelope> out;
        auto fed = decoder_.feed(**piece, out);
        if (!fed) co_return std::move(fed).error();
        for (auto& e : out) pending_.push_back(std::move(e));
    }
    auto e = std::move(pending_.front());
    pending_.pop_front();
    co_return e;
}

asio::awaitable<result<void>> envd_command::async_await_start(deadline limit) {
    auto first = co_await next_envelope(limit);
    if (!first) {
        auto e = std::move(first).error();
        if (e.code == errc::deadline_exceeded) {
            e = make_error(errc::backend_failure,
                           "envd did not report the command's start within " +
                               std::to_string(s_->options.request_timeout.count()) + " ms");
        }
        co_return e;
    }
    if (first->is_end_stream()) {
        forget();  // envd refused it: nothing runs
        auto end = connect::parse_end_stream(first->payload);
        if (!end) co_return std::move(end).error();
        if (!end->error)
            co_return make_error(errc::protocol_error,
                                 "envd ended the stream before the start event");
        auto e = connect::to_error(*end->error);
        if (end->error->code == connect::code::unavailable)
            e.code = make_error_code(errc::sandbox_unavailable);
        e.detail = "process.Process/Start: " + e.detail;
        co_return e;
    }
    auto event = parse_process_event(first->payload);
    if (!event) co_return std::move(event).error();
    const auto* start = std::get_if<start_event>(&*event);
    if (!start)
        co_return make_error(errc::protocol_error, "envd's first event is not the start event");
    pid_ = start->pid;
    started_ = steady::now();
    co_return result<void>{};
}

asio::awaitable<result<item>> envd_command::async_next() {
    std::exception_ptr failure;
    try {
        co_return co_await next();
    } catch (...) {
        failure = std::current_exception();
    }
    // Asio threw at a co_await (a cancellation that arrived between steps): end the command as
    // for any cancellation. No co_await in the handler above.
    co_await asio::this_coro::reset_cancellation_state();
    auto e = error_from_exception(failure);
    if (finished_) co_return e;
    if (e.code == errc::cancelled) co_return co_await async_abort(errc::cancelled, "");
    co_return co_await fail(std::move(e));
}

asio::awaitable<result<item>> envd_command::next() {
    if (finished_)
        co_return make_error(errc::invalid_argument, "the exec stream has already ended");
    for (;;) {
        const auto forever = deadline::never();
        auto envelope = co_await next_envelope(forever);
        if (!envelope) {
            auto e = std::move(envelope).error();
            // Reset in place: awaiting the cleanup coroutine would throw while it is set.
            co_await asio::this_coro::reset_cancellation_state();
            if (e.code == errc::cancelled) co_return co_await async_abort(errc::cancelled, "");
            // The request's own limit (the wall limit plus slack): the server kept it running.
            if (e.code == errc::deadline_exceeded) co_return co_await wall_limit_passed();
            co_return co_await fail(std::move(e));
        }
        if (envelope->is_end_stream()) co_return co_await end_of_stream(envelope->payload);
        auto event = parse_process_event(envelope->payload);
        if (!event) co_return co_await fail(std::move(event).error());
        if (auto* data = std::get_if<data_event>(&*event)) {
            if (data->bytes.empty()) continue;
            co_return item{output_chunk{data->channel, std::move(data->bytes)}};
        }
        if (auto* end = std::get_if<end_event>(&*event)) {
            if (end_)
                co_return co_await fail(
                    make_error(errc::protocol_error, "envd sent two end events"));
            end_ = protocol::result_from_end(*end);
            end_->duration = elapsed();
            // envd killed it at its Connect-Timeout-Ms and still reported the end.
            if (end_->signal == SIGKILL && end_->duration >= wall_limit_) {
                end_->timed_out = true;
                end_->exit_code = 124;
            }
            continue;
        }
        if (std::holds_alternative<start_event>(*event))
            co_return co_await fail(
                make_error(errc::protocol_error, "envd sent a second start event"));
        // keepalive
    }
}

asio::awaitable<result<item>> envd_command::end_of_stream(const std::string& payload) {
    auto end = connect::parse_end_stream(payload);
    if (!end) co_return co_await fail(std::move(end).error());
    if (end_) {
        forget();
        response_.reset();
        co_return item{std::move(*end_)};
    }
    if (end->error) {
        // envd's answer to a process that outlived the request's Connect-Timeout-Ms.
        if (end->error->code == connect::code::deadline_exceeded)
            co_return co_await wall_limit_passed();
        auto e = connect::to_error(*end->error);
        if (end->error->code == connect::code::unavailable)
            e.code = make_error_code(errc::sandbox_unavailable);
        e.detail = "process.Process/Start: " + e.detail;
        co_return co_await fail(std::move(e));
    }
    co_return co_await fail(
        make_error(errc::protocol_error, "envd ended the stream without the process's end event"));
}

asio::awaitable<bool> envd_command::kill_and_confirm() {
    response_.reset();  // closes the stream's connection (it is not reused)
    finished_ = true;
    const auto grace = deadline::after(s_->options.kill_grace);
    const bool confirmed = co_await async_kill_and_confirm(s_, tag_, grace);
    s_->live.erase(tag_);
    co_return confirmed;
}

asio::awaitable<result<item>> envd_command::wall_limit_passed() {
    co_await asio::this_coro::reset_cancellation_state();
    const auto duration = elapsed();
    const bool confirmed = co_await kill_and_confirm();
    if (!confirmed) {
        co_return make_error(errc::backend_failure,
                             "the command outlived its wall limit of " +
                                 std::to_string(wall_limit_.count()) +
                                 " ms and was killed, but its end was not confirmed within " +
                                 std::to_string(s_->options.kill_grace.count()) + " ms");
    }
    exec_result r;
    r.timed_out = true;
    r.exit_code = 124;
    r.signal = SIGKILL;
    r.duration = duration;
    co_return item{std::move(r)};
}

asio::awaitable<error> envd_command::async_abort(errc why, std::string what) {
    co_await asio::this_coro::reset_cancellation_state();
    const bool confirmed = co_await kill_and_confirm();
    if (!confirmed) {
        co_return make_error(errc::backend_failure,
                             "the command was killed but its end was not confirmed within " +
                                 std::to_string(s_->options.kill_grace.count()) + " ms");
    }
    if (what.empty()) what = "the command was killed";
    co_return make_error(why, std::move(what));
}

asio::awaitable<result<item>> envd_command::fail(error e) {
    // The stream broke (or lied): kill what it ran, then report why. Whether the kill was
    // confirmed, the stream's failure is the answer (the layer above stops vouching).
    co_await asio::this_coro::reset_cancellation_state();
    (void)co_await kill_and_confirm();
    co_return e;
}

asio::awaitable<result<void>> envd_command::async_write_stdin(std::string data) {
    std::size_t offset = 0;
    while (offset < data.size()) {
        const auto n = std::min(stdin_chunk_bytes, data.size() - offset);
        protocol::send_input_request input;
        input.process.pid = pid_;
        input.bytes = data.substr(offset, n);
        auto json = protocol::encode_send_input_request(input);
        const auto limit = deadline::after(s_->options.request_timeout);
        auto sent = co_await async_unary(s_, "process.Process/SendInput", std::move(json), limit);
        if (!sent) {
            auto e = std::move(sent).error();
            // envd: stdin closed or never opened (internal), or the process gone (not_found).
            if (e.code == errc::backend_failure && e.detail.find("stdin") != std::string::npos)
                e.code = make_error_code(errc::invalid_argument);
            if (e.code == errc::file_not_found) e.code = make_error_code(errc::invalid_argument);
            co_return e;
        }
        offset += n;
    }
    co_return result<void>{};
}

asio::awaitable<result<void>> envd_command::async_close_stdin() {
    protocol::process_selector selector;
    selector.pid = pid_;
    auto json = protocol::encode_selector_request(selector);
    const auto limit = deadline::after(s_->options.request_timeout);
    auto closed = co_await async_unary(s_, "process.Process/CloseStdin", std::move(json), limit);
    if (!closed && closed.error().code == errc::file_not_found) co_return result<void>{};
    if (!closed) co_return std::move(closed).error();
    co_return result<void>{};
}

asio::awaitable<result<void>> envd_command::async_signal(int signal) {
    auto sent = co_await async_send_signal(s_, pid_, signal);
    if (!sent && sent.error().code == errc::file_not_found) co_return result<void>{};  // ended
    if (!sent) co_return std::move(sent).error();
    co_return result<void>{};
}

result<exec_request> checked(exec_request request, std::chrono::milliseconds ceiling) {
    if (request.argv.empty()) {
        if (request.shell.empty())
            return make_error(errc::invalid_argument, "the command is empty");
        request.argv = {"/bin/sh", "-c", request.shell};
    }
    if (request.argv.front().empty()) return make_error(errc::invalid_argument, "argv[0] is empty");
    if (request.wall_limit.count() <= 0 || request.wall_limit > ceiling) {
        return make_error(errc::invalid_argument,
                          "wall_limit must be between 1 ms and " + std::to_string(ceiling.count()) +
                              " ms, got " + std::to_string(request.wall_limit.count()) + " ms");
    }
    if (!request.cwd.empty() && request.cwd.front() != '/')
        return make_error(errc::invalid_argument, "cwd must be an absolute path: " + request.cwd);
    return request;
}

asio::cancellation_type ignore_cancellation(asio::cancellation_type) {
    return asio::cancellation_type::none;
}

// A Start request in flight, shared by the caller and the task that sends it.
struct pending_start {
    explicit pending_start(asio::any_io_executor executor) : done(std::move(executor)) {}
    async_event done;  // set once `sent` holds envd's answer (or the send's error)
    std::optional<result<http::response>> sent;
    bool abandoned = false;  // the caller gave up waiting: the task kills the command
};

asio::awaitable<void> send_start(state_ptr s, http::request request, deadline head_limit,
                                 std::shared_ptr<pending_start> pending, std::string tag) {
    co_await asio::this_coro::reset_cancellation_state(ignore_cancellation);
    auto sent = co_await async_send_within(s, std::move(request), head_limit);
    pending->sent.emplace(std::move(sent));
    pending->done.set();
    if (!pending->abandoned) co_return;
    pending->sent.reset();
    const auto grace = deadline::after(s->options.kill_grace);
    (void)co_await async_kill_and_confirm(s, tag, grace);
    s->live.erase(tag);
}

// Sends Start and reads its start event. The command is followed from then on.
asio::awaitable<result<std::unique_ptr<envd_command>>> start(state_ptr s, exec_request request,
                                                             bool stdin_open) {
    auto executor = co_await asio::this_coro::executor;
    s->bind(executor);
    const std::string tag = new_tag();
    protocol::start_request start;
    start.process.cmd = request.argv.front();
    start.process.args.assign(request.argv.begin() + 1, request.argv.end());
    start.process.envs = request.env;
    start.process.cwd = request.cwd;
    start.tag = tag;
    start.stdin_open = stdin_open;
    auto body = protocol::encode_start_request(start);
    auto http_request = envd_request(*s, "POST", "/process.Process/Start");
    // Open as long as the command runs: the stream budget, so that its kill and the Process/List
    // that confirms it (short calls) never wait behind running commands.
    http_request.is_stream = true;
    http_request.headers.add("Content-Type", "application/connect+json");
    http_request.headers.add("Connect-Protocol-Version", "1");
    http_request.headers.add("Connect-Timeout-Ms", std::to_string(request.wall_limit.count()));
    const auto keepalive =
        std::chrono::duration_cast<std::chrono::seconds>(s->options.keepalive_interval);
    http_request.headers.add("Keepalive-Ping-Interval",
                             std::to_string(std::max<long>(1, keepalive.count())));
    // The user envd runs it as: root when asked (exec_request::as_root), else the endpoint's.
    std::string user = s->endpoint.user;
    if (request.as_root) user = "root";
    if (!user.empty())
        http_request.headers.add("Authorization", "Basic " + base64_encode(user + ":"));
    http_request.body = connect::encode_envelope(0, body);
    // The whole exchange (body reads included) ends a little after the wall limit: the client's
    // own enforcement of it.
    http_request.limit = deadline::after(request.wall_limit + wall_slack);
    s->live.insert(tag);
    const auto head_limit = deadline::after(s->options.request_timeout);
    // The send runs as a task that ignores cancellation: once the request may have reached envd
    // the command may be starting, and only envd's answer says when it is in Process/List. A
    // cancellation waits (up to kill_grace) for that answer, then kills by tag and confirms.
    auto pending = std::make_shared<pending_start>(executor);
    s->tasks->spawn(send_start(s, std::move(http_request), head_limit, pending, tag));
    const auto forever = deadline::never();  // the task is bounded by head_limit
    const auto waited = co_await pending->done.async_wait(forever);
    if (waited == async_event::wait_outcome::cancelled) {
        // async_wait reset the cancellation state: the cleanup below can await.
        const auto grace = deadline::after(s->options.kill_grace);
        if (!pending->done.is_set()) (void)co_await pending->done.async_wait(grace);
        if (!pending->done.is_set()) {
            pending->abandoned = true;  // the task kills it once envd answers
            co_return make_error(errc::backend_failure,
                                 "process.Process/Start was cancelled and envd did not answer "
                                 "within " +
                                     std::to_string(s->options.kill_grace.count()) +
                                     " ms; the command is killed once it does");
        }
        pending->sent.reset();  // closes the stream, if there is one
        const bool confirmed = co_await async_kill_and_confirm(s, tag, grace);
        s->live.erase(tag);
        if (!confirmed) {
            co_return make_error(errc::backend_failure,
                                 "process.Process/Start was cancelled and the command was not "
                                 "confirmed gone within " +
                                     std::to_string(s->options.kill_grace.count()) + " ms");
        }
        co_return make_error(errc::cancelled, "the command was killed as it started");
    }
    auto sent = std::move(*pending->sent);
    pending->sent.reset();
    if (!sent) {
        auto e = std::move(sent).error();
        // The request may have reached envd, which may have started the command.
        s->tasks->spawn(async_kill_task(s, tag));
        if (e.code == errc::deadline_exceeded)
            e = make_error(errc::backend_failure,
                           "envd did not answer Start within " +
                               std::to_string(s->options.request_timeout.count()) + " ms");
        e.detail = "process.Process/Start: " + e.detail;
        co_return e;
    }
    if (sent->status() != 200) {
        const int status = sent->status();
        auto text = co_await sent->async_read_body(max_unary_reply_bytes);
        s->live.erase(tag);
        std::string reply;
        if (text) reply = std::move(*text);
        if (status == 502) co_return envd_http_error(status, reply, "process.Process/Start");
        auto e = connect::to_error(connect::parse_unary_error(status, reply));
        e.detail = "process.Process/Start: " + e.detail;
        co_return e;
    }
    const auto type = sent->headers().find("Content-Type");
    if (!type || !http::iequals(type->substr(0, type->find(';')), "application/connect+json")) {
        s->live.erase(tag);
        co_return make_error(errc::protocol_error,
                             "process.Process/Start: envd's reply is not application/connect+json");
    }
    auto command = std::make_unique<envd_command>(s, std::move(*sent), request, tag);
    auto started = co_await command->async_await_start(head_limit);
    if (!started) {
        auto e = std::move(started).error();
        if (e.code == errc::cancelled) {
            co_await asio::this_coro::reset_cancellation_state();
            auto aborted = co_await command->async_abort(errc::cancelled, "");
            co_return aborted;
        }
        co_return e;  // the command's destructor kills whatever may have started
    }
    co_return std::move(command);
}

}  // namespace

asio::awaitable<result<exec_stream>> async_start_exec_stream(state_ptr s, exec_request request) {
    auto valid = checked(std::move(request), exec_request::max_wall_limit);
    if (!valid) co_return std::move(valid).error();
    const bool has_stdin = !valid->stdin_data.empty();
    const std::string input = valid->stdin_data;
    auto command = co_await start(s, std::move(*valid), has_stdin);
    if (!command) co_return std::move(command).error();
    if (has_stdin) {
        auto written = co_await (*command)->async_write_stdin(input);
        if (!written && written.error().code == errc::cancelled) {
            co_await asio::this_coro::reset_cancellation_state();
            auto aborted = co_await (*command)->async_abort(errc::cancelled, "");
            co_return aborted;
        }
        // A program that stops reading its stdin early is its business (a broken pipe).
        auto closed = co_await (*command)->async_close_stdin();
        if (!closed && closed.error().code == errc::cancelled) {
            co_await asio::this_coro::reset_cancellation_state();
            auto aborted = co_await (*command)->async_abort(errc::cancelled, "");
            co_return aborted;
        }
    }
    std::unique_ptr<exec_stream::impl> impl = std::move(*command);
    co_return exec_stream(std::move(impl));
}

asio::awaitable<result<process>> async_start_process(state_ptr s, exec_request request) {
    auto valid = checked(std::move(request), exec_request::max_spawn_wall_limit);
    if (!valid) co_return std::move(valid).error();
    const std::string input = valid->stdin_data;
    auto command = co_await start(s, std::move(*valid), true);
    if (!command) co_return std::move(command).error();
    if (!input.empty()) {
        auto written = co_await (*command)->async_write_stdin(input);
        if (!written) co_return std::move(written).error();
    }
    std::unique_ptr<process::impl> impl = std::move(*command);
    co_return process(std::move(impl));
}

}  // namespace moat::e2b
