#include "e2b/envd_files.hpp"

#include <moat/backend.hpp>
#include <moat/with_timeout.hpp>

#include "core/cancellation.hpp"
#include "core/exception_boundary.hpp"
#include "e2b/envd_process_stream.hpp"
#include "e2b_protocol/filesystem_messages.hpp"

#include <asio/this_coro.hpp>

#include <algorithm>
#include <charconv>
#include <random>

namespace moat::e2b {
namespace {

namespace protocol = e2b_protocol;
using protocol::entry_info;

constexpr std::size_t max_path_bytes = 4095;
constexpr std::size_t max_error_body_bytes = 64 * 1024;
// A ListDir reply: max_dir_entries entries of at most this much JSON each.
constexpr std::size_t listing_bytes_per_entry = 8 * 1024;
constexpr int max_symlink_hops = 8;

result<void> check_path(const std::string& path) {
    if (path.empty() || path.front() != '/')
        return make_error(errc::invalid_path, "'" + path + "': not an absolute path");
    if (path.find('\0') != std::string::npos)
        return make_error(errc::invalid_path, "the path contains a NUL byte");
    if (path.size() > max_path_bytes)
        return make_error(errc::invalid_path, "the path is longer than 4095 bytes");
    return {};
}

// A failure that is not about this path: the batch as a whole fails with it.
bool is_whole_call(const error& e) {
    return e.code == errc::sandbox_unavailable || e.code == errc::sandbox_not_found ||
           e.code == errc::unauthorized || e.code == errc::cancelled;
}

error path_error(error e, const std::string& path) {
    if (e.code == errc::invalid_argument) e.code = make_error_code(errc::invalid_path);
    if (e.code == errc::rate_limited) e.code = make_error_code(errc::too_large);
    e.detail = path + ": " + e.detail;
    return e;
}

std::string parent_of(const std::string& path) {
    const auto slash = path.find_last_of('/');
    if (slash == 0 || slash == std::string::npos) return "/";
    return path.substr(0, slash);
}

std::string hex_token() {
    static thread_local std::mt19937_64 generator{std::random_device{}()};
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    for (int i = 0; i < 16; ++i) out.push_back(hex[generator() & 15]);
    return out;
}

std::string files_target(const envd_client::state& s, const std::string& path) {
    protocol::files_query query;
    query.path = path;
    if (!s.endpoint.user.empty()) query.username = s.endpoint.user;
    return "/files?" + protocol::encode_files_query(query);
}

asio::awaitable<result<entry_info>> stat_entry(state_ptr s, std::string path) {
    auto json = protocol::encode_path_request(path);
    const auto limit = deadline::after(s->options.request_timeout);
    auto reply = co_await async_unary(s, "filesystem.Filesystem/Stat", std::move(json), limit);
    if (!reply) co_return path_error(std::move(reply).error(), path);
    auto entry = protocol::parse_entry_response(*reply);
    if (!entry) co_return path_error(std::move(entry).error(), path);
    co_return std::move(*entry);
}

// The regular file a path names, following final symlinks inside the sandbox.
asio::awaitable<result<entry_info>> regular_file(state_ptr s, std::string path) {
    std::string at = path;
    for (int hop = 0; hop <= max_symlink_hops; ++hop) {
        auto entry = co_await stat_entry(s, at);
        if (!entry) {
            auto e = std::move(entry).error();
            if (at != path) e.detail = path + ": (through a symlink) " + e.detail;
            co_return e;
        }
        if (entry->symlink_target && hop < max_symlink_hops) {
            // moat serve reports the target absolute; a relative one is relative to the link.
            const auto& next = *entry->symlink_target;
            if (!next.empty() && next.front() == '/')
                at = next;
            else
                at = parent_of(at) + "/" + next;
            continue;
        }
        const auto type = protocol::to_file_type(entry->type);
        if (type == file_type::directory)
            co_return make_error(errc::is_directory, path + ": is a directory");
        if (type != file_type::regular)
            co_return make_error(errc::invalid_path, path + ": not a regular file");
        co_return std::move(*entry);
    }
    co_return make_error(errc::invalid_path, path + ": too many levels of symbolic links");
}

asio::awaitable<void> remove_quietly(state_ptr s, std::string path) {
    co_await asio::this_coro::reset_cancellation_state();
    auto json = protocol::encode_path_request(path);
    const auto limit = deadline::after(s->options.request_timeout);
    (void)co_await async_unary(s, "filesystem.Filesystem/Remove", std::move(json), limit);
}

asio::awaitable<result<void>> change_mode(state_ptr s, std::string path, std::uint32_t mode) {
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", mode & 0777u);
    exec_request request;
    request.argv = {"/bin/chmod", octal, "--", path};
    request.wall_limit = s->options.request_timeout;
    auto stream = co_await async_start_exec_stream(s, std::move(request));
    if (!stream) co_return std::move(stream).error();
    output_limits limits;
    limits.head_bytes = 512;
    limits.tail_bytes = 0;
    auto ran = co_await async_collect(std::move(*stream), limits);
    if (!ran) co_return std::move(ran).error();
    if (ran->exit_code != 0) {
        co_return make_error(errc::backend_failure,
                             "chmod " + std::string(octal) + " failed: " + ran->err.head);
    }
    co_return result<void>{};
}

struct upload_state {
    byte_source source;
    std::string path;
    std::uint64_t max_bytes = 0;
    std::uint64_t written = 0;
    std::optional<error> source_error;
    file_metadata metadata;  // normalized; sent as X-Metadata-<key> headers
};

asio::awaitable<result<std::string>> pull(std::shared_ptr<upload_state> u) {
    result<std::string> next = std::string();
    std::exception_ptr failure;
    try {
        auto got = co_await u->source();
        next = std::move(got);
    } catch (...) {
        failure = std::current_exception();
    }
    if (failure) next = error_from_exception(failure);
    if (!next) {
        u->source_error = next.error();
        co_return next.error();
    }
    u->written += next->size();
    if (u->written > u->max_bytes) {
        auto e = make_error(errc::too_large, "the file is over its cap of " +
                                                 std::to_string(u->max_bytes) + " bytes");
        u->source_error = e;
        co_return e;
    }
    co_return std::move(*next);
}

// POST /files?path=<tmp> with the source's bytes. The per-path outcome, or a whole-call error.
asio::awaitable<result<void>> upload(state_ptr s, std::string tmp,
                                     std::shared_ptr<upload_state> u) {
    auto request = envd_request(*s, "POST", files_target(*s, tmp));
    request.headers.add("Content-Type", "application/octet-stream");
    for (const auto& [key, value] : u->metadata) request.headers.add("X-Metadata-" + key, value);
    request.body_stream = [u]() { return pull(u); };
    request.is_stream = true;  // paced by the caller's source: the stream budget
    const auto per_mib = std::chrono::seconds(u->max_bytes / (1024 * 1024) + 1);
    request.limit = deadline::after(s->options.request_timeout + per_mib);
    auto sent = co_await s->http->async_send(std::move(request));
    if (u->source_error) {
        auto e = *u->source_error;
        if (e.code != errc::cancelled) e.detail = u->path + ": " + e.detail;
        co_return e;
    }
    if (!sent) co_return path_error(std::move(sent).error(), u->path);
    auto body = co_await sent->async_read_body(max_error_body_bytes);
    if (sent->status() != 200) {
        std::string text;
        if (body) text = std::move(*body);
        co_return envd_http_error(sent->status(), text, u->path);
    }
    if (!body) co_return path_error(std::move(body).error(), u->path);
    co_return result<void>{};
}

asio::awaitable<result<void>> write_one(state_ptr s, file_write_target target, byte_source source) {
    auto valid = check_path(target.path);
    if (!valid) co_return std::move(valid).error();
    const std::string& path = target.path;
    if (path == "/" || path.back() == '/')
        co_return make_error(errc::is_directory, path + ": is a directory");
    auto metadata = normalize_file_metadata(target.metadata);
    if (!metadata) {
        auto e = std::move(metadata).error();
        e.detail = path + ": " + e.detail;
        co_return e;
    }
    auto existing = co_await stat_entry(s, path);
    if (existing && existing->type == protocol::entry_type::directory && !existing->symlink_target)
        co_return make_error(errc::is_directory, path + ": is a directory");
    if (!existing && existing.error().code != errc::file_not_found)
        co_return std::move(existing).error();
    const std::string dir = parent_of(path);
    if (!target.create_parents) {
        auto parent = co_await stat_entry(s, dir);
        if (!parent && parent.error().code == errc::file_not_found)
            co_return make_error(errc::file_not_found,
                                 path + ": the directory " + dir + " does not exist");
        if (!parent) co_return std::move(parent).error();
        if (parent->type != protocol::entry_type::directory)
            co_return make_error(errc::file_not_found, path + ": " + dir + " is not a directory");
    }
    std::string tmp = dir;
    if (tmp.back() != '/') tmp += '/';
    tmp += ".moat-upload-" + hex_token();
    auto u = std::make_shared<upload_state>();
    u->source = std::move(source);
    u->path = path;
    u->max_bytes = target.max_bytes;
    u->metadata = std::move(*metadata);
    // Whatever ends the upload (an exception too: a cancellation seen at a co_await inside the
    // HTTP client or the source), the temporary file is removed below.
    result<void> uploaded;
    std::exception_ptr failure;
    try {
        auto done = co_await upload(s, tmp, u);
        uploaded = std::move(done);
    } catch (...) {
        failure = std::current_exception();
    }
    if (failure) uploaded = error_from_exception(failure);
    if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
        co_await asio::this_coro::reset_cancellation_state();
        co_await remove_quietly(s, tmp);
        co_return make_error(errc::cancelled, path + ": the write was cancelled");
    }
    if (!uploaded) {
        auto e = std::move(uploaded).error();
        co_await asio::this_coro::reset_cancellation_state();
        co_await remove_quietly(s, tmp);
        if (e.code == errc::cancelled) e.detail = path + ": the write was cancelled";
        co_return e;
    }
    if (!u->metadata.empty()) {
        // An envd before 0.6.2 ignores the headers: make sure the metadata is there.
        auto kept = co_await stat_entry(s, tmp);
        if (!kept || kept->metadata != u->metadata) {
            auto e = kept ? make_error(errc::not_supported,
                                       path +
                                           ": envd did not keep the file's metadata (it needs "
                                           "envd 0.6.2 or later and a filesystem with "
                                           "extended attributes)")
                          : path_error(std::move(kept).error(), path);
            co_await remove_quietly(s, tmp);
            co_return e;
        }
    }
    if ((target.mode & 0777u) != 0644u) {
        auto moded = co_await change_mode(s, tmp, target.mode);
        if (!moded) {
            auto e = path_error(std::move(moded).error(), path);
            co_await remove_quietly(s, tmp);
            co_return e;
        }
    }
    auto json = protocol::encode_move_request({tmp, path});
    const auto limit = deadline::after(s->options.request_timeout);
    auto moved = co_await async_unary(s, "filesystem.Filesystem/Move", std::move(json), limit);
    if (!moved) {
        auto e = path_error(std::move(moved).error(), path);
        co_await remove_quietly(s, tmp);
        co_return e;
    }
    co_return result<void>{};
}

// The Stat and the GET are two requests: the file may grow, shrink or be replaced in between.
// A body longer or shorter than the Stat said is this error, never a file cut to that size.
error changed_error(const std::string& path, std::uint64_t stat_size, std::uint64_t returned,
                    bool is_at_least) {
    std::string returned_text = std::to_string(returned);
    if (is_at_least) returned_text = "at least " + returned_text;
    return make_error(errc::backend_failure,
                      "file " + path + " changed while it was read (stat said " +
                          std::to_string(stat_size) + " bytes, the read returned " + returned_text +
                          ")");
}

// The GET's body as the file's chunks. Its last bytes (or, for an empty file, its end) are handed
// out only once the body is known to end there, so a body of another length fails the pull that
// would have completed the file.
class envd_read_stream final : public file_read_stream::impl {
  public:
    envd_read_stream(http::response response, std::string path, std::uint64_t size,
                     std::chrono::milliseconds timeout)
        : response_(std::move(response)), path_(std::move(path)), size_(size), timeout_(timeout) {}

