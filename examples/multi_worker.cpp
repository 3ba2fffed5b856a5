// Two workers of one agent server sharing conversations: two processes, each with its own local
// backend, runtime, session manager and tool sessions, over one shared session store. Turns of a
// conversation land on either worker; the conversation keeps one sandbox, and its Python
// variables are there whichever worker serves the turn (the interpreter is a resident of the
// sandbox, not of a worker).
//
//   multi_worker [STORE]   STORE: host:DIR (default: host:<a fresh temporary directory>), or a
//                          Redis URL (redis://, rediss://, unix:///path/redis.sock; a password
//                          from MOAT_STORE_PASSWORD)
//
// The parent starts itself twice as `multi_worker --worker NAME STORE`; a worker reads turns on
// stdin ("KEY<TAB>code" with "\n" written as "\\n", or "end<TAB>KEY") and answers each with one
// line. Build: part of the moat build; run: build/dev/examples/multi_worker
#include <moat/local_backend.hpp>
#include <moat/redis_session_store.hpp>
#include <moat/session_manager.hpp>
#include <moat/session_store.hpp>
#include <moat/tools.hpp>

#include <asio/buffers_iterator.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/read_until.hpp>
#include <asio/streambuf.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

std::string unescape(const std::string& text) {
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
            out += '\n';
            ++i;
        } else {
            out += text[i];
        }
    }
    return out;
}

