// The three sandbox policies of moat::session_manager, as an agent server uses them:
//
// 1. per session: each conversation keeps one sandbox (files and installed things persist between
//    turns); a lost sandbox is rebuilt and reseeded, and the lease says so;
// 2. per call: an untrusted one-shot request gets a fresh sandbox, destroyed whatever happens;
// 3. pooled: a warm sandbox is a queue pop, handed out once and never reused.
//
// Build: part of the moat build; run: build/dev/examples/session_policies
#include <moat/local_backend.hpp>
#include <moat/session_manager.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <exception>

namespace {

// The seed hook: what every new session sandbox gets before the model sees it.
asio::awaitable<moat::result<void>> seed_session(std::shared_ptr<moat::sandbox> box, bool rebuilt) {
    std::vector<moat::file_write> files(1);
    files[0].path = "/workspace/data.csv";
    files[0].content = "city,population\nLyon,522228\nNantes,320732\n";
    auto written = co_await box->async_write_files(files);
    if (!written) co_return std::move(written).error();
    if (!written->front().outcome) co_return std::move(written->front().outcome).error();
    std::printf("  seeded %s%s\n", box->id().c_str(), rebuilt ? " (rebuilt)" : "");
    co_return moat::result<void>{};
}

moat::exec_request python(const char* code) {
    moat::exec_request request;
    request.argv = {"python3", "-c", code};
    request.wall_limit = std::chrono::seconds(10);
    return request;
}

asio::awaitable<int> demo(moat::session_manager& manager) {
    std::printf("per session: two turns of one conversation share their files\n");
    for (int turn = 1; turn <= 2; ++turn) {
        auto lease = co_await manager.async_acquire("conversation-42");
        if (!lease) {
            std::fprintf(stderr, "acquire: %s\n", lease.error().to_string().c_str());
            co_return 1;
        }
        const char* code = turn == 1 ? "open('/workspace/turns','a').write('x'); print('turn 1')"
                                     : "print('turn', 1 + len(open('/workspace/turns').read()))";
        auto request = python(code);
        auto ran = co_await lease->box->async_exec(request);
        if (!ran) co_return 1;
        std::printf("  sandbox %s: %s", lease->box->id().c_str(), ran->out.text().c_str());
    }

    std::printf("per call: a fresh sandbox for one untrusted request, then gone\n");
    auto once = python("import os; print(sorted(os.listdir('/workspace')))");
    auto one_shot = co_await manager.async_run_once(once);
    if (!one_shot) co_return 1;
    std::printf("  %s", one_shot->out.text().c_str());

    std::printf("pooled: warm sandboxes, each handed out once\n");
    for (int i = 0; i < 2; ++i) {
        auto warm = co_await manager.async_take_warm();
        if (!warm) co_return 1;
        std::printf("  took %s\n", (*warm)->id().c_str());
        (void)co_await (*warm)->async_destroy();
    }

    auto report = co_await manager.async_shutdown();
    std::printf("shutdown: %zu destroyed, %zu left\n", report.destroyed, report.left.size());
    co_return report.left.empty() ? 0 : 1;
}

}  // namespace

int main() {
    asio::io_context io;
    auto local = moat::make_local_backend(io.get_executor());
    moat::runtime sandboxes(*local);
    moat::manager_options options;
    options.seed = [](std::shared_ptr<moat::sandbox> box, bool rebuilt) {
        return seed_session(std::move(box), rebuilt);
    };
    options.pool_size = 2;
    options.on_event = [](const moat::manager_event& e) {
        if (e.what == moat::manager_event::kind::ended && e.reason) {
            std::printf("  [event] %s ended: %s\n", e.sandbox_id.c_str(),
                        moat::to_string(*e.reason));
        }
    };
    moat::session_manager manager(sandboxes, options);
    int code = 1;
    asio::co_spawn(io, demo(manager), [&code, &io](std::exception_ptr failure, int value) {
        code = failure ? 1 : value;
        io.stop();
    });
    io.run_for(std::chrono::seconds(60));
    return code;
}
