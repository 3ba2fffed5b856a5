// A session's background processes (start_process, list_processes, read_process_output,
// stop_process): each runs in the session's sandbox under a pump that reads it to its end and
// keeps the latest of what it printed, and every one still running is killed when the session
// ends (tool_session_state.hpp).
#include "tools/tool_session_state.hpp"

#include "core/async_event.hpp"

#include <algorithm>
#include <csignal>

namespace moat {

namespace tool_detail {

// A background process (start_process), shared by the session and the pump that reads it.
struct background_entry {
    explicit background_entry(asio::any_io_executor executor) : ended(std::move(executor)) {}
    background_process info;
    process handle;
    std::size_t cap = 0;
    std::string out;  // the latest bytes: at most 2 * cap, of which the last cap are shown
    std::string err;
    async_event ended;
};

}  // namespace tool_detail

using tool_detail::background_entry;
using tool_detail::notice_rebuilt;
using tool_detail::sandbox_path;
using tool_detail::seconds_text;

namespace {

// Keeps the latest `cap` bytes of a stream in `kept`, trimming in amortized O(1) per byte.
void keep_latest(std::string& kept, std::string_view data, std::size_t cap) {
    if (data.size() >= cap) {
        kept.assign(data.substr(data.size() - cap));
        return;
    }
    kept.append(data);
    if (kept.size() > 2 * cap) kept.erase(0, kept.size() - cap);
}

// What a model sees of a kept stream: its last `cap` bytes, and how much came before them.
captured_output latest_output(const std::string& kept, std::size_t cap, std::uint64_t total) {
    captured_output c;
    const std::string_view shown =
        std::string_view(kept).substr(kept.size() - std::min(cap, kept.size()));
    c.total_bytes = total;
    if (shown.size() == total) {
        c.head = std::string(shown);
    } else {
        c.tail = std::string(shown);
        c.omitted_bytes = total - shown.size();
    }
    return c;
}

// Reads a background process to its end, so it never blocks on a full pipe. Cancellation (the
// session's end) kills it: the stream does that when its read is cancelled.
asio::awaitable<void> pump_background(std::shared_ptr<background_entry> entry) {
    for (;;) {
        auto next = co_await entry->handle.async_next();
        if (!next) break;  // the sandbox went away, or the session ended: it is gone
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            if (chunk->channel == output_channel::out) {
                entry->info.stdout_bytes += chunk->data.size();
                keep_latest(entry->out, chunk->data, entry->cap);
            } else {
                entry->info.stderr_bytes += chunk->data.size();
                keep_latest(entry->err, chunk->data, entry->cap);
            }
            continue;
        }
        const auto& ended = std::get<exec_result>(*next);
        entry->info.exit_code = ended.signal != 0 ? 128 + ended.signal : ended.exit_code;
        break;
    }
    entry->info.is_running = false;
    entry->ended.set();
}

// How long stop_process waits after SIGTERM, then after SIGKILL.
constexpr auto stop_grace = std::chrono::seconds(3);
constexpr std::size_t max_shown_command = 200;

}  // namespace

std::size_t tool_session::state::running_processes() const {
    return static_cast<std::size_t>(std::count_if(
        background.begin(), background.end(), [](const auto& e) { return e->info.is_running; }));
}

std::shared_ptr<background_entry> tool_session::state::find_process(int id) const {
    for (const auto& e : background)
        if (e->info.id == id) return e;
    return nullptr;
}

tool_result tool_session::state::unknown_process(const char* tool, int id) const {
    return bad_arguments(tool,
                         "id: no background process " + std::to_string(id) + " in this session",
                         "call " + named("list_processes") + " to see the ids");
}

asio::awaitable<result<tool_result>> tool_session::state::start_process(std::string command,
                                                                        std::string cwd,
                                                                        deadline limit) {
    const auto most = static_cast<std::size_t>(std::max(0, options.max_background_processes));
    if (running_processes() >= most) {
        co_return failed("start_process", tool_status::error,
                         "at most " + std::to_string(most) +
                             " background processes run at once in a session, and " +
                             std::to_string(running_processes()) + " are running",
                         "stop one with " + named("stop_process") + " (" + named("list_processes") +
                             " shows them)");
    }
    auto got = co_await lease(limit);
    if (!got) co_return failed_step("start_process", std::move(got).error());
    auto box = got->lease.box;
    exec_request request;
    request.argv = {"/bin/sh", "-c", command};
    request.cwd = sandbox_path(cwd.empty() ? layout.workdir : cwd, layout.workdir);
    request.wall_limit = exec_request::max_spawn_wall_limit;
    auto entry = std::make_shared<background_entry>(pumps.get_executor());
    entry->info.id = next_process_id;
    entry->info.command = command.substr(0, max_shown_command);
    entry->info.cwd = request.cwd;
    entry->cap = std::max<std::size_t>(1, options.background_output_bytes);
    auto spawned = co_await box->async_spawn(std::move(request), limit);
    if (!spawned) co_return failed_step("start_process", std::move(spawned).error());
    ++next_process_id;
    entry->handle = std::move(*spawned);
    pumps.spawn(pump_background(entry));
    // Bounded bookkeeping: the running ones plus the latest ended ones.
    while (background.size() >= 2 * most + 1) {
        const auto finished = std::find_if(background.begin(), background.end(),
                                           [](const auto& e) { return !e->info.is_running; });
        if (finished == background.end()) break;
        background.erase(finished);
    }
    background.push_back(entry);
    tool_result r;
    r.tool = "start_process";
    if (got->rebuilt) r.notices.emplace_back(notice_rebuilt);
    r.processes.push_back(entry->info);
    co_return r;
}

tool_result tool_session::state::list_processes() const {
    tool_result r;
    r.tool = "list_processes";
    for (const auto& e : background) r.processes.push_back(e->info);
    return r;
}

tool_result tool_session::state::read_process_output(int id) const {
    auto entry = find_process(id);
    if (!entry) return unknown_process("read_process_output", id);
    tool_result r;
    r.tool = "read_process_output";
    auto out = shape(latest_output(entry->out, entry->cap, entry->info.stdout_bytes));
    r.stdout_text = std::move(out.text);
    r.stdout_omitted = out.omitted_chars;
    set_stderr(r, shape(latest_output(entry->err, entry->cap, entry->info.stderr_bytes)));
    r.processes.push_back(entry->info);
    return r;
}

asio::awaitable<result<tool_result>> tool_session::state::stop_process(int id) {
    auto entry = find_process(id);
    if (!entry) co_return unknown_process("stop_process", id);
    // Cleanup is not cancellable and bounded: SIGTERM, a grace, SIGKILL, a grace.
    for (const int signal : {SIGTERM, SIGKILL}) {
        if (!entry->info.is_running) break;
        (void)co_await entry->handle.async_signal(signal);
        const auto grace = deadline::after(stop_grace);
        (void)co_await entry->ended.async_wait(grace);
    }
    tool_result r;
    r.tool = "stop_process";
    if (entry->info.is_running) {
        r.status = tool_status::error;
        r.message = "the process did not end within " + seconds_text(2 * stop_grace);
        r.hint = "call " + named("list_processes") + " later to see if it has ended";
    }
    r.processes.push_back(entry->info);
    co_return r;
}

asio::awaitable<void> tool_session::state::stop_background() {
    pumps.cancel_all();
    co_await pumps.async_wait_all();
}

}  // namespace moat
