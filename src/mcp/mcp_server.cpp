#include "mcp/mcp_server.hpp"

#include <moat/task_group.hpp>

#include "core/asio_compat.hpp"
#include "core/base64.hpp"
#include "core/json_writer.hpp"
#include "egress/network_policy.hpp"
#include "mcp/jsonrpc.hpp"
#include "tools/tool_arguments.hpp"

#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <unistd.h>
#include <array>
#include <cstdio>
#include <deque>
#include <map>

namespace moat::mcp {

namespace {

constexpr int method_not_found = -32601;
constexpr int invalid_params = -32602;
constexpr int internal_error = -32603;
constexpr int message_too_large = -32600;

// Protocol revisions this server speaks, newest first.
constexpr std::array<std::string_view, 3> protocol_versions = {"2025-06-18", "2025-03-26",
                                                               "2024-11-05"};
constexpr std::string_view artifact_scheme = "moat://artifacts/";
constexpr std::string_view workspace_scheme = "moat://workspace/";
// What a progress notification carries of a running call's output: its last lines, this many
// at most, and at most this many characters of them.
constexpr std::size_t progress_lines = 10;
constexpr std::size_t progress_bytes_kept = 4096;
// At the end, responses still queued are written while the client keeps taking them, and given
// up after this long without progress.
constexpr auto flush_stall = std::chrono::seconds(2);

using clock = std::chrono::steady_clock;

// An id as parse_jsonrpc writes it, from a field that holds one (notifications/cancelled).
std::optional<std::string> id_field(std::string_view params, std::string_view name) {
    if (auto text = string_field(params, name)) {
        std::string out;
        append_json_string(out, *text);
        return out;
    }
    return raw_field(params, name);
}

std::string tools_list_json(const std::vector<tool_definition>& tools) {
    std::string out = R"({"tools":[)";
    bool first = true;
    for (const auto& tool : tools) {
        if (!first) out += ',';
        first = false;
        out += R"({"name":)";
        append_json_string(out, tool.name);
        out += R"(,"description":)";
        append_json_string(out, tool.description);
        out += R"(,"inputSchema":)";
        out += tool.input_schema;
        out += '}';
    }
    out += "]}";
    return out;
}

std::string initialize_json(std::string_view requested, const sandbox_layout& layout,
                            const sandbox_network& network) {
    std::string_view version = protocol_versions.front();
    for (const auto v : protocol_versions)
        if (v == requested) version = v;
    json_writer w;
    w.begin_object();
    w.key("protocolVersion").value(version);
    w.key("capabilities").begin_object();
    w.key("tools").begin_object().key("listChanged").value(false).end_object();
    w.key("resources").begin_object();
    w.key("listChanged").value(false).key("subscribe").value(false);
    w.end_object();
    w.end_object();
    w.key("serverInfo").begin_object().key("name").value("moat").key("version").value("0.1.0");
    w.end_object();
    const std::string instructions =
        "Tools that run code in a private sandbox kept for this connection (" +
        egress::describe_for_model(network) + "): Python state and files in " + layout.workdir +
        " persist between calls. Files saved under " + layout.artifacts_dir +
        " are listed as artifacts and readable as resources (moat://artifacts/<path>), as are the "
        "figures and images a Python cell shows (saved there as files); any file "
        "under " +
        layout.workdir +
        " is readable, as exact bytes, as moat://workspace/<path>. A failure of the code (an "
        "exception, a non-zero exit, a timeout) is a result with its status, not a tool error.";
    w.key("instructions").value(instructions);
    w.end_object();
    return w.take();
}

std::string call_result_json(const tool_result& r, const server_options& options) {
    json_writer w;
    w.begin_object();
    w.key("content").begin_array().begin_object();
    w.key("type").value("text").key("text").value(r.to_json());
    w.end_object();
    std::size_t images = 0;
    for (const auto* shown : r.cell.results()) {
        for (const auto type : {media::image_png, media::image_jpeg}) {
            const auto* image = shown->find(type);
            if (image == nullptr || images == options.max_image_items ||
                image->data.size() > options.max_image_bytes) {
                continue;
            }
            ++images;
            w.begin_object().key("type").value("image");
            w.key("data").value(base64_encode(image->data));
            w.key("mimeType").value(type).end_object();
            break;
        }
    }
    w.end_array();
    // isError is for moat's own failures and bad arguments: an MCP adapter turns it into an
    // exception (LangChain's ToolException), while the code's failure is data the model fixes.
    w.key("isError").value(r.is_tool_error());
    w.end_object();
    return w.take();
}

// The tail of a running call's output, for progress notifications: the last bytes seen, bounded.
struct output_tail {
    std::string kept;
    std::uint64_t seen = 0;

