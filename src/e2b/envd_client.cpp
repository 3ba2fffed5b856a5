#include "e2b/envd_client.hpp"

#include <moat/with_timeout.hpp>

#include "core/base64.hpp"
#include "core/exception_boundary.hpp"
#include "e2b/envd_calls.hpp"
#include "e2b/envd_files.hpp"
#include "e2b/envd_process_stream.hpp"
#include "e2b_protocol/error_body.hpp"
#include "e2b_protocol/process_messages.hpp"
#include "http/connect_envelope.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include "core/asio_compat.hpp"

#include <algorithm>
#include <csignal>

namespace moat::e2b {
namespace {

namespace connect = http::connect;
namespace protocol = e2b_protocol;

// How often Process/List is asked while a kill is being confirmed.
constexpr std::chrono::milliseconds confirm_poll{50};

asio::cancellation_type ignore_cancellation(asio::cancellation_type) {
    return asio::cancellation_type::none;
}

bool is_json(const http::header_list& headers) {
    const auto type = headers.find("Content-Type");
    if (!type) return false;
    const auto base = type->substr(0, type->find(';'));
    return http::iequals(base, "application/json");
}

}  // namespace

void envd_client::state::bind(const asio::any_io_executor& executor) {
    if (!tasks) tasks.emplace(executor, "envd " + endpoint.sandbox_id);
}

http::request envd_request(const envd_client::state& s, std::string method, std::string target) {
    http::request r;
    r.method = std::move(method);
    std::string base = s.endpoint.base_url;
    while (!base.empty() && base.back() == '/') base.pop_back();
    r.url = base + target;
    r.headers.add("E2b-Sandbox-Id", s.endpoint.sandbox_id);
    r.headers.add("E2b-Sandbox-Port", "49983");
    if (!s.endpoint.access_token.empty()) r.headers.add("X-Access-Token", s.endpoint.access_token);
    r.headers.add("User-Agent", "moat-envd-client");
    return r;
}

error envd_http_error(int status, std::string_view body, std::string_view what) {
    std::string message = protocol::parse_envd_error_message(body);
    std::string detail = std::string(what) + ": ";
    if (message.empty())
        detail += "envd answered";
    else
        detail += message;
    detail += " (HTTP " + std::to_string(status) + ")";
    errc code = errc::backend_failure;
    switch (status) {
        case 400:
            code = message.find("is a directory") != std::string::npos ? errc::is_directory
                                                                       : errc::invalid_path;
            break;
        case 401:
            code = errc::unauthorized;
            break;
        case 403:
            code = errc::permission_denied;
            break;
        case 404:
            code = errc::file_not_found;
            break;
        case 413:
        case 507:
            code = errc::too_large;
            break;
        case 502:
            code = errc::sandbox_unavailable;
            break;
        default:
            break;
    }
    return make_error(code, std::move(detail));
}

namespace {
// with_timeout needs a default-constructible value: an optional holds the response.
asio::awaitable<result<std::optional<http::response>>> send_optional(state_ptr s,
                                                                     http::request request) {
    auto sent = co_await s->http->async_send(std::move(request));
    if (!sent) co_return std::move(sent).error();
    co_return std::optional<http::response>(std::move(*sent));
}
}  // namespace

asio::awaitable<result<http::response>> async_send_within(state_ptr s, http::request request,
                                                          deadline head_limit) {
    auto send = send_optional(s, std::move(request));
    auto sent = co_await with_timeout(std::move(send), head_limit);
    if (!sent) co_return std::move(sent).error();
    co_return std::move(**sent);
}

asio::awaitable<result<std::string>> async_unary(state_ptr s, std::string rpc, std::string json,
                                                 deadline limit, std::size_t max_reply) {
    auto request = envd_request(*s, "POST", "/" + rpc);
    request.headers.add("Content-Type", "application/json");
    request.headers.add("Connect-Protocol-Version", "1");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(limit.remaining());
    if (!limit.is_never()) {
        request.headers.add("Connect-Timeout-Ms", std::to_string(std::max<long>(1, left.count())));
    }
    if (!s->endpoint.user.empty()) {
        request.headers.add("Authorization", "Basic " + base64_encode(s->endpoint.user + ":"));
    }
    request.body = std::move(json);
    request.limit = limit;
    auto reply = co_await s->http->async_fetch(std::move(request), max_reply);
    if (!reply) {
        auto e = std::move(reply).error();
        e.detail = rpc + ": " + e.detail;
        co_return e;
    }
    if (reply->status() == 502) co_return envd_http_error(502, reply->body, rpc);
    if (reply->status() != 200) {
        auto e = connect::to_error(connect::parse_unary_error(reply->status(), reply->body));
        e.detail = rpc + ": " + e.detail;
        co_return e;
    }
    if (!is_json(reply->head.headers)) {
        co_return make_error(errc::protocol_error,
                             rpc + ": envd answered 200 without Content-Type application/json");
    }
    co_return std::move(reply->body);
}

asio::awaitable<result<void>> async_send_signal(state_ptr s, std::uint32_t pid, int number) {
    if (number <= 0 || number >= 65) {
        co_return make_error(errc::invalid_argument,
                             "signal must be between 1 and 64, got " + std::to_string(number));
    }
    protocol::send_signal_request request;
    request.process.pid = pid;
    request.signal = number;
    auto json = protocol::encode_send_signal_request(request);
    if (!json) {
        co_return make_error(
            errc::not_supported,
            "envd sends only SIGKILL and SIGTERM, not signal " + std::to_string(number));
    }
    const auto limit = deadline::after(s->options.request_timeout);
    auto sent = co_await async_unary(s, "process.Process/SendSignal", std::move(*json), limit);
    if (!sent) co_return std::move(sent).error();
    co_return result<void>{};
}

asio::awaitable<bool> async_kill_and_confirm(state_ptr s, std::string tag, deadline limit) {
    auto executor = co_await asio::this_coro::executor;
    protocol::send_signal_request by_tag;
    by_tag.process.tag = tag;
    by_tag.signal = SIGKILL;
    const auto kill = protocol::encode_send_signal_request(by_tag);
    // not_found: already gone; any other failure: List below tells.
    (void)co_await async_unary(s, "process.Process/SendSignal", *kill, limit);
    asio::steady_timer timer(executor);
    for (;;) {
        auto listed = co_await async_unary(s, "process.Process/List", "{}", limit);
        if (listed) {
            auto processes = protocol::parse_list_response(*listed);
            if (processes) {
                const bool present =
                    std::any_of(processes->begin(), processes->end(),
                                [&](const protocol::listed_process& p) { return p.tag == tag; });
                if (!present) co_return true;
                (void)co_await async_unary(s, "process.Process/SendSignal", *kill, limit);
            }
        }
        if (limit.has_expired()) co_return false;
        timer.expires_after(std::min<deadline::clock::duration>(confirm_poll, limit.remaining()));
        (void)co_await timer.async_wait(as_tuple(asio::use_awaitable));
    }
}

asio::awaitable<void> async_kill_task(state_ptr s, std::string tag) {
    co_await asio::this_coro::reset_cancellation_state(ignore_cancellation);
    const auto limit = deadline::after(s->options.kill_grace);
    (void)co_await async_kill_and_confirm(s, tag, limit);
    s->live.erase(tag);
}

envd_client::envd_client(std::shared_ptr<http::client> http, envd_endpoint endpoint,
                         envd_options options)
    : state_(std::make_shared<state>()) {
    state_->http = std::move(http);
    state_->endpoint = std::move(endpoint);
    state_->options = std::move(options);
}

envd_client::~envd_client() = default;

const envd_endpoint& envd_client::endpoint() const noexcept {
    return state_->endpoint;
}

namespace {

asio::awaitable<result<void>> health(state_ptr s) {
    auto request = envd_request(*s, "GET", "/health");
    request.limit = deadline::after(s->options.request_timeout);
    auto reply = co_await s->http->async_fetch(std::move(request), 64 * 1024);
    if (!reply) co_return std::move(reply).error();
    if (reply->status() == 204 || reply->status() == 200) co_return result<void>{};
    co_return envd_http_error(reply->status(), reply->body, "envd /health");
}

asio::awaitable<result<void>> send_signal_to(state_ptr s, std::uint64_t process_id, int number) {
    if (number <= 0 || number >= 65) {
        co_return make_error(errc::invalid_argument,
                             "signal must be between 1 and 64, got " + std::to_string(number));
    }
    if (process_id == 0 || process_id > UINT32_MAX) {
        co_return make_error(errc::invalid_argument,
                             "no process " + std::to_string(process_id) + " in this sandbox");
    }
    const auto pid = static_cast<std::uint32_t>(process_id);
    auto sent = co_await async_send_signal(s, pid, number);
    if (!sent && sent.error().code == errc::file_not_found) {
        co_return make_error(errc::invalid_argument,
                             "process " + std::to_string(pid) + " is not running");
    }
    if (!sent) co_return std::move(sent).error();
    co_return result<void>{};
}

asio::awaitable<void> kill_all(state_ptr s) {
    if (!s->tasks) co_return;
    const std::set<std::string> tags = s->live;
    for (const auto& tag : tags) s->tasks->spawn(async_kill_task(s, tag));
    co_await s->tasks->async_wait_all();
}

}  // namespace

asio::awaitable<result<void>> envd_client::async_health() {
    return guarded(health(state_));
}

asio::awaitable<result<exec_stream>> envd_client::async_exec_stream(exec_request request) {
    return guarded(async_start_exec_stream(state_, std::move(request)));
}

asio::awaitable<result<process>> envd_client::async_spawn(exec_request request) {
    return guarded(async_start_process(state_, std::move(request)));
}

asio::awaitable<result<void>> envd_client::async_signal(std::uint64_t process_id, int signal) {
    return guarded(send_signal_to(state_, process_id, signal));
}

asio::awaitable<result<std::vector<file_write_result>>> envd_client::async_write_files(
    std::vector<file_write> files) {
    return guarded(async_envd_write_files(state_, std::move(files)));
}

asio::awaitable<result<std::vector<file_read_result>>> envd_client::async_read_files(
    std::vector<std::string> paths) {
    return guarded(async_envd_read_files(state_, std::move(paths)));
}

asio::awaitable<result<file_write_result>> envd_client::async_write_file_stream(
    file_write_target target, byte_source source) {
    return guarded(async_envd_write_stream(state_, std::move(target), std::move(source)));
}

asio::awaitable<result<file_read_stream>> envd_client::async_read_file_stream(std::string path) {
    return guarded(async_envd_read_stream(state_, std::move(path)));
}

asio::awaitable<result<std::vector<file_metadata_result>>> envd_client::async_read_metadata(
    std::vector<std::string> paths) {
    return guarded(async_envd_read_metadata(state_, std::move(paths)));
}

asio::awaitable<result<file_stat>> envd_client::async_stat(std::string path) {
    return guarded(async_envd_stat(state_, std::move(path)));
}

asio::awaitable<result<std::vector<dir_entry>>> envd_client::async_list_dir(std::string path) {
    return guarded(async_envd_list_dir(state_, std::move(path)));
}

asio::awaitable<void> envd_client::async_kill_all() {
    return kill_all(state_);
}

}  // namespace moat::e2b