    asio::awaitable<result<std::string>> async_next() override {
        if (finished_) {
            co_return make_error(errc::invalid_argument, path_ + ": the read stream has ended");
        }
        while (offset_ == held_.size() && received_ < size_) {
            auto piece = co_await read_piece();
            if (!piece) co_return fail(std::move(piece).error());
            if (piece->empty()) co_return fail(changed_error(path_, size_, received_, false));
            if (piece->size() > size_ - received_) {
                co_return fail(changed_error(path_, size_, received_ + piece->size(), true));
            }
            received_ += piece->size();
            held_.assign(piece->data(), piece->size());
            offset_ = 0;
        }
        const auto n = std::min(file_stream_chunk_bytes, held_.size() - offset_);
        if (offset_ + n == held_.size() && received_ == size_ && !is_end_confirmed_) {
            auto piece = co_await read_piece();
            if (!piece) co_return fail(std::move(piece).error());
            if (!piece->empty()) {
                co_return fail(changed_error(path_, size_, size_ + piece->size(), true));
            }
            is_end_confirmed_ = true;
            response_.reset();  // the body has ended: its connection goes back to the pool
        }
        if (n == 0) {
            finished_ = true;
            co_return std::string();
        }
        std::string chunk = held_.substr(offset_, n);
        offset_ += n;
        co_return chunk;
    }