    void add(std::string_view data) {
        seen += data.size();
        if (data.size() >= progress_bytes_kept) {
            kept.assign(data.substr(data.size() - progress_bytes_kept));
            return;
        }
        kept += data;
        if (kept.size() > progress_bytes_kept) kept.erase(0, kept.size() - progress_bytes_kept);
    }

    // The last complete or partial lines, shaped for display.
    std::string latest_lines() const {
        std::string_view text(kept);
        while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
        std::size_t start = text.size();
        for (std::size_t lines = 0; start > 0 && lines < progress_lines;) {
            --start;
            if (text[start] == '\n' && ++lines == progress_lines) {
                ++start;
                break;
            }
        }
        shaping_limits limits;
        limits.head_chars = 0;
        limits.tail_chars = 1000;
        limits.max_chars = 1000;
        return shape_for_model(text.substr(start), limits).text;
    }
};

}  // namespace

struct server::state : std::enable_shared_from_this<server::state> {
    state(tool_session& t, int in_fd, int out_fd, server_options o, asio::any_io_executor ex)
        : tools(t),
          input(ex),
          output(ex),
          output_fd(out_fd),
          options(o),
          calls(ex, "mcp calls"),
          helpers(ex, "mcp progress and output") {
        std::error_code ec;
        input.assign(::dup(in_fd), ec);
        input_error = ec;
        output.assign(::dup(out_fd), ec);
        output_is_stream = !ec;
    }

    tool_session& tools;
    asio::posix::stream_descriptor input;
    asio::posix::stream_descriptor output;
    int output_fd;
    bool output_is_stream = false;
    std::error_code input_error;
    server_options options;
    task_group calls;                              // running tools/call and resources/* requests
    task_group helpers;                            // progress reporters and the output writer
    std::map<std::string, std::uint64_t> running;  // request id (JSON text) -> task
    std::deque<std::string> outbox;
    std::size_t outbox_bytes = 0;
    bool writing = false;
    clock::time_point last_write = clock::now();
    bool output_broken = false;

    void send(std::string line) {
        if (output_broken) return;
        line += '\n';
        if (!output_is_stream) {
            // A regular file: blocking writes are all it offers.
            std::size_t done = 0;
            while (done < line.size()) {
                const ssize_t n = ::write(output_fd, line.data() + done, line.size() - done);
                if (n <= 0) {
                    output_broken = true;
                    return;
                }
                done += static_cast<std::size_t>(n);
            }
            return;
        }
        outbox_bytes += line.size();
        outbox.push_back(std::move(line));
        if (!writing) {
            writing = true;
            helpers.spawn(write_outbox(shared_from_this()));
        }
    }

    static asio::awaitable<void> write_outbox(std::shared_ptr<state> self) {
        while (!self->outbox.empty()) {
            std::string line = std::move(self->outbox.front());
            self->outbox.pop_front();
            self->outbox_bytes -= line.size();
            auto [ec, n] = co_await asio::async_write(self->output, asio::buffer(line),
                                                      as_tuple(asio::use_awaitable));
            if (ec) {
                self->output_broken = true;
                self->outbox.clear();
                self->outbox_bytes = 0;
            }
            self->last_write = clock::now();
        }
        self->writing = false;
    }

    // Every progress_interval: how long the call has run and, once it printed something, the
    // latest lines of its output.
    static asio::awaitable<void> report_progress(std::shared_ptr<state> self, std::string token,
                                                 std::shared_ptr<output_tail> tail) {
        asio::steady_timer timer(self->helpers.get_executor());
        const auto started = clock::now();
        for (std::uint64_t step = 1;; ++step) {
            timer.expires_after(self->options.progress_interval);
            auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
            if (ec) co_return;
            const auto seconds =
                std::chrono::duration_cast<std::chrono::seconds>(clock::now() - started).count();
            std::string message = "running for " + std::to_string(seconds) + " s";
            if (tail->seen != 0) message += "; latest output:\n" + tail->latest_lines();
            std::string params = R"({"progressToken":)" + token + R"(,"progress":)" +
                                 std::to_string(step) + R"(,"message":)";
            append_json_string(params, message);
            params += '}';
            self->send(jsonrpc_notification("notifications/progress", params));
        }
    }

