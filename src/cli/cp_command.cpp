// moat cp SRC DST: copies one file into or out of a sandbox; exactly one side is ID:/abs/path.
// Binary-safe. "-" is stdin (upload) or stdout (download; on a terminal its control characters
// are shown visibly unless --raw, see terminal_safe.hpp). A destination that is a directory
// (or, in the sandbox, a path ending in "/") receives the source's file name. Downloads are
// written to a temporary file beside the destination and renamed over it once complete, so a
// failed copy never leaves a partial file under the destination's name.
#include <moat/runtime.hpp>

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/host_files.hpp"

#include <moat/files.hpp>

#include <sys/stat.h>
#include <unistd.h>
#include <optional>

namespace moat::cli {
namespace {

struct remote_path {
    std::string id;
    std::string path;
};

struct cp_options {
    std::string local;  // a host path, or "-"
    remote_path remote;
    bool upload = false;
    bool raw = false;  // "-" on a terminal: write control characters unchanged
};

// "ID:/path" when the text before the first ':' is non-empty and has no '/'.
std::optional<remote_path> parse_remote(std::string_view text) {
    const auto colon = text.find(':');
    if (colon == 0 || colon == std::string_view::npos) return std::nullopt;
    if (text.substr(0, colon).find('/') != std::string_view::npos) return std::nullopt;
    return remote_path{std::string(text.substr(0, colon)), std::string(text.substr(colon + 1))};
}

cp_options parse_cp_options(int argc, char** argv) {
    cp_options o;
    if (argc > 0 && std::string_view(argv[0]) == "--raw") {
        o.raw = true;
        --argc;
        ++argv;
    }
    if (argc != 2) throw usage_error("expected SRC DST, one of them ID:/absolute/path");
    auto source = parse_remote(argv[0]);
    auto target = parse_remote(argv[1]);
    if (source.has_value() == target.has_value()) {
        throw usage_error("exactly one of SRC and DST must be a sandbox path (ID:/absolute/path)");
    }
    o.upload = target.has_value();
    o.remote = o.upload ? *target : *source;
    o.local = o.upload ? argv[0] : argv[1];
    if (o.remote.path.empty() || o.remote.path.front() != '/') {
        throw usage_error("the sandbox path must be absolute, got '" + o.remote.path + "'");
    }
    if (o.local.empty()) throw usage_error("empty host path");
    return o;
}

std::string base_name(std::string_view path) {
    while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
    const auto slash = path.rfind('/');
    return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

std::string join(std::string dir, std::string_view name) {
    if (dir.empty() || dir.back() != '/') dir += '/';
    return dir + std::string(name);
}

asio::awaitable<int> upload(backend& b, cp_options o) {
    const file_limits limits;
    std::uint32_t mode = 0644;
    auto data = read_host_input(o.local, limits.max_file_bytes, mode);
    if (!data) co_return report_error("cp", data.error());
    runtime sandboxes(b);
    auto attached = co_await sandboxes.async_attach(o.remote.id);
    if (!attached) co_return report_error("cp", attached.error());
    auto box = std::move(*attached);
    std::string target = o.remote.path;
    const bool names_directory = target.back() == '/';
    bool is_directory = names_directory;
    if (!names_directory) {
        auto st = co_await box->async_stat(target);
        is_directory = st && st->type == file_type::directory;
    }
    if (is_directory) {
        if (o.local == "-") {
            co_return report_error("cp", make_error(errc::invalid_path,
                                                    "copying stdin needs a file name, not the "
                                                    "directory " +
                                                        target));
        }
        target = join(target, base_name(o.local));
    }
    std::vector<file_write> files(1);
    files[0].path = target;
    files[0].content = std::move(*data);
    files[0].mode = mode;
    auto written = co_await box->async_write_files(std::move(files));
    if (!written) co_return report_error("cp", written.error());
    if (!written->front().outcome) co_return report_error("cp", written->front().outcome.error());
    co_return 0;
}

asio::awaitable<int> download(backend& b, cp_options o) {
    runtime sandboxes(b);
    auto attached = co_await sandboxes.async_attach(o.remote.id);
    if (!attached) co_return report_error("cp", attached.error());
    auto box = std::move(*attached);
    std::vector<std::string> paths{o.remote.path};
    auto read = co_await box->async_read_files(std::move(paths));
    if (!read) co_return report_error("cp", read.error());
    auto& content = read->front().content;
    if (!content) co_return report_error("cp", content.error());
    if (o.local == "-") {
        terminal_safe safe;
        const bool written = write_for_terminal(STDOUT_FILENO, *content, safe, o.raw) &&
                             write_for_terminal(STDOUT_FILENO, {}, safe, o.raw);
        co_return written ? 0 : exit_failure;
    }
    std::string target = o.local;
    struct stat st {};
    if (::stat(target.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        target = join(target, base_name(o.remote.path));
    }
    auto saved = write_host_file_atomically(target, *content);
    if (!saved) co_return report_error("cp", saved.error());
    co_return 0;
}

}  // namespace

int cp_command(int argc, char** argv) {
    cp_options options = parse_cp_options(argc, argv);
    return run_with_backend([&options](backend& b) {
        if (options.upload) return upload(b, std::move(options));
        return download(b, std::move(options));
    });
}

}  // namespace moat::cli
