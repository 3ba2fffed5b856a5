// `moat mcp`: a Model Context Protocol server over stdio (JSON-RPC 2.0, one message per line).
//
// Methods: initialize, ping, tools/list, tools/call, resources/list and resources/read (the files
// under the session's artifacts directory as moat://artifacts/<path>, and any file under its
// working directory as moat://workspace/<path>: exact bytes for the client, never model-facing
// text), resources/templates/list; notifications: notifications/initialized,
// notifications/cancelled (cancels the running call: its process is killed and confirmed gone). A
// tools/call whose params carry _meta.progressToken gets notifications/progress while it runs,
// whose message carries the latest lines of its output. A result is one text item (the
// tool_result's JSON), followed by image items when server_options::max_image_items allows. isError
// is set only for moat's own failures and invalid arguments (tool_result::is_tool_error). The
// connection has one per-session sandbox (through the tool session); when the client disconnects
// (EOF on stdin) running calls are cancelled, the session ends and its sandbox is destroyed,
// confirmed, before async_run returns.
#pragma once

#include <moat/tools.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace moat::mcp {

struct server_options {
    std::chrono::milliseconds progress_interval = std::chrono::seconds(1);
    std::size_t max_message_bytes = 64 << 20;  // a longer line is answered with an error, skipped
    // Responses not yet taken by the client; past this, requests are not read until it catches up.
    std::size_t max_pending_output_bytes = 16 << 20;
    // When the client leaves: end the tool session (its sandbox destroyed, confirmed), or, for a
    // shared session that outlives the connection (moat mcp --session KEY), leave it to the next
    // connection, `moat session end KEY`, or its idle limit and TTL.
    bool end_session_on_close = true;
    // The images a run_python cell displayed (figures, display() of a PNG or JPEG) also go to the
    // client as MCP image content items after the result's text, for clients that pass images to
    // their model (moat mcp --images): at most this many per call, each at most max_image_bytes
    // (a larger one is only listed, as every image is, by its artifact path). 0: none (the
    // default; the text lists the saved files).
    std::size_t max_image_items = 0;
    std::size_t max_image_bytes = 1 << 20;
};

class server {
  public:
    // Reads requests from `in_fd` and writes responses to `out_fd` (both stay open: the caller
    // owns them). `tools` must outlive the server.
    server(tool_session& tools, int in_fd, int out_fd, server_options options = {});
    ~server();
    server(const server&) = delete;
    server& operator=(const server&) = delete;

    // Serves until the client disconnects or this coroutine is cancelled; then stops its calls
    // and ends the session (unless end_session_on_close is false). Returns 0, or 1 if the
    // session's sandbox could not be confirmed destroyed.
    asio::awaitable<int> async_run();

    struct state;

  private:
    std::shared_ptr<state> state_;
};

}  // namespace moat::mcp
