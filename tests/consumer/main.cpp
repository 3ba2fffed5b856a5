// Runs Python in a sandbox through an installed moat: exits 0 when it printed 42, else 1.
#include <moat/local_backend.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

namespace {

// A named coroutine with a named local for every co_await argument (g++ 12: docs/development.md).
asio::awaitable<int> print_42(moat::backend& sandboxes) {
    moat::sandbox_spec spec;
    auto box = co_await sandboxes.async_create(spec);
    if (!box) {
        std::fprintf(stderr, "create failed: %s\n", box.error().to_string().c_str());
        co_return 1;
    }
    const std::string id = box->id;
    moat::exec_request request;
    request.argv = {"python3", "-c", "print(6*7)"};
    request.wall_limit = std::chrono::seconds(10);
    auto ran = co_await sandboxes.async_exec(id, request);
    auto destroyed = co_await sandboxes.async_destroy(id);
    if (!ran) std::fprintf(stderr, "exec failed: %s\n", ran.error().to_string().c_str());
    if (!destroyed) {
        std::fprintf(stderr, "destroy failed: %s\n", destroyed.error().to_string().c_str());
    }
    if (!ran || !destroyed) co_return 1;
    std::printf("python3 printed: %s", ran->out.text().c_str());
    if (ran->exit_code == 0 && ran->out.text() == "42\n") co_return 0;
    co_return 1;
}

}  // namespace

int main() {
    asio::io_context io;
    auto sandboxes = moat::make_local_backend(io.get_executor());
    int code = 1;
    asio::co_spawn(io, print_42(*sandboxes), [&code, &io](std::exception_ptr failure, int value) {
        if (!failure) code = value;
        io.stop();  // the backend keeps work on the context until it is destroyed
    });
    io.run_for(std::chrono::seconds(60));
    return code;
}
