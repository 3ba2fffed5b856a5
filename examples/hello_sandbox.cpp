// The smallest embedding of moat: create a sandbox through a runtime (admission control) and its
// handle (ordered operations, deadlines, quarantine), run Python in it twice (files persist between
// commands), stream one command's output, and destroy the sandbox.
//
// Build: cmake --build --preset dev --target hello_sandbox; run (as root):
// build/dev/examples/hello_sandbox
#include <moat/local_backend.hpp>
#include <moat/runtime.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <exception>

namespace {

// Named coroutine (not a capturing lambda) and named locals for every co_await argument: g++ 12
// miscompiles the other shapes.
asio::awaitable<int> hello(moat::runtime& sandboxes) {
    moat::sandbox_spec spec;
    spec.limits.memory_bytes = 256ull << 20;
    spec.labels["example"] = "hello";
    auto created = co_await sandboxes.async_create(spec);
    if (!created) {
        std::fprintf(stderr, "create failed: %s\n", created.error().to_string().c_str());
        co_return 1;
    }
    std::shared_ptr<moat::sandbox> box = std::move(*created);
    std::printf("sandbox %s is ready (layers:", box->id().c_str());
    for (const auto& layer : box->info().layers) std::printf(" %s", layer.c_str());
    std::printf(")\n");

    moat::exec_request write;
    write.argv = {"python3", "-c", "open('numbers.txt', 'w').write(' '.join(map(str, range(10))))"};
    auto written = co_await box->async_exec(write);

    moat::exec_request read;
    read.shell = "python3 -c \"print(sum(map(int, open('numbers.txt').read().split())))\"";
    read.wall_limit = std::chrono::seconds(5);
    // A deadline bounds the whole call, time queued included; past it the command is killed.
    const auto limit = moat::deadline::after(std::chrono::seconds(10));
    auto summed = co_await box->async_exec(read, limit);
    if (written && summed) {
        std::printf("sum of the numbers written by the first command: %s",
                    summed->out.text().c_str());
    }

    moat::exec_request count;
    count.shell = "for i in 1 2 3; do echo tick $i; sleep 0.1; done";
    auto stream = co_await box->async_exec_stream(count);
    while (stream) {
        auto next = co_await stream->async_next();
        if (!next) break;
        if (auto* chunk = std::get_if<moat::output_chunk>(&*next)) {
            std::printf("streamed: %s", chunk->data.c_str());
            continue;
        }
        std::printf("exit code %d\n", std::get<moat::exec_result>(*next).exit_code);
        break;
    }

    auto destroyed = co_await box->async_destroy();
    std::printf("destroyed: %s\n", destroyed ? "confirmed" : destroyed.error().to_string().c_str());
    co_return destroyed&& summed && summed->out.text() == "45\n" ? 0 : 1;
}

}  // namespace

int main() {
    asio::io_context io;
    auto local = moat::make_local_backend(io.get_executor());
    moat::runtime sandboxes(*local);
    int code = 1;
    asio::co_spawn(io, hello(sandboxes), [&code, &io](std::exception_ptr failure, int value) {
        code = failure ? 1 : value;
        io.stop();  // the backend keeps work on the context (its helper's reader) until destroyed
    });
    io.run_for(std::chrono::seconds(60));
    return code;
}
