#include <moat/backend.hpp>

#include "core/output_capture.hpp"

namespace moat {
namespace {

error not_supported(const std::string& backend_name, const char* operation) {
    return make_error(errc::not_supported,
                      backend_name + " backend does not implement " + operation + " yet");
}

}  // namespace

const char* to_string(sandbox_state state) noexcept {
    switch (state) {
        case sandbox_state::running:
            return "running";
        case sandbox_state::exited:
            return "exited";
    }
    return "unknown";
}

asio::awaitable<result<exec_result>> async_collect(exec_stream stream, output_limits limits) {
    output_capture out(limits);
    output_capture err(limits);
    for (;;) {
        auto next = co_await stream.async_next();
        if (!next) co_return std::move(next).error();
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            (chunk->channel == output_channel::out ? out : err).append(chunk->data);
            continue;
        }
        exec_result done = std::get<exec_result>(std::move(*next));
        done.out = out.finish();
        done.err = err.finish();
        co_return done;
    }
}

asio::awaitable<result<exec_result>> backend::async_exec(std::string id, exec_request request) {
    const output_limits limits = request.output;
    auto stream = co_await async_exec_stream(std::move(id), std::move(request));
    if (!stream) co_return std::move(stream).error();
    co_return co_await async_collect(std::move(*stream), limits);
}

asio::awaitable<result<host_report>> backend::async_host_report() {
    co_return not_supported(name(), "host_report");
}

asio::awaitable<result<std::vector<janitor_action>>> backend::async_janitor(bool) {
    co_return not_supported(name(), "janitor");
}

asio::awaitable<result<process>> backend::async_spawn(std::string, exec_request) {
    co_return not_supported(name(), "spawn");
}

asio::awaitable<result<void>> backend::async_signal(std::string, std::uint64_t, int) {
    co_return not_supported(name(), "signal");
}

asio::awaitable<result<std::vector<file_write_result>>> backend::async_write_files(
    std::string, std::vector<file_write>) {
    co_return not_supported(name(), "write_files");
}

asio::awaitable<result<std::vector<file_read_result>>> backend::async_read_files(
    std::string, std::vector<std::string>) {
    co_return not_supported(name(), "read_files");
}

asio::awaitable<result<file_stat>> backend::async_stat(std::string, std::string) {
    co_return not_supported(name(), "stat");
}

asio::awaitable<result<std::vector<dir_entry>>> backend::async_list_dir(std::string, std::string) {
    co_return not_supported(name(), "list_dir");
}

}  // namespace moat
