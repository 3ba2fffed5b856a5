// Wiring moat's tool layer into an agent loop: publish the tool definitions to the model, run the
// tool calls it makes, and hand each result's JSON back as the tool message.
//
// The model here is scripted (a few canned replies that react to what the tools return), so the
// example runs without network or API key; swap `next_step` for a call to your model's API. The
// shape of the loop is the part to copy: begin_turn() per user message, a bound on steps, one
// tool_session per conversation, async_end() when the conversation is over.
//
// Build: part of the moat build; run: build/dev/examples/agent_loop
#include <moat/local_backend.hpp>
#include <moat/session_manager.hpp>
#include <moat/tools.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

// What goes back and forth between the loop and the model.
struct message {
    std::string role;     // "user", "assistant", "tool"
    std::string content;  // text; for "tool", the result's JSON exactly as the model reads it
};

struct step {
    std::string tool;       // empty: a final answer in `text`
    std::string arguments;  // JSON object
    std::string text;
};

// Stand-in for the model: looks at the conversation and decides the next step.
step next_step(const std::vector<message>& history) {
    const message& last = history.back();
    if (last.role == "user") {
        return {
            "run_python",
            R"json({"code": "data = [3, 1, 4, 1, 5, 9, 2, 6]\nprint(sorted(data)[len(data) // 2])"})json",
            ""};
    }
    if (last.content.find("\"status\":\"ok\"") != std::string::npos &&
        last.content.find("mean") == std::string::npos) {
        // State persists: `data` from the previous call is still defined.
        return {"run_python",
                R"json({"code": "import statistics\nprint('mean', statistics.mean(data))"})json",
                ""};
    }
    return {"", "", "The median is 4 and the mean is 3.875 (computed in the sandbox)."};
}

asio::awaitable<int> conversation(moat::session_manager& sessions) {
    moat::tool_session tools(sessions, "conversation-1");
    // Publish these to the model API (name, description, JSON Schema): they describe this
    // session's sandboxes (their working and artifacts directories).
    for (const auto& tool : tools.definitions())
        std::printf("tool offered to the model: %s\n", tool.name.c_str());

    std::vector<message> history{{"user", "What are the median and mean of 3 1 4 1 5 9 2 6?"}};
    tools.begin_turn();  // one user message: the retry ceiling counts within it
    constexpr int max_steps = 8;
    int code = 1;
    for (int i = 0; i < max_steps; ++i) {
        const step s = next_step(history);
        if (s.tool.empty()) {
            std::printf("assistant: %s\n", s.text.c_str());
            code = 0;
            break;
        }
        // A caller's deadline for the whole tool call (queueing included); the program's own
        // limit is the timeout_seconds argument the model chose (default 30 s).
        const auto limit = moat::deadline::after(std::chrono::seconds(120));
        // The user may watch the program's output while it runs; the model reads the shaped
        // result once the call is done.
        moat::output_callback live = [](moat::output_channel, std::string_view data) {
            std::printf("  (live) %.*s", static_cast<int>(data.size()), data.data());
        };
        auto result = co_await tools.async_call(s.tool, s.arguments, limit, std::move(live));
        if (!result) {  // only our own cancellation or deadline ends up here
            std::fprintf(stderr, "tool call: %s\n", result.error().to_string().c_str());
            break;
        }
        if (const auto box = tools.current_sandbox(); box && i == 0) {
            std::printf("sandbox %s (host pid %d)\n", box->id.c_str(), box->host_pid.value_or(0));
        }
        const std::string json = result->to_json();
        std::printf("%s -> %s\n", s.tool.c_str(), json.c_str());
        history.push_back({"assistant", s.tool + " " + s.arguments});
        history.push_back({"tool", json});
    }
    auto ended = co_await tools.async_end();  // the conversation is over: destroy its sandbox
    if (!ended) code = 1;
    co_return code;
}

asio::awaitable<int> run(moat::session_manager& sessions) {
    const int code = co_await conversation(sessions);
    auto report = co_await sessions.async_shutdown();
    co_return report.left.empty() ? code : 1;
}

}  // namespace

int main() {
    asio::io_context io;
    auto local = moat::make_local_backend(io.get_executor());
    moat::runtime sandboxes(*local);
    moat::session_manager sessions(sandboxes, moat::manager_options{});
    int code = 1;
    asio::co_spawn(io, run(sessions), [&code, &io](std::exception_ptr failure, int value) {
        code = failure ? 1 : value;
        io.stop();
    });
    io.run_for(std::chrono::seconds(60));
    return code;
}