  private:
    asio::awaitable<result<std::string_view>> read_piece() {
        const auto limit = deadline::after(timeout_);
        auto op = response_->async_read_some();
        auto piece = co_await with_timeout(std::move(op), limit);
        if (!piece) {
            auto e = std::move(piece).error();
            if (e.code != errc::cancelled) e.detail = path_ + ": " + e.detail;
            co_return e;
        }
        co_return *piece;
    }

    error fail(error e) {
        finished_ = true;
        response_.reset();
        return e;
    }

    std::optional<http::response> response_;
    std::string path_;
    std::uint64_t size_;
    std::chrono::milliseconds timeout_;
    std::uint64_t received_ = 0;  // body bytes taken into held_
    std::string held_;
    std::size_t offset_ = 0;  // of held_, handed out
    bool is_end_confirmed_ = false;
    bool finished_ = false;
};

// The response's Content-Length, when it declares one.
std::optional<std::uint64_t> declared_length(const http::response& r) {
    const auto text = r.headers().find("Content-Length");
    if (!text) return std::nullopt;
    std::uint64_t value = 0;
    const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
    if (ec != std::errc() || end != text->data() + text->size()) return std::nullopt;
    return value;
}

asio::awaitable<result<std::string>> next_slice(const std::string* content,
                                                std::shared_ptr<std::size_t> offset) {
    constexpr std::size_t slice = 1024 * 1024;
    const auto n = std::min(slice, content->size() - *offset);
    std::string out = content->substr(*offset, n);
    *offset += n;
    co_return out;
}

}  // namespace

