#include "serve/connect_rpc.hpp"

#include <algorithm>
#include <charconv>
#include <vector>

namespace moat::serve {
namespace {

template <class Rep>
std::optional<Rep> header_number(const http::server_request& request, std::string_view name) {
    const auto value = request.headers().find(name);
    if (!value || value->empty() || value->size() > 10) return std::nullopt;
    Rep n{};
    const auto* end = value->data() + value->size();
    const auto [ptr, ec] = std::from_chars(value->data(), end, n);
    if (ec != std::errc() || ptr != end || n <= 0) return std::nullopt;
    return n;
}

}  // namespace

asio::awaitable<result<std::string>> async_read_unary_request(http::server_request& request,
                                                              std::size_t cap) {
    std::string body;
    for (;;) {
        auto piece = co_await request.async_read_some();
        if (!piece) co_return std::move(piece).error();
        if (piece->empty()) break;
        if (body.size() + piece->size() > cap) {
            co_return make_error(errc::too_large,
                                 "request message over " + std::to_string(cap) + " bytes");
        }
        body.append(*piece);
    }
    co_return body;
}

asio::awaitable<result<std::string>> async_read_stream_request(http::server_request& request,
                                                               std::size_t cap) {
    http::connect::envelope_decoder decoder(cap);
    std::vector<http::connect::envelope> envelopes;
    for (;;) {
        auto piece = co_await request.async_read_some();
        if (!piece) co_return std::move(piece).error();
        if (piece->empty()) break;
        auto fed = decoder.feed(*piece, envelopes);
        if (!fed) co_return std::move(fed).error();
        if (envelopes.size() > 2) break;
    }
    const bool one_message =
        (envelopes.size() == 1 && !envelopes[0].is_end_stream()) ||
        (envelopes.size() == 2 && !envelopes[0].is_end_stream() && envelopes[1].is_end_stream());
    if (!one_message) {
        co_return make_error(errc::protocol_error,
                             "a server-stream request must carry exactly one message envelope");
    }
    co_return std::move(envelopes[0].payload);
}

asio::awaitable<result<void>> async_send_unary(http::server_response& response, std::string json) {
    http::header_list headers;
    headers.add("Content-Type", std::string(connect_json));
    co_return co_await response.async_send(200, std::move(headers), std::move(json));
}

asio::awaitable<result<void>> async_send_unary_error(http::server_response& response,
                                                     http::connect::code code,
                                                     std::string_view message) {
    http::connect::connect_error e;
    e.code = code;
    e.message = std::string(message);
    http::header_list headers;
    headers.add("Content-Type", std::string(connect_json));
    const int status = http::connect::http_status(code);
    std::string body = http::connect::encode_unary_error(e);
    co_return co_await response.async_send(status, std::move(headers), std::move(body));
}

asio::awaitable<result<void>> connect_stream::async_begin() {
    if (begun_) co_return result<void>{};
    begun_ = true;
    http::header_list headers;
    headers.add("Content-Type", std::string(connect_stream_json));
    co_return co_await response_->async_begin(200, std::move(headers));
}

asio::awaitable<result<void>> connect_stream::async_send(std::string_view json) {
    auto begun = co_await async_begin();
    if (!begun) co_return begun;
    const std::string frame = http::connect::encode_envelope(0, json);
    co_return co_await response_->async_write(frame);
}

asio::awaitable<result<void>> connect_stream::async_finish(std::string payload) {
    if (ended_) co_return result<void>{};
    ended_ = true;
    auto begun = co_await async_begin();
    if (!begun) co_return begun;
    const std::string frame =
        http::connect::encode_envelope(http::connect::flag_end_stream, payload);
    auto written = co_await response_->async_write(frame);
    if (!written) co_return written;
    co_return co_await response_->async_end();
}

asio::awaitable<void> connect_stream::async_abort() {
    if (ended_) co_return;
    (void)co_await async_begin();
    ended_ = true;
    response_->abort();
}

asio::awaitable<result<void>> connect_stream::async_end() {
    std::string payload = "{}";
    co_return co_await async_finish(std::move(payload));
}

asio::awaitable<result<void>> connect_stream::async_end(http::connect::code code,
                                                        std::string_view message) {
    http::connect::end_stream end;
    http::connect::connect_error e;
    e.code = code;
    e.message = std::string(message);
    end.error = std::move(e);
    std::string payload = http::connect::encode_end_stream(end);
    co_return co_await async_finish(std::move(payload));
}

std::optional<std::chrono::milliseconds> connect_timeout(const http::server_request& request) {
    const auto n = header_number<std::int64_t>(request, "Connect-Timeout-Ms");
    if (!n) return std::nullopt;
    return std::chrono::milliseconds(*n);
}

std::optional<std::chrono::seconds> keepalive_interval(const http::server_request& request) {
    const auto value = request.headers().find("Keepalive-Ping-Interval");
    if (!value) return std::nullopt;
    return parse_keepalive_interval(*value);
}

std::optional<std::chrono::seconds> parse_keepalive_interval(std::string_view value) {
    if (value.empty() || value.find_first_not_of("0123456789") != std::string_view::npos) {
        return std::nullopt;
    }
    std::uint64_t n = 0;
    const auto* end = value.data() + value.size();
    const auto [ptr, ec] = std::from_chars(value.data(), end, n);
    // Digits only, so the one failure left is a number past uint64: past the hour too.
    if (ec == std::errc::result_out_of_range) return max_keepalive_interval;
    if (ec != std::errc() || ptr != end || n == 0) return std::nullopt;
    const auto cap = static_cast<std::uint64_t>(max_keepalive_interval.count());
    return std::chrono::seconds(static_cast<std::int64_t>(std::min(n, cap)));
}

}  // namespace moat::serve