    static asio::awaitable<void> call_tool(std::shared_ptr<state> self, std::string id,
                                           std::string name, std::string arguments,
                                           std::optional<std::string> progress_token) {
        std::optional<std::uint64_t> progress;
        output_callback on_output;
        if (progress_token) {
            auto tail = std::make_shared<output_tail>();
            on_output = [tail](output_channel, std::string_view data) { tail->add(data); };
            progress = self->helpers.spawn(report_progress(self, *progress_token, tail));
        }
        const deadline no_limit;
        auto outcome =
            co_await self->tools.async_call(name, arguments, no_limit, std::move(on_output));
        if (progress) self->helpers.cancel(*progress);
        self->running.erase(id);
        if (!outcome) {
            // Cancelled by the client (notifications/cancelled) or by shutdown: no response.
            if (outcome.error().code == errc::cancelled) co_return;
            self->send(jsonrpc_error(id, internal_error, "the call failed inside moat"));
            co_return;
        }
        self->send(jsonrpc_result(id, call_result_json(*outcome, self->options)));
    }

    static asio::awaitable<void> list_resources(std::shared_ptr<state> self, std::string id) {
        auto listed = co_await self->tools.async_list_artifacts();
        self->running.erase(id);
        if (!listed) {
            if (listed.error().code == errc::cancelled) co_return;
            self->send(jsonrpc_error(id, internal_error, "the sandbox is unavailable"));
            co_return;
        }
        json_writer w;
        w.begin_object().key("resources").begin_array();
        for (const auto& a : *listed) {
            w.begin_object();
            w.key("uri").value(std::string(artifact_scheme) + a.path);
            w.key("name").value(a.path);
            w.key("mimeType").value(a.media_type);
            w.key("size").value(a.size);
            w.end_object();
        }
        w.end_array().end_object();
        self->send(jsonrpc_result(id, w.str()));
    }

    static asio::awaitable<void> read_resource(std::shared_ptr<state> self, std::string id,
                                               std::string uri) {
        const bool is_artifact = uri.starts_with(artifact_scheme);
        const std::string path =
            uri.substr(is_artifact ? artifact_scheme.size() : workspace_scheme.size());
        result<std::string> bytes = make_error(errc::invalid_path, "no path");
        if (is_artifact) {
            bytes = co_await self->tools.async_read_artifact(path);
        } else {
            bytes = co_await self->tools.async_read_workspace_file(path);
        }
        self->running.erase(id);
        if (!bytes) {
            if (bytes.error().code == errc::cancelled) co_return;
            const bool missing = bytes.error().code == errc::file_not_found ||
                                 bytes.error().code == errc::invalid_path;
            self->send(jsonrpc_error(
                id, missing ? invalid_params : internal_error,
                missing ? std::string(is_artifact ? "no such artifact: " : "no such file: ") + path
                        : std::string("the sandbox is unavailable")));
            co_return;
        }
        json_writer w;
        w.begin_object().key("contents").begin_array().begin_object();
        w.key("uri").value(uri);
        w.key("mimeType").value(media_type_for(path));
        w.key("blob").value(base64_encode(*bytes));
        w.end_object().end_array().end_object();
        self->send(jsonrpc_result(id, w.str()));
    }

    void start(const std::string& id, asio::awaitable<void> task) {
        running[id] = calls.spawn(std::move(task));
    }

    void handle_request(const jsonrpc_message& m) {
        const std::string& method = m.method;
        if (method == "initialize") {
            const auto version = string_field(m.params, "protocolVersion").value_or("");
            send(jsonrpc_result(m.id, initialize_json(version, tools.layout(), tools.network())));
        } else if (method == "ping") {
            send(jsonrpc_result(m.id, "{}"));
        } else if (method == "tools/list") {
            send(jsonrpc_result(m.id, tools_list_json(tools.definitions())));
        } else if (method == "tools/call") {
            auto name = string_field(m.params, "name");
            if (!name) {
                send(jsonrpc_error(m.id, invalid_params, "tools/call: params.name is missing"));
                return;
            }
            std::string arguments = raw_field(m.params, "arguments").value_or("{}");
            std::optional<std::string> token;
            if (auto meta = raw_field(m.params, "_meta")) token = raw_field(*meta, "progressToken");
            start(m.id, call_tool(shared_from_this(), m.id, std::move(*name), std::move(arguments),
                                  std::move(token)));
        } else if (method == "resources/list") {
            start(m.id, list_resources(shared_from_this(), m.id));
        } else if (method == "resources/read") {
            auto uri = string_field(m.params, "uri");
            const bool valid =
                uri &&
                ((uri->starts_with(artifact_scheme) && uri->size() > artifact_scheme.size()) ||
                 (uri->starts_with(workspace_scheme) && uri->size() > workspace_scheme.size()));
            if (!valid) {
                send(jsonrpc_error(m.id, invalid_params,
                                   "resources/read: params.uri must be moat://artifacts/<path> or "
                                   "moat://workspace/<path>"));
                return;
            }
            start(m.id, read_resource(shared_from_this(), m.id, std::move(*uri)));
        } else if (method == "resources/templates/list") {
            json_writer w;
            w.begin_object().key("resourceTemplates").begin_array().begin_object();
            w.key("uriTemplate")
                .value("moat://workspace/{path}")
                .key("name")
                .value("workspace file");
            const std::string& dir = tools.layout().workdir;
            w.key("description")
                .value("Any file under " + dir +
                       ", as its exact bytes (base64 blob); path is relative to " + dir + ".");
            w.key("mimeType").value("application/octet-stream");
            w.end_object().end_array().end_object();
            send(jsonrpc_result(m.id, w.take()));
        } else if (method == "prompts/list") {
            send(jsonrpc_result(m.id, R"({"prompts":[]})"));
        } else {
            send(jsonrpc_error(m.id, method_not_found, "method not found: " + method));
        }
    }

