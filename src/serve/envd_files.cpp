// envd's file transfer routes (envd_files.hpp). The sandbox is reached through its handle's
// streaming file calls, which resolve every path inside the sandbox (a planted symlink cannot
// reach the host), run as the sandbox's user, and replace a file atomically.
#include "serve/envd_files.hpp"

#include "serve/envd_entry.hpp"
#include "serve/file_signature.hpp"
#include "serve/multipart.hpp"

#include "core/ascii.hpp"
#include "core/base64.hpp"
#include "core/json_writer.hpp"
#include "http/gzip_decoder.hpp"

#include <moat/log.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <stdexcept>

namespace moat::serve {

// The sandbox layout's home and user (sandbox_layout); the local backend's default user is named
// "user" inside the sandbox.
std::string sandbox_home(const registry_entry& sandbox) {
    const auto& home = sandbox.handle->info().layout.home;
    return home.empty() ? std::string("/workspace") : home;
}

std::string sandbox_user(const registry_entry& sandbox) {
    const auto& user = sandbox.handle->info().layout.user;
    return user.empty() ? std::string("user") : user;
}

std::string user_home(const registry_entry& sandbox, bool as_root) {
    if (as_root) return std::string(root_home);
    return sandbox_home(sandbox);
}

std::optional<std::string> check_rpc_user(const envd_call& call, bool& as_root) {
    as_root = false;
    const auto authorization = call.request.headers().find("authorization");
    if (!authorization) return std::nullopt;
    std::string_view value = *authorization;
    if (value.size() < 6 || !http::iequals(value.substr(0, 6), "basic "))
        return std::string("Authorization is not Basic");
    value.remove_prefix(6);
    if (value.size() > 1024) return std::string("Authorization is too long");
    auto credentials = base64_decode(value, base64_padding::required);
    if (!credentials) return std::string("Authorization is not base64");
    const std::string& decoded = *credentials;
    const auto user = decoded.substr(0, decoded.find(':'));
    if (user.empty() || user == sandbox_user(*call.sandbox)) return std::nullopt;
    if (user == root_user) {
        as_root = true;
        return std::nullopt;
    }
    return "user '" + user.substr(0, 64) +
           "' does not exist in this sandbox (commands and files run as '" +
           sandbox_user(*call.sandbox) + "' or '" + std::string(root_user) + "')";
}

asio::awaitable<result<void>> async_fill_metadata(const registry_entry& sandbox,
                                                  std::vector<entry_info>& entries) {
    const std::size_t batch = file_limits{}.max_files;
    for (std::size_t at = 0; at < entries.size(); at += batch) {
        const std::size_t end = std::min(entries.size(), at + batch);
        std::vector<std::string> paths;
        paths.reserve(end - at);
        for (std::size_t i = at; i < end; ++i) paths.push_back(entries[i].path);
        auto read = co_await sandbox.handle->async_read_metadata(std::move(paths),
                                                                 deadline::never(), lane::side);
        if (!read) co_return std::move(read).error();
        if (read->size() != end - at)
            co_return make_error(errc::protocol_error,
                                 "read_metadata answered " + std::to_string(read->size()) +
                                     " results for " + std::to_string(end - at) + " paths");
        for (std::size_t i = at; i < end; ++i) {
            auto& got = (*read)[i - at].metadata;
            if (got) entries[i].metadata = std::move(*got);
        }
    }
    co_return result<void>();
}

namespace {

// The X-Metadata-<key> headers as file metadata: keys lowercased, the first value of a key kept
// (envd's rules), then checked (normalize_file_metadata).
result<file_metadata> metadata_headers(const http::header_list& headers) {
    constexpr std::string_view prefix = "x-metadata-";
    file_metadata out;
    for (const auto& h : headers) {
        if (h.name.size() <= prefix.size() ||
            !http::iequals(h.name.substr(0, prefix.size()), prefix))
            continue;
        out.emplace(detail::ascii_lowered(std::string_view(h.name).substr(prefix.size())),
                    h.value);  // a repeated key keeps its first value
    }
    return normalize_file_metadata(out);
}

// The per-request parameters of /files.
using file_request = e2b_protocol::files_query;

result<file_request> parse_file_request(const http::server_request& request) {
    return e2b_protocol::parse_files_query(request.query());
}

std::int64_t now_unix() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// Whether the request whose query is `parsed` (and which has a signature) carries a valid
// signature made with `sandbox`'s token.
signature_check check_signature(const file_request& parsed, file_operation operation,
                                std::int64_t now, const registry_entry& sandbox) {
    std::optional<std::string_view> expiration;
    if (parsed.signature_expiration) expiration = *parsed.signature_expiration;
    return check_file_signature(*parsed.signature, parsed.path.value_or(""), operation,
                                parsed.username.value_or(""), sandbox.access_token, expiration,
                                now);
}

// Token checks per second that signed requests naming no sandbox may cost, server-wide (one check
// is one SHA-256 of a short string, about a microsecond: a tenth of a core at most).
constexpr double unnamed_checks_per_second = 100'000;

signature_verdict verify_signature(sandbox_registry& registry, signature_scan_budget& budget,
                                   const http::server_request& request,
                                   const std::shared_ptr<registry_entry>& named) {
    // The query is parsed once, however many tokens it is checked against.
    auto parsed = parse_file_request(request);
    if (!parsed || !parsed->signature) return {};
    // GET (and HEAD, which runs the GET route) reads; POST writes.
    auto operation = file_operation::read;
    if (request.method() == "POST") operation = file_operation::write;
    const auto now = now_unix();
    if (named) {
        const auto checked = check_signature(*parsed, operation, now, *named);
        if (checked == signature_check::valid) return {named};
        return {nullptr, checked == signature_check::expired};
    }
    if (!is_well_formed_signature(*parsed->signature)) return {};
    auto live = registry.live();
    if (!budget.take(live.size())) {
        if (budget.should_warn())
            detail::log(
                log_level::warning, "serve",
                "a signed /files request that names no sandbox was refused: the server-wide "
                "budget of signature checks is spent (name the sandbox with E2b-Sandbox-Id "
                "or its host name)");
        return {};
    }
    signature_verdict verdict;
    for (auto& entry : live) {
        const auto checked = check_signature(*parsed, operation, now, *entry);
        if (checked == signature_check::valid) return {entry};
        verdict.expired = verdict.expired || checked == signature_check::expired;
    }
    return verdict;
}

// `message` must outlive the call (a literal, or a named local of the caller).
asio::awaitable<void> send_json_error(envd_call& call, int status, std::string_view message) {
    (void)co_await call.response.async_send_error(status, message);
}

// The HTTP status envd answers for a per-path file error.
int status_of(const error& e) {
    if (e.code == errc::file_not_found) return 404;
    if (e.code == errc::too_large) return 413;
    if (e.code == errc::is_directory || e.code == errc::invalid_path ||
        e.code == errc::invalid_argument)
        return 400;
    if (e.code == errc::permission_denied) return 403;
    if (e.code == errc::protocol_error) return 400;  // a malformed body (multipart, gzip)
    if (e.code == errc::not_supported) return 501;
    if (e.code == errc::sandbox_unavailable || e.code == errc::sandbox_not_found) return 502;
    if (e.code == errc::deadline_exceeded) return 504;
    return 500;
}

// The checks both routes make: the query, the user, the resolved path.
struct checked_request {
    file_request query;
    std::string path;      // resolved
    bool as_root = false;  // the query's username is root
};

std::optional<std::pair<int, std::string>> check_request(envd_call& call, checked_request& out) {
    auto parsed = parse_file_request(call.request);
    if (!parsed) return std::pair(400, parsed.error().detail);
    out.query = std::move(*parsed);
    out.as_root = out.query.username && *out.query.username == root_user;
    if (out.query.username && !out.query.username->empty() && !out.as_root &&
        *out.query.username != sandbox_user(*call.sandbox))
        return std::pair(401, "error looking up user '" + out.query.username->substr(0, 64) +
                                  "': no such user in this sandbox");
    if (out.query.path) {
        auto resolved = resolve_envd_path(*out.query.path, user_home(*call.sandbox, out.as_root));
        if (!resolved) return std::pair(400, resolved.error().detail);
        out.path = std::move(*resolved);
    }
    return std::nullopt;
}

// check_request, with its refusal answered: false then.
asio::awaitable<bool> check_or_refuse(envd_call& call, checked_request& out) {
    auto refused = check_request(call, out);
    if (!refused) co_return true;
    const int status = refused->first;
    auto message = std::move(refused->second);
    co_await send_json_error(call, status, message);
    co_return false;
}

// Answers a per-path file error: its status (status_of) and its detail.
asio::awaitable<void> send_file_error(envd_call& call, const error& e) {
    const int status = status_of(e);
    const std::string message = e.detail;
    co_await send_json_error(call, status, message);
}

asio::awaitable<void> get_file(envd_call& call) {
    checked_request checked;
    const bool accepted = co_await check_or_refuse(call, checked);
    if (!accepted) co_return;
    if (!checked.query.path) checked.path = user_home(*call.sandbox, checked.as_root);
    auto path = checked.path;
    auto opened =
        co_await call.sandbox->handle->async_read_file_stream(path, deadline::never(), lane::side);
    if (!opened) {
        auto message = opened.error().detail;
        if (opened.error().code == errc::file_not_found)
            message = "path '" + checked.path + "' does not exist";
        else if (opened.error().code == errc::is_directory)
            message = "path '" + checked.path + "' is a directory";
        const int status = status_of(opened.error());
        co_await send_json_error(call, status, message);
        co_return;
    }
    auto stream = std::move(*opened);
    http::header_list headers;
    headers.add("Content-Type", "application/octet-stream");
    std::string disposition = "inline; filename=\"";
    for (char c : base_name(checked.path))
        if (c != '"' && c != '\\' && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f)
            disposition.push_back(c);
    disposition += '"';
    headers.add("Content-Disposition", disposition);
    if (auto begun = co_await call.response.async_begin(200, std::move(headers)); !begun) co_return;
    while (true) {
        auto chunk = co_await stream.async_next();
        if (!chunk) {
            // The status is sent: only a broken response (no final chunk) tells the client that
            // the file is incomplete. The server closes the connection of a handler that throws.
            throw std::runtime_error("download of a sandbox file failed midway: " +
                                     chunk.error().to_string());
        }
        if (chunk->empty()) break;
        auto written = co_await call.response.async_write(*chunk);
        if (!written) co_return;  // the client went away
    }
    (void)co_await call.response.async_end();
}

// The most an upload body may have, as sent and (gzip) inflated: one file at the cap plus its
// multipart framing. Each file is capped by the streamed write itself (413, nothing left).
std::uint64_t max_upload_body_bytes(const serve_context& context) {
    return context.options.max_file_bytes + 1024 * 1024;
}

// The uploaded files, as envd's response lists them: each with the metadata read back from the
// file (so the reply never claims what was not kept).
std::string upload_response(const std::vector<entry_info>& files) {
    json_writer w;
    w.begin_array();
    for (const auto& f : files) {
        w.begin_object();
        w.key("name").value(f.name);
        w.key("type").value("file");
        w.key("path").value(f.path);
        e2b_protocol::write_metadata(w, f.metadata);
        w.end_object();
    }
    w.end_array();
    return w.take();
}

file_write_target make_target(const std::string& path, const file_metadata& metadata,
                              const serve_context& context) {
    file_write_target target;
    target.path = path;
    target.mode = 0644;
    target.create_parents = true;
    target.max_bytes = context.options.max_file_bytes;
    target.metadata = metadata;
    return target;
}

// The request body as the handlers read it: as sent, or inflated as it arrives when it came
// with Content-Encoding: gzip (at most max_inflated bytes, and at most one decoded piece held).
class body_reader {
  public:
    body_reader(http::server_request& request, bool gzip, std::uint64_t max_inflated)
        : request_(&request) {
        if (gzip) decoder_ = std::make_unique<http::gzip_decoder>(max_inflated);
    }