asio::awaitable<result<file_write_result>> async_envd_write_stream(state_ptr s,
                                                                   file_write_target target,
                                                                   byte_source source) {
    auto executor = co_await asio::this_coro::executor;
    s->bind(executor);
    file_write_result out;
    out.path = target.path;
    auto written = co_await write_one(s, std::move(target), std::move(source));
    if (!written && is_whole_call(written.error())) co_return std::move(written).error();
    out.outcome = std::move(written);
    co_return out;
}

asio::awaitable<result<std::vector<file_write_result>>> async_envd_write_files(
    state_ptr s, std::vector<file_write> files) {
    auto executor = co_await asio::this_coro::executor;
    s->bind(executor);
    const auto& limits = s->options.files;
    if (files.size() > limits.max_files) {
        co_return make_error(errc::too_large, "the batch has " + std::to_string(files.size()) +
                                                  " files, more than " +
                                                  std::to_string(limits.max_files));
    }
    std::uint64_t total = 0;
    for (const auto& f : files) total += f.content.size();
    if (total > limits.max_batch_bytes) {
        co_return make_error(errc::too_large, "the batch writes " + std::to_string(total) +
                                                  " bytes, more than " +
                                                  std::to_string(limits.max_batch_bytes));
    }
    std::vector<file_write_result> results;
    for (auto& f : files) {
        file_write_result r;
        r.path = f.path;
        if (f.content.size() > limits.max_file_bytes) {
            r.outcome = make_error(
                errc::too_large, f.path + ": " + std::to_string(f.content.size()) +
                                     " bytes, more than " + std::to_string(limits.max_file_bytes));
            results.push_back(std::move(r));
            continue;
        }
        file_write_target target;
        target.path = f.path;
        target.mode = f.mode;
        target.max_bytes = limits.max_file_bytes;
        auto offset = std::make_shared<std::size_t>(0);
        const std::string* content = &f.content;
        byte_source source = [content, offset]() { return next_slice(content, offset); };
        auto written = co_await write_one(s, std::move(target), std::move(source));
        if (!written && is_whole_call(written.error())) co_return std::move(written).error();
        r.outcome = std::move(written);
        results.push_back(std::move(r));
    }
    co_return results;
}

