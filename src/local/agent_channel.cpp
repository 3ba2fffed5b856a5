#include "local/agent_channel.hpp"

#include <moat/log.hpp>

#include <cerrno>
#include <cstring>

namespace moat {
namespace {

// The agent's largest record is `exited`; anything bigger is a protocol violation.
constexpr std::size_t max_agent_record = 256;
static_assert(sizeof(wire::exited_message) <= max_agent_record);

}  // namespace

struct agent_channel::attach_request {
    explicit attach_request(const asio::any_io_executor& ex) : answered(ex) {}
    async_event answered;
    int attach_errno = 0;
    terminal_attachment answer;
};

struct agent_channel::port_request {
    explicit port_request(const asio::any_io_executor& ex) : answered(ex) {}
    async_event answered;
    port_socket answer;
    std::int32_t watch_descriptor = -1;  // watch_added
};

asio::awaitable<void> run_agent_reader(std::shared_ptr<agent_channel> self) {
    co_await self->read_loop();
}

agent_channel::agent_channel(const asio::any_io_executor& executor, unique_fd control,
                             std::string sandbox_id)
    : executor_(executor),
      channel_(executor, std::move(control), max_agent_record),
      sandbox_id_(std::move(sandbox_id)),
      ready_(executor) {}

void agent_channel::start(task_group& tasks) {
    tasks.spawn(run_agent_reader(shared_from_this()));
}

asio::awaitable<result<void>> agent_channel::async_wait_ready(deadline limit) {
    const auto outcome = co_await ready_.async_wait(limit);
    if (broken_) co_return make_error(errc::backend_failure, "sandbox agent: " + *broken_);
    if (outcome == async_event::wait_outcome::set) co_return result<void>{};
    if (outcome == async_event::wait_outcome::cancelled) {
        co_return make_error(errc::cancelled, "cancelled while the sandbox agent started");
    }
    co_return make_error(errc::backend_failure, "the sandbox agent did not report ready in time");
}

asio::awaitable<result<std::shared_ptr<command_state>>> agent_channel::async_exec(
    std::uint64_t exec_id, std::span<const std::byte> record, std::span<const int> stdio,
    deadline limit) {
    if (broken_) co_return make_error(errc::sandbox_unavailable, *broken_);
    auto state = std::make_shared<command_state>(executor_);
    state->terminal = stdio.empty();
    commands_[exec_id] = state;
    auto sent = co_await channel_.async_send(record, stdio, limit);
    if (!sent) {
        commands_.erase(exec_id);
        co_return std::move(sent).error();
    }
    co_return state;
}

asio::awaitable<result<void>> agent_channel::async_set_ttl(std::chrono::milliseconds ttl,
                                                           deadline limit) {
    auto message = wire::make_message<wire::set_ttl_message>(wire::message_type::set_ttl);
    message.request_id = next_ttl_request_++;
    message.ttl_ms = static_cast<std::uint64_t>(ttl.count());
    const auto bytes = std::as_bytes(std::span(&message, 1));
    co_return co_await async_confirmed(bytes, message.request_id, "TTL change", limit);
}

asio::awaitable<result<void>> agent_channel::async_set_paused(bool paused,
                                                              std::chrono::milliseconds ttl,
                                                              deadline limit) {
    auto message = wire::make_message<wire::set_paused_message>(wire::message_type::set_paused);
    message.request_id = next_ttl_request_++;
    message.ttl_ms = static_cast<std::uint64_t>(ttl.count());
    message.paused = paused ? 1 : 0;
    const auto bytes = std::as_bytes(std::span(&message, 1));
    const char* what = paused ? "pause" : "resume";
    co_return co_await async_confirmed(bytes, message.request_id, what, limit);
}

asio::awaitable<result<void>> agent_channel::async_confirmed(std::span<const std::byte> bytes,
                                                             std::uint64_t request_id,
                                                             const char* what, deadline limit) {
    if (broken_) co_return make_error(errc::sandbox_unavailable, *broken_);
    auto confirmed = std::make_shared<async_event>(executor_);
    ttl_requests_[request_id] = confirmed;
    const std::span<const int> no_descriptors;  // a named local (g++ 12)
    auto sent = co_await channel_.async_send(bytes, no_descriptors, limit);
    // Once sent, the change happens whatever the caller does: wait for its confirmation (not
    // cancellable) so the answer says what the sandbox will do.
    while (sent && !confirmed->is_set() && !limit.has_expired()) {
        co_await confirmed->async_wait(limit);
    }
    ttl_requests_.erase(request_id);
    if (broken_) co_return make_error(errc::sandbox_unavailable, *broken_);
    if (!sent) co_return sent;
    if (!confirmed->is_set()) {
        co_return make_error(errc::backend_failure, std::string("the ") + what +
                                                        " was sent but the sandbox agent did "
                                                        "not confirm it");
    }
    co_return result<void>{};
}

asio::awaitable<result<agent_channel::port_socket>> agent_channel::async_connect_port(
    std::uint16_t port, int family, deadline limit) {
    auto message = wire::make_message<wire::connect_port_message>(wire::message_type::connect_port);
    message.request_id = next_ttl_request_++;
    message.port = port;
    message.family = static_cast<std::uint32_t>(family);
    const auto bytes = std::as_bytes(std::span(&message, 1));
    auto answer = co_await request_connection(bytes, message.request_id,
                                              "port " + std::to_string(port), limit);
    co_return answer;
}

asio::awaitable<result<agent_channel::port_socket>> agent_channel::async_connect_unix(
    std::string_view path, deadline limit) {
    auto message = wire::make_message<wire::connect_unix_message>(wire::message_type::connect_unix);
    message.request_id = next_ttl_request_++;
    wire::copy_field(message.path, path);
    const auto bytes = std::as_bytes(std::span(&message, 1));
    auto answer = co_await request_connection(bytes, message.request_id,
                                              "unix socket " + std::string(path), limit);
    co_return answer;
}

asio::awaitable<agent_channel::awaited> agent_channel::send_and_await(
    std::span<const std::byte> message, std::span<const int> attach, async_event& answered,
    deadline limit) {
    awaited out;
    out.sent = co_await channel_.async_send(message, attach, limit);
    if (out.sent) {
        const auto outcome = co_await answered.async_wait(limit);
        out.cancelled = outcome == async_event::wait_outcome::cancelled;
    }
    co_return out;
}

std::optional<error> agent_channel::unanswered(const awaited& a, const async_event& answered,
                                               std::string_view doing,
                                               std::string_view request) const {
    if (broken_) return make_error(errc::sandbox_unavailable, *broken_);
    if (!a.sent) return a.sent.error();
    if (a.cancelled) return make_error(errc::cancelled, "cancelled while " + std::string(doing));
    if (answered.is_set()) return std::nullopt;
    return make_error(errc::backend_failure,
                      "the sandbox agent did not answer " + std::string(request) + " in time");
}

asio::awaitable<result<std::shared_ptr<agent_channel::port_request>>>
agent_channel::request_descriptor(std::span<const std::byte> message, std::span<const int> attach,
                                  std::uint64_t request_id, std::string what, deadline limit) {
    if (broken_) co_return make_error(errc::sandbox_unavailable, *broken_);
    auto request = std::make_shared<port_request>(executor_);
    port_requests_[request_id] = request;
    auto waited = co_await send_and_await(message, attach, request->answered, limit);
    port_requests_.erase(request_id);
    if (auto failed = unanswered(waited, request->answered, what + " in the sandbox", what)) {
        co_return std::move(*failed);
    }
    co_return request;
}

asio::awaitable<result<agent_channel::port_socket>> agent_channel::request_connection(
    std::span<const std::byte> message, std::uint64_t request_id, std::string what,
    deadline limit) {
    const std::span<const int> no_descriptors;  // named locals (g++ 12)
    std::string doing = "connecting to " + what;
    auto answered =
        co_await request_descriptor(message, no_descriptors, request_id, std::move(doing), limit);
    if (!answered) co_return std::move(answered).error();
    co_return std::move((*answered)->answer);
}

asio::awaitable<result<agent_channel::watch_answer>> agent_channel::async_watch_dir(
    std::string_view base, std::string_view relative, std::uint32_t mask, int instance,
    deadline limit) {
    const std::uint64_t request_id = next_ttl_request_++;
    std::vector<std::byte> message;
    if (!wire::encode_watch_dir(request_id, mask, base, relative, message)) {
        co_return make_error(errc::invalid_path, "the path is too long to watch");
    }
    const int attached[1] = {instance};
    std::span<const int> attach;
    if (instance >= 0) attach = attached;
    std::string doing = "watching a directory";  // a named local (g++ 12)
    auto answered =
        co_await request_descriptor(message, attach, request_id, std::move(doing), limit);
    if (!answered) co_return std::move(answered).error();
    watch_answer out;
    out.instance = std::move((*answered)->answer.socket);
    out.watch_errno = (*answered)->answer.connect_errno;
    out.watch_descriptor = (*answered)->watch_descriptor;
    co_return out;
}

void agent_channel::on_broken(std::weak_ptr<void> owner,
                              std::function<void(const std::string&)> on_end) {
    if (broken_) return on_end(*broken_);
    std::erase_if(on_broken_, [](const broken_observer& o) { return o.owner.expired(); });
    on_broken_.push_back({std::move(owner), std::move(on_end)});
}

asio::awaitable<result<agent_channel::terminal_attachment>> agent_channel::async_attach_terminal(
    std::uint64_t exec_id, int pid, deadline limit) {
    if (broken_) co_return make_error(errc::sandbox_unavailable, *broken_);
    auto message = wire::make_message<wire::pty_attach_message>(wire::message_type::pty_attach);
    message.exec_id = exec_id;
    message.pid = pid;
    auto request = std::make_shared<attach_request>(executor_);
    attach_requests_[exec_id] = request;
    const auto bytes = std::as_bytes(std::span(&message, 1));
    const std::span<const int> no_descriptors;  // a named local (g++ 12)
    auto waited = co_await send_and_await(bytes, no_descriptors, request->answered, limit);
    attach_requests_.erase(exec_id);
    const std::string what = "the terminal of pid " + std::to_string(pid);
    // An answer that comes later is dropped; an attachment made meanwhile is forgotten at the
    // command's exit (release), and its master closed here.
    if (auto failed =
            unanswered(waited, request->answered, "attaching to " + what, "an attach to " + what)) {
        if (request->answered.is_set() && request->attach_errno == 0) release(exec_id);
        co_return std::move(*failed);
    }
    switch (request->attach_errno) {
        case 0:
            co_return std::move(request->answer);
        case ESRCH:
            co_return make_error(
                errc::invalid_argument,
                "no terminal command with pid " + std::to_string(pid) + " runs in the sandbox");
        case EMFILE:
            co_return make_error(errc::limit_exceeded,
                                 "no file descriptor free to attach to " + what);
        default:
            co_return make_error(errc::backend_failure, "attaching to " + what + ": " +
                                                            std::strerror(request->attach_errno));
    }
}

result<void> agent_channel::kill(std::uint64_t exec_id, int signal) {
    if (broken_) return make_error(errc::sandbox_unavailable, *broken_);
    auto message = wire::make_message<wire::kill_message>(wire::message_type::kill);
    message.exec_id = exec_id;
    message.signal = signal;
    return channel_.try_send(std::as_bytes(std::span(&message, 1)));
}

void agent_channel::release(std::uint64_t exec_id) {
    auto it = commands_.find(exec_id);
    if (it == commands_.end()) return;
    if (it->second->exit || broken_) {
        commands_.erase(it);
    } else {
        it->second->abandoned = true;
    }
}

unique_fd agent_channel::take_egress_listener() {
    return std::move(egress_listener_);
}

void agent_channel::close() {
    channel_.close();
    // Our own decision (destroy, detach, shutdown): the normal end, not worth a warning.
    break_channel("the control socket was closed", log_level::debug);
}

asio::awaitable<void> agent_channel::read_loop() {
    auto self = shared_from_this();
    while (!broken_) {
        auto record = co_await channel_.async_receive();
        if (!record) {
            break_channel(record.error().to_string());
        } else if (record->data.empty()) {
            break_channel("the sandbox's pid 1 exited");
        } else {
            dispatch(*record);
        }
    }
}

template <class Message>
agent_channel::command_map::iterator agent_channel::command_of(const received_record& record,
                                                               wire::message_type type,
                                                               Message& m) {
    if (!wire::read_fixed(record.data, type, m)) return commands_.end();
    return commands_.find(m.exec_id);
}

void agent_channel::dispatch(received_record& record) {
    wire::header h{};
    if (!wire::read_header(record.data, h))
        return break_channel("protocol error: malformed record");
    // Only `ready` may carry a descriptor: the egress listener, exactly when it names a port.
    if (h.type == static_cast<std::uint32_t>(wire::message_type::ready)) {
        wire::ready_message m{};
        if (!wire::read_fixed(record.data, wire::message_type::ready, m) ||
            m.version != wire::protocol_version || ready_.is_set() || record.descriptors_lost ||
            m.egress_port > 65535 || record.fds.size() != (m.egress_port != 0 ? 1u : 0u)) {
            return break_channel("protocol error: bad ready record");
        }
        if (m.egress_port != 0) {
            egress_port_ = static_cast<std::uint16_t>(m.egress_port);
            egress_listener_ = std::move(record.fds.front());
        }
        ready_.set();
        return;
    }
    // port_connected carries the connected socket, exactly when the connect did not fail.
    if (h.type == static_cast<std::uint32_t>(wire::message_type::port_connected)) {
        wire::port_connected_message m{};
        auto it = port_requests_.end();
        if (wire::read_fixed(record.data, wire::message_type::port_connected, m)) {
            it = port_requests_.find(m.request_id);
        }
        // A socket this process had no descriptor free for is lost (EMFILE), not a violation.
        const std::size_t expected = m.connect_errno == 0 && !record.descriptors_lost ? 1u : 0u;
        const bool valid = m.request_id != 0 && m.request_id < next_ttl_request_ &&
                           m.connect_errno >= 0 && record.fds.size() == expected &&
                           (!record.descriptors_lost || m.connect_errno == 0) &&
                           (m.flags & ~std::uint32_t{wire::port_connect_in_progress}) == 0;
        if (!valid) return break_channel("protocol error: bad port_connected record");
        // An answer whose waiter gave up is dropped, and with it the socket.
        if (it == port_requests_.end()) return;
        auto& answer = it->second->answer;
        answer.connect_errno = record.descriptors_lost ? EMFILE : m.connect_errno;
        answer.in_progress = (m.flags & wire::port_connect_in_progress) != 0;
        if (expected == 1) answer.socket = std::move(record.fds.front());
        it->second->answered.set();
        return;
    }
    if (h.type == static_cast<std::uint32_t>(wire::message_type::started)) {
        return dispatch_started(record);
    }
    if (h.type == static_cast<std::uint32_t>(wire::message_type::pty_attached)) {
        return dispatch_attached(record);
    }
    // watch_added carries the new inotify instance when the request attached none and it worked.
    if (h.type == static_cast<std::uint32_t>(wire::message_type::watch_added)) {
        wire::watch_added_message m{};
        auto it = port_requests_.end();
        if (wire::read_fixed(record.data, wire::message_type::watch_added, m)) {
            it = port_requests_.find(m.request_id);
        }
        const bool valid = m.request_id != 0 && m.request_id < next_ttl_request_ &&
                           m.watch_errno >= 0 && record.fds.size() <= 1 &&
                           (record.fds.empty() || m.watch_errno == 0) &&
                           (m.watch_errno != 0 || m.watch_descriptor >= 0);
        if (!valid) return break_channel("protocol error: bad watch_added record");
        if (it == port_requests_.end()) return;  // its waiter gave up
        auto& request = *it->second;
        request.answer.connect_errno = m.watch_errno;
        if (record.descriptors_lost && m.watch_errno == 0) request.answer.connect_errno = EMFILE;
        request.watch_descriptor = m.watch_descriptor;
        if (!record.fds.empty()) request.answer.socket = std::move(record.fds.front());
        request.answered.set();
        return;
    }
    if (!record.fds.empty() || record.descriptors_lost) {
        return break_channel("protocol error: the agent sent descriptors");
    }
    switch (static_cast<wire::message_type>(h.type)) {
        case wire::message_type::exited: {
            wire::exited_message m{};
            auto it = command_of(record, wire::message_type::exited, m);
            if (it == commands_.end() || it->second->exit) {
                return break_channel("protocol error: bad exited record");
            }
            it->second->exit = m;
            it->second->started.set();
            it->second->exited.set();
            if (it->second->abandoned) commands_.erase(it);
            return;
        }
        case wire::message_type::ttl_set:
        case wire::message_type::paused_set: {
            // The two replies have the same layout: a request id.
            static_assert(sizeof(wire::ttl_set_message) == sizeof(wire::paused_set_message));
            wire::ttl_set_message m{};
            if (!wire::read_fixed(record.data, wire::message_type::ttl_set, m)) {
                wire::paused_set_message p{};
                if (wire::read_fixed(record.data, wire::message_type::paused_set, p)) {
                    m.request_id = p.request_id;
                }
            }
            if (m.request_id == 0 || m.request_id >= next_ttl_request_) {
                return break_channel("protocol error: bad ttl_set or paused_set record");
            }
            // An answer whose waiter already gave up is harmless.
            if (auto it = ttl_requests_.find(m.request_id); it != ttl_requests_.end()) {
                it->second->set();
            }
            return;
        }
        default:
            return break_channel("protocol error: unexpected record type " +
                                 std::to_string(h.type));
    }
}

// `started` carries the master exactly when the command is a terminal (a master this process
// had no descriptor free for is lost, not a violation).
void agent_channel::dispatch_started(received_record& record) {
    wire::started_message m{};
    auto it = command_of(record, wire::message_type::started, m);
    if (it == commands_.end() || it->second->start) {
        return break_channel("protocol error: bad started record");
    }
    auto& state = *it->second;
    const std::size_t expected = state.terminal && !record.descriptors_lost ? 1u : 0u;
    if (record.fds.size() != expected || (record.descriptors_lost && !state.terminal)) {
        return break_channel("protocol error: bad started record");
    }
    if (expected == 1) state.master = std::move(record.fds.front());
    state.master_lost = record.descriptors_lost;
    state.start = m;
    state.started.set();
}

// pty_attached carries the master exactly when the attach succeeded; the command is registered
// under its exec id at once, since its `exited` may be the very next record.
void agent_channel::dispatch_attached(received_record& record) {
    wire::pty_attached_message m{};
    const bool read = wire::read_fixed(record.data, wire::message_type::pty_attached, m);
    const std::size_t expected = m.attach_errno == 0 && !record.descriptors_lost ? 1u : 0u;
    if (!read || m.attach_errno < 0 || record.fds.size() != expected ||
        (record.descriptors_lost && m.attach_errno != 0) || commands_.contains(m.exec_id)) {
        return break_channel("protocol error: bad pty_attached record");
    }
    auto it = attach_requests_.find(m.exec_id);
    auto state = std::make_shared<command_state>(executor_);
    state->terminal = true;
    if (m.attach_errno == 0) {
        // Attached in pid 1 (even if the master was lost here): its exit will come.
        state->abandoned = it == attach_requests_.end() || record.descriptors_lost;
        state->started.set();
        commands_[m.exec_id] = state;
    }
    if (it == attach_requests_.end()) return;
    it->second->attach_errno = record.descriptors_lost ? EMFILE : m.attach_errno;
    if (expected == 1) it->second->answer = {state, std::move(record.fds.front())};
    it->second->answered.set();
}

void agent_channel::break_channel(std::string reason, log_level level) {
    if (broken_) return;
    detail::log(level, "agent", reason, sandbox_id_);
    broken_ = std::move(reason);
    channel_.close();
    ready_.set();
    for (auto& [id, request] : ttl_requests_) request->set();
    for (auto& [id, request] : port_requests_) request->answered.set();
    for (auto& [id, request] : attach_requests_) request->answered.set();
    for (auto& [id, command] : commands_) {
        command->started.set();
        command->exited.set();
    }
    auto observers = std::exchange(on_broken_, {});
    for (auto& observer : observers) {
        if (!observer.owner.expired()) observer.on_end(*broken_);
    }
}

}  // namespace moat