    // The next piece; "" at the end of the body.
    asio::awaitable<result<std::string>> async_read_some() {
        if (!decoder_) {
            auto piece = co_await request_->async_read_some();
            if (!piece) co_return piece.error();
            co_return std::string(*piece);
        }
        while (true) {
            // Inflate what is held (the decoder may hold output even once the input is used).
            std::string_view input(pending_);
            input.remove_prefix(used_);
            auto out = decoder_->decode(input, file_stream_chunk_bytes);
            if (!out) co_return out.error();
            used_ = pending_.size() - input.size();
            if (!out->empty()) co_return out;
            if (ended_) {
                if (!decoder_->finished())
                    co_return make_error(errc::protocol_error,
                                         "the gzip body ends before its stream does");
                co_return std::string();
            }
            auto piece = co_await request_->async_read_some();
            if (!piece) co_return piece.error();
            pending_.assign(*piece);
            used_ = 0;
            ended_ = piece->empty();
        }
    }

  private:
    http::server_request* request_;
    std::unique_ptr<http::gzip_decoder> decoder_;
    std::string pending_;  // the compressed piece being inflated
    std::size_t used_ = 0;
    bool ended_ = false;
};

// A raw (application/octet-stream) body as a byte source.
struct raw_body_source {
    body_reader* body;
    asio::awaitable<result<std::string>> operator()() { return body->async_read_some(); }
};

// A multipart body, read event by event (a piece of the body is read only when the events of
// the previous one were consumed).
class multipart_reader {
  public:
    multipart_reader(body_reader& body, std::string boundary)
        : body_(&body), parser_(std::move(boundary)) {}