asio::awaitable<result<file_read_stream>> async_envd_read_stream(state_ptr s, std::string path) {
    auto valid = check_path(path);
    if (!valid) co_return std::move(valid).error();
    auto entry = co_await regular_file(s, path);
    if (!entry) co_return std::move(entry).error();
    auto request = envd_request(*s, "GET", files_target(*s, path));
    request.is_stream = true;  // read at the caller's pace: the stream budget
    const auto head_limit = deadline::after(s->options.request_timeout);
    auto sent = co_await async_send_within(s, std::move(request), head_limit);
    if (!sent) co_return path_error(std::move(sent).error(), path);
    if (sent->status() != 200) {
        const int status = sent->status();
        auto body = co_await sent->async_read_body(max_error_body_bytes);
        std::string text;
        if (body) text = std::move(*body);
        co_return envd_http_error(status, text, path);
    }
    file_stat st;
    st.path = path;
    st.type = file_type::regular;
    st.size = static_cast<std::uint64_t>(entry->size);
    st.mode = entry->mode;
    if (const auto length = declared_length(*sent); length && *length != st.size) {
        co_return changed_error(path, st.size, *length, false);
    }
    auto impl = std::make_unique<envd_read_stream>(std::move(*sent), path, st.size,
                                                   s->options.request_timeout);
    co_return file_read_stream(std::move(st), std::move(impl));
}

asio::awaitable<result<std::vector<file_read_result>>> async_envd_read_files(
    state_ptr s, std::vector<std::string> paths) {
    const auto& limits = s->options.files;
    if (paths.size() > limits.max_files) {
        co_return make_error(errc::too_large, "the batch has " + std::to_string(paths.size()) +
                                                  " paths, more than " +
                                                  std::to_string(limits.max_files));
    }
    std::vector<file_read_result> results;
    std::uint64_t budget = limits.max_batch_bytes;
    for (auto& path : paths) {
        file_read_result r;
        r.path = path;
        auto stream = co_await async_envd_read_stream(s, path);
        if (!stream) {
            if (is_whole_call(stream.error())) co_return std::move(stream).error();
            r.content = std::move(stream).error();
            results.push_back(std::move(r));
            continue;
        }
        const auto size = stream->stat().size;
        if (size > limits.max_file_bytes) {
            r.content = make_error(errc::too_large, path + ": " + std::to_string(size) +
                                                        " bytes, more than " +
                                                        std::to_string(limits.max_file_bytes));
        } else if (size > budget) {
            r.content =
                make_error(errc::too_large, path + ": the batch reached its " +
                                                std::to_string(limits.max_batch_bytes) + " bytes");
        } else {
            std::string content;
            content.reserve(static_cast<std::size_t>(size));
            result<std::string> outcome = std::string();
            for (;;) {
                auto chunk = co_await stream->async_next();
                if (!chunk) {
                    outcome = std::move(chunk).error();
                    break;
                }
                if (chunk->empty()) break;
                content += *chunk;
            }
            if (!outcome && is_whole_call(outcome.error())) co_return std::move(outcome).error();
            if (outcome) {
                budget -= content.size();
                outcome = std::move(content);
            }
            r.content = std::move(outcome);
        }
        results.push_back(std::move(r));
    }
    co_return results;
}

