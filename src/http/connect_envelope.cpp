#include "http/connect_envelope.hpp"

#include "core/json_writer.hpp"

#include <simdjson.h>

#include <array>
#include <utility>

namespace moat::http::connect {
namespace {

constexpr std::array<std::string_view, 17> code_names = {
    "",
    "canceled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
};

::moat::error protocol(std::string detail) {
    return make_error(errc::protocol_error, std::move(detail));
}

// The peer's text as one bounded line.
std::string one_line(std::string_view text, std::size_t max_bytes) {
    std::string out;
    for (const char c : text) {
        if (out.size() >= max_bytes) {
            out += "...";
            break;
        }
        const auto u = static_cast<unsigned char>(c);
        out += (u < 0x20 || u == 0x7f) ? ' ' : c;
    }
    return out;
}

std::optional<connect_error> error_object(simdjson::dom::element e) {
    simdjson::dom::object o;
    if (e.get_object().get(o) != simdjson::SUCCESS) return std::nullopt;
    std::string_view name;
    if (o["code"].get_string().get(name) != simdjson::SUCCESS) return std::nullopt;
    const auto c = code_from_string(name);
    if (!c) return std::nullopt;
    connect_error out;
    out.code = *c;
    std::string_view message;
    if (o["message"].get_string().get(message) == simdjson::SUCCESS) out.message = message;
    return out;
}

void write_error(json_writer& w, const connect_error& e) {
    w.begin_object().key("code").value(to_string(e.code));
    if (!e.message.empty()) w.key("message").value(e.message);
    w.end_object();
}

}  // namespace

std::string_view to_string(code c) noexcept {
    const auto i = static_cast<std::size_t>(c);
    if (i == 0 || i >= code_names.size()) return "unknown";
    return code_names[i];
}

std::optional<code> code_from_string(std::string_view name) noexcept {
    for (std::size_t i = 1; i < code_names.size(); ++i) {
        if (code_names[i] == name) return static_cast<code>(i);
    }
    return std::nullopt;
}

int http_status(code c) noexcept {
    switch (c) {
        case code::canceled:
            return 499;
        case code::invalid_argument:
        case code::failed_precondition:
        case code::out_of_range:
            return 400;
        case code::deadline_exceeded:
            return 504;
        case code::not_found:
            return 404;
        case code::already_exists:
        case code::aborted:
            return 409;
        case code::permission_denied:
            return 403;
        case code::resource_exhausted:
            return 429;
        case code::unimplemented:
            return 501;
        case code::unavailable:
            return 503;
        case code::unauthenticated:
            return 401;
        case code::unknown:
        case code::internal:
        case code::data_loss:
            return 500;
    }
    return 500;
}

code code_from_http_status(int status) noexcept {
    switch (status) {
        case 400:
            return code::internal;
        case 401:
            return code::unauthenticated;
        case 403:
            return code::permission_denied;
        case 404:
            return code::unimplemented;
        case 429:
        case 502:
        case 503:
        case 504:
            return code::unavailable;
        default:
            return code::unknown;
    }
}

errc to_errc(code c) noexcept {
    switch (c) {
        case code::canceled:
            return errc::cancelled;
        case code::deadline_exceeded:
            return errc::deadline_exceeded;
        case code::invalid_argument:
        case code::already_exists:
        case code::failed_precondition:
        case code::out_of_range:
            return errc::invalid_argument;
        case code::not_found:
            return errc::file_not_found;
        case code::permission_denied:
            return errc::permission_denied;
        case code::resource_exhausted:
            return errc::rate_limited;
        case code::unimplemented:
            return errc::not_supported;
        case code::unauthenticated:
            return errc::unauthorized;
        case code::unknown:
        case code::aborted:
        case code::internal:
        case code::unavailable:
        case code::data_loss:
            return errc::backend_failure;
    }
    return errc::backend_failure;
}

code from_errc(std::error_code e) noexcept {
    if (e.category() != error_category()) return code::internal;
    switch (static_cast<errc>(e.value())) {
        case errc::cancelled:
            return code::canceled;
        case errc::deadline_exceeded:
            return code::deadline_exceeded;
        case errc::invalid_argument:
        case errc::invalid_path:
        case errc::is_directory:
        case errc::too_large:
            return code::invalid_argument;
        case errc::sandbox_not_found:
        case errc::file_not_found:
            return code::not_found;
        case errc::permission_denied:
            return code::permission_denied;
        case errc::limit_exceeded:
        case errc::rate_limited:
            return code::resource_exhausted;
        case errc::not_supported:
            return code::unimplemented;
        case errc::unauthorized:
            return code::unauthenticated;
        case errc::sandbox_unavailable:
        case errc::shutting_down:
        case errc::store_unavailable:
        case errc::connection_refused:
            return code::unavailable;
        case errc::layer_unavailable:
        case errc::sandbox_paused:
            return code::failed_precondition;
        case errc::backend_failure:
        case errc::protocol_error:
            return code::internal;
    }
    return code::internal;
}

::moat::error to_error(const connect_error& e) {
    std::string detail = "connect ";
    detail += to_string(e.code);
    if (!e.message.empty()) {
        detail += ": ";
        detail += one_line(e.message, 200);
    }
    return make_error(to_errc(e.code), std::move(detail));
}

void append_envelope(std::string& out, std::uint8_t flags, std::string_view payload) {
    const auto n = static_cast<std::uint32_t>(payload.size());
    out += static_cast<char>(flags);
    out += static_cast<char>((n >> 24) & 0xff);
    out += static_cast<char>((n >> 16) & 0xff);
    out += static_cast<char>((n >> 8) & 0xff);
    out += static_cast<char>(n & 0xff);
    out.append(payload);
}

std::string encode_envelope(std::uint8_t flags, std::string_view payload) {
    std::string out;
    out.reserve(envelope_prefix_size + payload.size());
    append_envelope(out, flags, payload);
    return out;
}

result<void> envelope_decoder::feed(std::string_view bytes, std::vector<envelope>& out) {
    if (failed_) return *failed_;
    while (!bytes.empty()) {
        if (ended_) {
            failed_ = protocol("bytes after the end-stream message");
            return *failed_;
        }
        if (!have_prefix_) {
            const auto take = std::min(envelope_prefix_size - buffer_.size(), bytes.size());
            buffer_.append(bytes.substr(0, take));
            bytes.remove_prefix(take);
            if (buffer_.size() < envelope_prefix_size) break;
            const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data());
            flags_ = p[0];
            expected_ = (std::size_t{p[1]} << 24) | (std::size_t{p[2]} << 16) |
                        (std::size_t{p[3]} << 8) | std::size_t{p[4]};
            buffer_.clear();
            if ((flags_ & flag_compressed) != 0) {
                failed_ = protocol("a compressed envelope (no compression was negotiated)");
                return *failed_;
            }
            if ((flags_ & ~flag_end_stream) != 0) {
                failed_ = protocol("an envelope with reserved flags 0x" +
                                   std::to_string(static_cast<unsigned>(flags_)));
                return *failed_;
            }
            if (expected_ > max_payload_) {
                failed_ = protocol("an envelope of " + std::to_string(expected_) +
                                   " bytes, over the cap of " + std::to_string(max_payload_));
                return *failed_;
            }
            have_prefix_ = true;
        }
        const auto take = std::min(expected_ - buffer_.size(), bytes.size());
        buffer_.append(bytes.substr(0, take));
        bytes.remove_prefix(take);
        if (buffer_.size() < expected_) break;
        envelope e;
        e.flags = flags_;
        e.payload = std::move(buffer_);
        buffer_.clear();
        have_prefix_ = false;
        if (e.is_end_stream()) ended_ = true;
        out.push_back(std::move(e));
    }
    return {};
}