std::string escape(const std::string& text) {
    std::string out;
    for (const char c : text) {
        if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
    return out;
}

// host:DIR, or a Redis URL; nullptr (after saying why) when the URL is not one.
std::shared_ptr<moat::session_store> open_store(const std::string& url,
                                                asio::any_io_executor executor) {
    if (url.rfind("host:", 0) == 0) {
        moat::host_store_options options;
        options.directory = url.substr(5);
        return moat::make_host_session_store(std::move(executor), options);
    }
    auto config = moat::parse_redis_url(url);
    if (!config) {
        std::fprintf(stderr, "store: %s\n", config.error().to_string().c_str());
        return nullptr;
    }
    if (auto loaded = moat::load_redis_password(*config); !loaded) {
        std::fprintf(stderr, "store: %s\n", loaded.error().to_string().c_str());
        return nullptr;
    }
    auto store = moat::make_redis_session_store(std::move(executor), std::move(*config));
    if (!store) {
        std::fprintf(stderr, "store: %s\n", store.error().to_string().c_str());
        return nullptr;
    }
    return std::move(*store);
}

// One worker: answers turns from stdin until it closes.
asio::awaitable<int> serve_turns(moat::backend& local, std::string name, std::string store_url) {
    auto executor = co_await asio::this_coro::executor;
    moat::runtime sandboxes(local);
    moat::manager_options options;
    options.spec.labels["example"] = "multi_worker";
    auto store = open_store(store_url, executor);
    if (!store) co_return 2;
    moat::session_manager manager(sandboxes, options, std::move(store));
    std::map<std::string, std::unique_ptr<moat::tool_session>> conversations;
    asio::posix::stream_descriptor input(executor, ::dup(STDIN_FILENO));
    asio::streambuf buffer(1 << 20);  // a turn is at most 1 MiB
    int code = 0;
    for (;;) {
        std::size_t n = 0;
        try {
            n = co_await asio::async_read_until(input, buffer, '\n', asio::use_awaitable);
        } catch (const std::exception&) {
            break;  // the parent closed our stdin (or a turn was over the cap)
        }
        std::string line(asio::buffers_begin(buffer.data()),
                         asio::buffers_begin(buffer.data()) + n);
        buffer.consume(n);
        line.pop_back();
        const auto tab = line.find('\t');
        if (tab == std::string::npos) continue;
        const std::string first = line.substr(0, tab);
        const std::string rest = line.substr(tab + 1);
        if (first == "end") {
            auto& tools = conversations[rest];
            if (!tools) tools = std::make_unique<moat::tool_session>(manager, rest);
            auto ended = co_await tools->async_end();
            std::printf("%s end %s %s\n", name.c_str(), rest.c_str(),
                        ended ? "ok" : ended.error().to_string().c_str());
        } else {
            auto& tools = conversations[first];
            if (!tools) tools = std::make_unique<moat::tool_session>(manager, first);
            auto ran = co_await tools->async_run_python(unescape(rest));
            if (!ran) {
                std::printf("%s %s error %s\n", name.c_str(), first.c_str(),
                            ran.error().to_string().c_str());
                code = 1;
            } else {
                std::printf("%s %s %s %s\n", name.c_str(), first.c_str(), to_string(ran->status),
                            escape(ran->stdout_text + ran->stderr_text + ran->message).c_str());
            }
        }
        std::fflush(stdout);
    }
    conversations.clear();
    // The store is shared: the shutdown leaves the conversations' sandboxes to the other worker.
    (void)co_await manager.async_shutdown();
    co_return code;
}

int run_worker(const std::string& name, const std::string& store_url) {
    asio::io_context io;
    auto local = moat::make_local_backend(io.get_executor());
    std::optional<int> code;
    asio::co_spawn(io, serve_turns(*local, name, store_url),
                   [&code](std::exception_ptr failure, int c) { code = failure ? 3 : c; });
    // Until the turns are done (the backend keeps work of its own on the context).
    while (!code && io.run_one() > 0) {
    }
    local.reset();
    io.run_for(std::chrono::seconds(1));
    return code.value_or(3);
}

// A worker process, its stdin and its stdout.
struct worker_process {
    pid_t pid = -1;
    FILE* in = nullptr;
    FILE* out = nullptr;
};

worker_process start_worker(const char* self, const std::string& name, const std::string& store) {
    int to_child[2];
    int from_child[2];
    // Close-on-exec: the second worker must not hold the first one's stdin open.
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) return {};
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(to_child[0], STDIN_FILENO);
        ::dup2(from_child[1], STDOUT_FILENO);
        for (const int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
        ::execl(self, self, "--worker", name.c_str(), store.c_str(), nullptr);
        ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    worker_process w;
    w.pid = pid;
    w.in = ::fdopen(to_child[1], "w");
    w.out = ::fdopen(from_child[0], "r");
    return w;
}

// Sends one turn and returns the worker's answer line ("" if it is gone).
std::string turn(worker_process& w, const std::string& line) {
    std::fprintf(w.in, "%s\n", line.c_str());
    std::fflush(w.in);
    char answer[8192];
    if (std::fgets(answer, sizeof answer, w.out) == nullptr) return "";
    std::string text(answer);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    std::printf("  %-40s -> %s\n", line.substr(0, 40).c_str(), text.c_str());
    return text;
}

int stop_worker(worker_process& w) {
    std::fclose(w.in);
    std::fclose(w.out);
    int status = 0;
    ::waitpid(w.pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // the parent's progress, line by line
    if (argc == 4 && std::strcmp(argv[1], "--worker") == 0) return run_worker(argv[2], argv[3]);
    std::string store = argc > 1 ? argv[1] : "";
    if (store.empty()) {
        char dir[] = "/tmp/moat-multi-worker-XXXXXX";
        if (::mkdtemp(dir) == nullptr) return 1;
        store = std::string("host:") + dir;
    }
    ::signal(SIGPIPE, SIG_IGN);
    const std::string key1 = "conversation-1-" + std::to_string(::getpid());
    const std::string key2 = "conversation-2-" + std::to_string(::getpid());
    std::printf("two workers over the store %s\n", store.c_str());
    auto a = start_worker("/proc/self/exe", "A", store);
    auto b = start_worker("/proc/self/exe", "B", store);
    if (a.pid < 0 || b.pid < 0) return 1;
    const std::vector<std::pair<std::string, std::string>> expected = {
        {turn(a, key1 + "\trows = [3, 4]\\nprint(len(rows))"), "A " + key1 + " ok 2\\n"},
        {turn(b, key1 + "\trows.append(5)\\nprint(sum(rows))"), "B " + key1 + " ok 12\\n"},
        {turn(b, key2 + "\tname = 'second'\\nprint(name)"), "B " + key2 + " ok second\\n"},
        {turn(a, key2 + "\tprint(name.upper())"), "A " + key2 + " ok SECOND\\n"},
        {turn(a, key1 + "\tprint(rows)"), "A " + key1 + " ok [3, 4, 5]\\n"},
        {turn(a, "end\t" + key1), "A end " + key1 + " ok"},
        {turn(b, "end\t" + key2), "B end " + key2 + " ok"},
    };
    bool all = true;
    for (const auto& [got, want] : expected) {
        if (got != want) {
            std::printf("unexpected: %s (wanted %s)\n", got.c_str(), want.c_str());
            all = false;
        }
    }
    const int a_code = stop_worker(a);
    const int b_code = stop_worker(b);
    if (!all || a_code != 0 || b_code != 0) return 1;
    std::printf("both workers saw every conversation's variables\n");
    return 0;
}
