// File access in the local backend's sandboxes (local_backend_impl.hpp is the contract between its
// files): the batch calls run inline on the executor (sandbox_files.hpp does the work); a streamed
// read or write runs each step as one job on the backend's file threads, on a root descriptor of
// its own, and looks at the caller's cancellation between steps.
#include "local/local_backend_impl.hpp"

#include "core/blocking_job.hpp"
#include "core/cancellation.hpp"
#include "core/exception_boundary.hpp"
#include "local/agent_channel.hpp"
#include "wire/protocol.hpp"

#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>

#include <fcntl.h>
#include <algorithm>
#include <functional>

namespace moat {

// A sandbox's root descriptor of its own, duplicated on the executor before a file job starts, so
// that the backend closing the sandbox's (at its end) can never leave a job with a number that
// names another directory.
struct pinned_root {
    unique_fd fd;
    uid_t uid = 0;
    gid_t gid = 0;
    uid_t root_uid = 0;
    gid_t root_gid = 0;
    sandbox_root view() const { return sandbox_root{fd.get(), uid, gid, root_uid, root_gid}; }
};

namespace {

error cancelled_error(const std::string& what) {
    return make_error(errc::cancelled, what + " was cancelled by the caller");
}

// A streamed read: each pull is one read() on the backend's file threads.
class local_read_stream final : public file_read_stream::impl {
  public:
    local_read_stream(asio::thread_pool& pool, std::shared_ptr<stream_reader> reader)
        : pool_(pool), reader_(std::move(reader)) {}

    asio::awaitable<result<std::string>> async_next() override {
        if (finished_) co_return make_error(errc::invalid_argument, "the stream has ended");
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            finished_ = true;
            co_return cancelled_error("reading " + reader_->stat().path);
        }
        std::function<result<std::string>()> work = [reader = reader_] {
            return reader->read(file_stream_chunk_bytes);
        };
        auto job = async_blocking_job<std::string>(pool_, std::move(work));
        auto chunk = co_await std::move(job);
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            finished_ = true;
            co_return cancelled_error("reading " + reader_->stat().path);
        }
        if (!chunk || chunk->empty()) finished_ = true;
        co_return chunk;
    }

  private:
    asio::thread_pool& pool_;
    std::shared_ptr<stream_reader> reader_;
    bool finished_ = false;
};

// Opens a stream_writer or stream_reader under `root` as one job on the file threads.
template <class Stream, class Target>
asio::awaitable<result<std::shared_ptr<Stream>>> open_stream(asio::thread_pool& pool,
                                                             std::shared_ptr<pinned_root> root,
                                                             Target target) {
    std::function<result<std::shared_ptr<Stream>>()> work =
        [root = std::move(root), target = std::move(target)]() -> result<std::shared_ptr<Stream>> {
        auto opened = Stream::open(root->view(), target);
        if (!opened) return std::move(opened).error();
        return std::shared_ptr<Stream>(std::move(*opened));
    };
    auto job = async_blocking_job<std::shared_ptr<Stream>>(pool, std::move(work));
    co_return co_await std::move(job);
}

}  // namespace

template <class T, class... Arguments>
result<T> local_backend::on_file_root(const std::string& id,
                                      result<T> (*operation)(const sandbox_root&,
                                                             const Arguments&...),
                                      const Arguments&... arguments) {
    try {
        auto root = file_root(id);
        if (!root) return std::move(root).error();
        return operation(*root, arguments...);
    } catch (...) {
        return error_from_exception(std::current_exception());
    }
}

asio::awaitable<result<std::vector<file_write_result>>> local_backend::async_write_files(
    std::string id, std::vector<file_write> files) {
    const file_limits limits;
    co_return on_file_root(id, &write_files, files, limits);
}

asio::awaitable<result<std::vector<file_read_result>>> local_backend::async_read_files(
    std::string id, std::vector<std::string> paths) {
    const file_limits limits;
    co_return on_file_root(id, &read_files, paths, limits);
}

asio::awaitable<result<file_write_result>> local_backend::async_write_file_stream(
    std::string id, file_write_target target, byte_source source) {
    return guarded(write_stream(std::move(id), std::move(target), std::move(source)));
}

asio::awaitable<result<file_read_stream>> local_backend::async_read_file_stream(std::string id,
                                                                                std::string path) {
    return guarded(open_read_stream(std::move(id), std::move(path)));
}

asio::awaitable<result<file_stat>> local_backend::async_stat(std::string id, std::string path) {
    co_return on_file_root(id, &stat_path, path);
}

asio::awaitable<result<std::vector<file_metadata_result>>> local_backend::async_read_metadata(
    std::string id, std::vector<std::string> paths) {
    const file_limits limits;
    co_return on_file_root(id, &read_metadata, paths, limits);
}

asio::awaitable<result<std::vector<dir_entry>>> local_backend::async_list_dir(std::string id,
                                                                              std::string path) {
    const file_limits limits;
    co_return on_file_root(id, &list_dir, path, limits);
}

