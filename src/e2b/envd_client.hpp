// The data plane of one remote sandbox: its envd, over HTTP (/files) and Connect JSON (the
// process.Process and filesystem.Filesystem services). The e2b backend holds one per sandbox it
// knows and forwards exec, spawn, signal, files, stat and list_dir to it; the contracts are
// backend.hpp's, with the differences docs/remote.md lists.
//
// Every unary call is bounded by envd_options::request_timeout (and the caller's cancellation);
// streams by their command's limits, enforced client-side too (a server that ignores
// Connect-Timeout-Ms cannot keep the caller waiting). The access token is sent as X-Access-Token
// and never appears in an error detail or a log line.
#pragma once

#include <moat/exec.hpp>
#include <moat/files.hpp>
#include <moat/result.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moat::http {
class client;
}

namespace moat::e2b {

struct envd_endpoint {
    // http(s)://host[:port] of this sandbox's envd (E2B_SANDBOX_URL, or
    // https://49983-<id>.<domain>).
    std::string base_url;
    std::string sandbox_id;    // sent as E2b-Sandbox-Id
    std::string access_token;  // envdAccessToken; "" when the sandbox is not secure
    std::string user = "user";
};

struct envd_options {
    std::chrono::milliseconds request_timeout = std::chrono::seconds(30);
    std::chrono::milliseconds kill_grace = std::chrono::seconds(3);
    std::chrono::milliseconds keepalive_interval = std::chrono::seconds(30);
    file_limits files;
    // The largest Connect stream frame read (a process event); past it, protocol_error.
    std::size_t max_frame_bytes = 4 * 1024 * 1024;
};

class envd_client {
  public:
    envd_client(std::shared_ptr<http::client> http, envd_endpoint endpoint, envd_options options);
    ~envd_client();
    envd_client(const envd_client&) = delete;
    envd_client& operator=(const envd_client&) = delete;

    const envd_endpoint& endpoint() const noexcept;

    // GET /health: empty once envd answers 204.
    asio::awaitable<result<void>> async_health();

    asio::awaitable<result<exec_stream>> async_exec_stream(exec_request request);
    asio::awaitable<result<process>> async_spawn(exec_request request);
    asio::awaitable<result<void>> async_signal(std::uint64_t process_id, int signal);

    asio::awaitable<result<std::vector<file_write_result>>> async_write_files(
        std::vector<file_write> files);
    asio::awaitable<result<std::vector<file_read_result>>> async_read_files(
        std::vector<std::string> paths);
    asio::awaitable<result<file_write_result>> async_write_file_stream(file_write_target target,
                                                                       byte_source source);
    asio::awaitable<result<file_read_stream>> async_read_file_stream(std::string path);
    asio::awaitable<result<std::vector<file_metadata_result>>> async_read_metadata(
        std::vector<std::string> paths);
    asio::awaitable<result<file_stat>> async_stat(std::string path);
    asio::awaitable<result<std::vector<dir_entry>>> async_list_dir(std::string path);

    // Kills every process this client started and is still following (the owner detaches).
    asio::awaitable<void> async_kill_all();

    struct state;

  private:
    std::shared_ptr<state> state_;
};

}  // namespace moat::e2b