asio::awaitable<result<file_stat>> async_envd_stat(state_ptr s, std::string path) {
    auto valid = check_path(path);
    if (!valid) co_return std::move(valid).error();
    auto entry = co_await stat_entry(s, path);
    if (!entry) co_return std::move(entry).error();
    file_stat st;
    st.path = path;
    if (entry->symlink_target) {
        st.type = file_type::symlink;
        st.size = entry->symlink_target->size();
        st.mode = 0777;
        co_return st;
    }
    st.type = protocol::to_file_type(entry->type);
    st.size = static_cast<std::uint64_t>(entry->size);
    st.mode = entry->mode;
    co_return st;
}

asio::awaitable<result<std::vector<file_metadata_result>>> async_envd_read_metadata(
    state_ptr s, std::vector<std::string> paths) {
    const auto max_files = s->options.files.max_files;
    if (paths.size() > max_files)
        co_return make_error(errc::too_large, std::to_string(paths.size()) +
                                                  " paths exceed the batch limit of " +
                                                  std::to_string(max_files));
    std::vector<file_metadata_result> out;
    out.reserve(paths.size());
    for (auto& path : paths) {
        file_metadata_result one;
        one.path = path;
        // envd's Stat reads the metadata through a final symlink (its target's), as moat's own
        // rule says.
        if (auto valid = check_path(path); !valid) {
            one.metadata = std::move(valid).error();
        } else if (auto entry = co_await stat_entry(s, path); !entry) {
            if (is_whole_call(entry.error())) co_return std::move(entry).error();
            one.metadata = std::move(entry).error();
        } else {
            one.metadata = std::move(entry->metadata);
        }
        out.push_back(std::move(one));
    }
    co_return out;
}

asio::awaitable<result<std::vector<dir_entry>>> async_envd_list_dir(state_ptr s, std::string path) {
    auto valid = check_path(path);
    if (!valid) co_return std::move(valid).error();
    const auto max_entries = s->options.files.max_dir_entries;
    auto json = protocol::encode_list_dir_request({path, 1});
    const auto limit = deadline::after(s->options.request_timeout);
    const std::size_t cap = max_unary_reply_bytes + max_entries * listing_bytes_per_entry;
    auto reply =
        co_await async_unary(s, "filesystem.Filesystem/ListDir", std::move(json), limit, cap);
    if (!reply) co_return path_error(std::move(reply).error(), path);
    auto entries = protocol::parse_list_dir_response(*reply, max_entries);
    if (!entries) co_return path_error(std::move(entries).error(), path);
    std::vector<dir_entry> out;
    out.reserve(entries->size());
    for (auto& e : *entries) {
        dir_entry d;
        d.name = std::move(e.name);
        if (e.symlink_target) {
            d.type = file_type::symlink;
            d.size = e.symlink_target->size();
        } else {
            d.type = protocol::to_file_type(e.type);
            d.size = static_cast<std::uint64_t>(e.size);
        }
        out.push_back(std::move(d));
    }
    std::sort(out.begin(), out.end(),
              [](const dir_entry& a, const dir_entry& b) { return a.name < b.name; });
    co_return out;
}

}  // namespace moat::e2b