result<void> envelope_decoder::finish() const {
    if (failed_) return *failed_;
    if (have_prefix_ || !buffer_.empty()) {
        return protocol("the stream ended inside an envelope");
    }
    if (!ended_) return protocol("the stream ended without the end-stream message");
    return {};
}

result<end_stream> parse_end_stream(std::string_view json) {
    const simdjson::padded_string padded(json);
    simdjson::dom::parser parser;
    simdjson::dom::object o;
    if (parser.parse(padded).get_object().get(o) != simdjson::SUCCESS) {
        return protocol("the end-stream message is not a JSON object");
    }
    end_stream out;
    simdjson::dom::element e;
    if (o["error"].get(e) == simdjson::SUCCESS && !e.is_null()) {
        auto parsed = error_object(e);
        if (!parsed) return protocol("the end-stream error has no defined \"code\"");
        out.error = std::move(*parsed);
    }
    simdjson::dom::element metadata;
    if (o["metadata"].get(metadata) == simdjson::SUCCESS && !metadata.is_null()) {
        simdjson::dom::object m;
        if (metadata.get_object().get(m) != simdjson::SUCCESS) {
            return protocol("the end-stream metadata is not an object");
        }
        for (auto field : m) {
            simdjson::dom::array values;
            if (field.value.get_array().get(values) != simdjson::SUCCESS) {
                return protocol("the end-stream metadata value is not an array");
            }
            auto& list = out.metadata[std::string(field.key)];
            for (auto v : values) {
                std::string_view s;
                if (v.get_string().get(s) != simdjson::SUCCESS) {
                    return protocol("the end-stream metadata value is not a string array");
                }
                list.emplace_back(s);
            }
        }
    }
    return out;
}

std::string encode_end_stream(const end_stream& message) {
    json_writer w;
    w.begin_object();
    if (message.error) {
        w.key("error");
        write_error(w, *message.error);
    }
    if (!message.metadata.empty()) {
        w.key("metadata").begin_object();
        for (const auto& [key, values] : message.metadata) {
            w.key(key).begin_array();
            for (const auto& v : values) w.value(v);
            w.end_array();
        }
        w.end_object();
    }
    w.end_object();
    return w.take();
}

connect_error parse_unary_error(int http_status, std::string_view body) {
    const simdjson::padded_string padded(body);
    simdjson::dom::parser parser;
    simdjson::dom::element document;
    if (parser.parse(padded).get(document) == simdjson::SUCCESS) {
        if (auto parsed = error_object(document)) return std::move(*parsed);
    }
    connect_error out;
    out.code = code_from_http_status(http_status);
    return out;
}

std::string encode_unary_error(const connect_error& e) {
    json_writer w;
    write_error(w, e);
    return w.take();
}

}  // namespace moat::http::connect