    // The next event; nullopt at the end of the body (after the closing boundary).
    asio::awaitable<result<std::optional<multipart_event>>> async_next() {
        while (pending_.empty()) {
            if (ended_) co_return std::optional<multipart_event>();
            auto piece = co_await body_->async_read_some();
            if (!piece) co_return piece.error();
            if (piece->empty()) {
                ended_ = true;
                if (auto done = parser_.finish(); !done) co_return done.error();
                continue;
            }
            std::vector<multipart_event> events;
            auto fed = parser_.feed(*piece, events);
            for (auto& e : events) pending_.push_back(std::move(e));
            if (!fed) {
                pending_.clear();
                co_return fed.error();
            }
        }
        auto e = std::move(pending_.front());
        pending_.pop_front();
        co_return std::optional<multipart_event>(std::move(e));
    }

  private:
    body_reader* body_;
    multipart_parser parser_;
    std::deque<multipart_event> pending_;
    bool ended_ = false;
};

// One part's data as a byte source: its data events, then the end at part_end.
struct part_source {
    multipart_reader* reader;
    asio::awaitable<result<std::string>> operator()() {
        auto next = co_await reader->async_next();
        if (!next) co_return next.error();
        if (!*next) co_return make_error(errc::protocol_error, "multipart body ends inside a part");
        auto& e = **next;
        if (e.type == multipart_event::kind::data) co_return std::move(e.data);
        if (e.type == multipart_event::kind::part_end) co_return std::string();
        co_return make_error(errc::protocol_error, "multipart part is not followed by its end");
    }
};

asio::awaitable<result<void>> async_write_one(envd_call& call, const std::string& path,
                                              const file_metadata& metadata, byte_source source,
                                              bool as_root) {
    auto target = make_target(path, metadata, call.context);
    target.as_root = as_root;
    auto written = co_await call.sandbox->handle->async_write_file_stream(
        std::move(target), std::move(source), deadline::never(), lane::side);
    if (!written) co_return written.error();
    if (!written->outcome) co_return written->outcome.error();
    co_return result<void>();
}

asio::awaitable<void> post_file(envd_call& call) {
    checked_request checked;
    const bool accepted = co_await check_or_refuse(call, checked);
    if (!accepted) co_return;
    // envd's encodings: none, identity or gzip, for the whole body.
    bool gzip = false;
    if (auto encoding = call.request.headers().find("content-encoding"); encoding) {
        gzip = http::iequals(*encoding, "gzip");
        if (!gzip && !encoding->empty() && !http::iequals(*encoding, "identity")) {
            auto message = "unsupported Content-Encoding '" + std::string(encoding->substr(0, 64)) +
                           "' (gzip or identity)";
            co_await send_json_error(call, 400, message);
            co_return;
        }
    }
    body_reader body(call.request, gzip, max_upload_body_bytes(call.context));
    auto metadata = metadata_headers(call.request.headers());
    if (!metadata) {
        auto message = "invalid metadata: " + metadata.error().detail;
        co_await send_json_error(call, 400, message);
        co_return;
    }
    const auto content_type = call.request.headers().find("content-type").value_or("");
    const auto media = content_type.substr(0, content_type.find(';'));
    std::vector<std::string> written;
    if (http::iequals(media, "application/octet-stream")) {
        if (!checked.query.path) {
            co_await send_json_error(call, 400, "the path query parameter is required");
            co_return;
        }
        byte_source source = raw_body_source{&body};
        auto path = checked.path;
        auto done =
            co_await async_write_one(call, path, *metadata, std::move(source), checked.as_root);
        if (!done) {
            co_await send_file_error(call, done.error());
            co_return;
        }
        written.push_back(checked.path);
    } else {
        auto boundary = multipart_boundary(content_type);
        if (!boundary) {
            auto message = boundary.error().detail;
            co_await send_json_error(call, 400, message);
            co_return;
        }
        multipart_reader reader(body, std::move(*boundary));
        while (true) {
            auto next = co_await reader.async_next();
            if (!next) {
                co_await send_file_error(call, next.error());
                co_return;
            }
            if (!*next) break;
            auto& e = **next;
            if (e.type == multipart_event::kind::finished) continue;
            if (e.type != multipart_event::kind::part_begin) {
                co_await send_json_error(call, 400, "malformed multipart body");
                co_return;
            }
            if (e.head.name != "file") {  // envd ignores other fields: drain this one
                while (true) {
                    auto skipped = co_await reader.async_next();
                    if (!skipped || !*skipped ||
                        (*skipped)->type == multipart_event::kind::part_end)
                        break;
                }
                continue;
            }
            std::string path = checked.path;
            if (!checked.query.path) {
                auto resolved =
                    resolve_envd_path(e.head.filename, user_home(*call.sandbox, checked.as_root));
                if (!resolved || e.head.filename.empty()) {
                    co_await send_json_error(call, 400, "a multipart file part needs a filename");
                    co_return;
                }
                path = std::move(*resolved);
            }
            bool repeated = false;
            for (const auto& w : written) repeated = repeated || w == path;
            if (repeated) {
                auto message = "you cannot upload multiple files to the same path '" + path +
                               "' in one upload request";
                co_await send_json_error(call, 400, message);
                co_return;
            }
            byte_source source = part_source{&reader};
            auto done =
                co_await async_write_one(call, path, *metadata, std::move(source), checked.as_root);
            if (!done) {
                co_await send_file_error(call, done.error());
                co_return;
            }
            written.push_back(std::move(path));
        }
        if (written.empty()) {
            co_await send_json_error(call, 400, "the multipart body has no part named 'file'");
            co_return;
        }
    }
    std::vector<entry_info> files(written.size());
    for (std::size_t i = 0; i < written.size(); ++i) {
        files[i].path = written[i];
        files[i].name = base_name(written[i]);
    }
    if (auto filled = co_await async_fill_metadata(*call.sandbox, files); !filled) {
        co_await send_file_error(call, filled.error());
        co_return;
    }
    http::header_list headers;
    headers.add("Content-Type", "application/json");
    auto reply = upload_response(files);
    (void)co_await call.response.async_send(200, std::move(headers), std::move(reply));
}

}  // namespace

void add_file_routes(envd_routes& routes, serve_context& context) {
    http::route_options options;
    options.max_body_bytes = max_upload_body_bytes(context);
    routes.add("GET", "/files", get_file, {}, envd_auth::token_or_signature);
    routes.add("POST", "/files", post_file, options, envd_auth::token_or_signature);
    auto* registry = &context.registry;
    auto budget = std::make_shared<signature_scan_budget>(unnamed_checks_per_second);
    routes.set_signature_verifier([registry, budget](const http::server_request& request,
                                                     const std::shared_ptr<registry_entry>& named) {
        return verify_signature(*registry, *budget, request, named);
    });
}

}  // namespace moat::serve