asio::awaitable<result<file_write_result>> local_backend::write_stream(std::string id,
                                                                       file_write_target target,
                                                                       byte_source source) {
    auto pinned = pin_root(id);
    if (!pinned) co_return std::move(pinned).error();
    file_write_result out;
    out.path = target.path;
    if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
        co_await asio::this_coro::reset_cancellation_state();
        co_return cancelled_error("writing " + target.path);
    }
    auto open_job = open_stream<stream_writer>(file_pool(), *pinned, target);
    auto opened = co_await std::move(open_job);
    if (!opened) {
        out.outcome = std::move(opened).error();
        co_return out;
    }
    std::shared_ptr<stream_writer> writer = std::move(*opened);
    std::function<result<void>()> abandon_work = [writer]() -> result<void> {
        writer->abandon();
        return {};
    };
    std::optional<error> failed;  // the whole call's error
    for (;;) {
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            failed = cancelled_error("writing " + target.path);
            break;
        }
        std::exception_ptr thrown;
        result<std::string> chunk = make_error(errc::cancelled, "not pulled");
        try {
            auto pull = source();
            chunk = co_await std::move(pull);
        } catch (...) {
            thrown = std::current_exception();
        }
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            failed = cancelled_error("writing " + target.path);
            break;
        }
        if (thrown) chunk = error_from_exception(thrown);
        if (!chunk) {
            out.outcome = error{chunk.error().code,
                                target.path + ": the source failed: " + chunk.error().detail};
            break;
        }
        if (auto alive = file_root(id); !alive) {
            failed = std::move(alive).error();
            break;
        }
        if (chunk->empty()) {
            std::function<result<void>()> commit_work = [writer] { return writer->commit(); };
            auto commit_job = async_blocking_job<void>(file_pool(), std::move(commit_work));
            out.outcome = co_await std::move(commit_job);
            co_return out;
        }
        auto data = std::make_shared<std::string>(std::move(*chunk));
        std::function<result<void>()> append_work = [writer, data] {
            return writer->append(*data);
        };
        auto append_job = async_blocking_job<void>(file_pool(), std::move(append_work));
        auto appended = co_await std::move(append_job);
        if (!appended) {
            out.outcome = std::move(appended);
            break;
        }
    }
    // Removed before the call completes, so the caller never sees a temporary file left.
    if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
        co_await asio::this_coro::reset_cancellation_state();
    }
    auto abandon_job = async_blocking_job<void>(file_pool(), std::move(abandon_work));
    auto abandoned = co_await std::move(abandon_job);
    (void)abandoned;
    if (failed) co_return std::move(*failed);
    co_return out;
}

asio::awaitable<result<file_read_stream>> local_backend::open_read_stream(std::string id,
                                                                          std::string path) {
    auto pinned = pin_root(id);
    if (!pinned) co_return std::move(pinned).error();
    auto open_job = open_stream<stream_reader>(file_pool(), *pinned, path);
    auto opened = co_await std::move(open_job);
    if (!opened) co_return std::move(opened).error();
    file_stat info = (*opened)->stat();
    auto stream = std::make_unique<local_read_stream>(file_pool(), std::move(*opened));
    co_return file_read_stream(std::move(info), std::move(stream));
}

asio::thread_pool& local_backend::file_pool() {
    if (!file_pool_) {
        file_pool_ =
            std::make_unique<asio::thread_pool>(std::max<std::size_t>(options_.file_threads, 1));
    }
    return *file_pool_;
}

result<std::shared_ptr<pinned_root>> local_backend::pin_root(const std::string& id) {
    auto root = file_root(id);
    if (!root) return std::move(root).error();
    auto pinned = std::make_shared<pinned_root>();
    pinned->fd.reset(::fcntl(root->root_fd, F_DUPFD_CLOEXEC, 0));
    if (!pinned->fd.is_open()) {
        return make_error(errc::limit_exceeded,
                          "the application is out of file descriptors (RLIMIT_NOFILE)");
    }
    pinned->uid = root->uid;
    pinned->gid = root->gid;
    pinned->root_uid = root->root_uid;
    pinned->root_gid = root->root_gid;
    return pinned;
}

result<sandbox_root> local_backend::file_root(const std::string& id) {
    auto found = find(id);
    if (!found) return std::move(found).error();
    const local_sandbox& sandbox = **found;
    if (sandbox.gone_reason) return make_error(errc::sandbox_unavailable, *sandbox.gone_reason);
    if (sandbox.agent && sandbox.agent->broken())
        return make_error(errc::sandbox_unavailable, *sandbox.agent->broken());
    if (!sandbox.root.is_open())
        return make_error(errc::sandbox_unavailable, "sandbox " + id + " is not ready yet");
    // The helper's `reaped` report may still be on its way.
    if (!sandbox.pidfd.is_open() || has_exited(sandbox.pidfd.get()))
        return make_error(errc::sandbox_unavailable, "the sandbox's pid 1 exited");
    const std::uint32_t uid_base = sandbox.record.uid_base;
    return sandbox_root{sandbox.root.get(), uid_base + wire::sandbox_user_id,
                        uid_base + wire::sandbox_group_id, uid_base, uid_base};
}

}  // namespace moat