    void handle_notification(const jsonrpc_message& m) {
        if (m.method != "notifications/cancelled") return;  // initialized, progress, ...
        const auto id = id_field(m.params, "requestId");
        if (!id) return;
        const auto found = running.find(*id);
        if (found != running.end()) calls.cancel(found->second);
    }

    void handle_line(std::string_view line) {
        const auto m = parse_jsonrpc(line, options.max_message_bytes);
        switch (m.what) {
            case jsonrpc_message::kind::request:
                handle_request(m);
                break;
            case jsonrpc_message::kind::notification:
                handle_notification(m);
                break;
            case jsonrpc_message::kind::response:
                break;  // this server sends no requests
            case jsonrpc_message::kind::invalid:
                send(jsonrpc_error(m.id, m.error_code, m.error_message));
                break;
        }
    }

    // Reads lines until EOF, an error or cancellation.
    asio::awaitable<void> read_requests() {
        std::string buffer;
        bool skipping = false;  // inside a line that was too long
        std::array<char, 64 * 1024> chunk{};
        asio::steady_timer backoff(helpers.get_executor());
        for (;;) {
            // A client that does not read its responses stops being read: the outbox is bounded.
            while (outbox_bytes > options.max_pending_output_bytes && !output_broken) {
                backoff.expires_after(std::chrono::milliseconds(5));
                auto [waited] = co_await backoff.async_wait(as_tuple(asio::use_awaitable));
                if (waited) co_return;
            }
            auto [ec, n] =
                co_await input.async_read_some(asio::buffer(chunk), as_tuple(asio::use_awaitable));
            if (ec) co_return;
            buffer.append(chunk.data(), n);
            std::size_t start = 0;
            for (auto newline = buffer.find('\n'); newline != std::string::npos;
                 newline = buffer.find('\n', start)) {
                std::string_view line(buffer.data() + start, newline - start);
                start = newline + 1;
                if (skipping) {
                    skipping = false;
                    continue;
                }
                if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
                if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
                handle_line(line);
            }
            buffer.erase(0, start);
            if (buffer.size() > options.max_message_bytes) {
                if (!skipping) {
                    send(jsonrpc_error("", message_too_large,
                                       "message too large: more than " +
                                           std::to_string(options.max_message_bytes) + " bytes"));
                }
                skipping = true;
                buffer.clear();
            }
        }
    }
};

server::server(tool_session& tools, int in_fd, int out_fd, server_options options)
    : state_(std::make_shared<state>(tools, in_fd, out_fd, options, tools.get_executor())) {}

server::~server() = default;

asio::awaitable<int> server::async_run() {
    auto self = state_;
    if (self->input_error) {
        std::fprintf(stderr,
                     "moat mcp: stdin must be a pipe or a socket (MCP clients start moat mcp with "
                     "pipes): %s\n",
                     self->input_error.message().c_str());
        co_return 2;
    }
    co_await self->read_requests();
    // The client is gone (or we were told to stop): stop its calls, then end the session (a
    // shared one stays for the next connection).
    co_await asio::this_coro::reset_cancellation_state();
    self->calls.cancel_all();
    co_await self->calls.async_wait_all();
    result<void> ended;
    if (self->options.end_session_on_close) ended = co_await self->tools.async_end();
    asio::steady_timer timer(self->helpers.get_executor());
    self->last_write = clock::now();
    while (self->writing && clock::now() - self->last_write < flush_stall) {
        timer.expires_after(std::chrono::milliseconds(10));
        co_await timer.async_wait(as_tuple(asio::use_awaitable));
    }
    self->helpers.cancel_all();
    co_await self->helpers.async_wait_all();
    if (!ended) {
        std::fprintf(stderr, "moat mcp: the session's sandbox was not confirmed destroyed: %s\n",
                     ended.error().to_string().c_str());
        co_return 1;
    }
    co_return 0;
}

}  // namespace moat::mcp
