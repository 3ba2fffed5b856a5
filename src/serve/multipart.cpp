#include "serve/multipart.hpp"

#include "core/ascii.hpp"

#include <algorithm>
#include <optional>

namespace moat::serve {

namespace {

using detail::ascii_lower;
using detail::ascii_lowered;
using detail::is_token_char;

constexpr std::string_view crlf = "\r\n";

using detail::iequals;

bool is_token(std::string_view s) noexcept {
    return !s.empty() && std::all_of(s.begin(), s.end(), is_token_char);
}

std::string_view trim(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

// "type; a=b; c=\"d\"": the lower-cased type and its parameters (names lower-cased, quoted values
// unescaped), or nullopt when malformed or a parameter is repeated (as Go's ParseMediaType).
struct media_type {
    std::string type;
    std::vector<std::pair<std::string, std::string>> params;
    const std::string* find(std::string_view name) const {
        for (const auto& p : params)
            if (p.first == name) return &p.second;
        return nullptr;
    }
};

std::optional<media_type> parse_media_type(std::string_view s) {
    media_type out;
    const auto semicolon = s.find(';');
    const auto type = trim(s.substr(0, semicolon));
    // A media type is token/token; a disposition is one token.
    const auto slash = type.find('/');
    if (slash == std::string_view::npos) {
        if (!is_token(type)) return std::nullopt;
    } else if (!is_token(type.substr(0, slash)) || !is_token(type.substr(slash + 1))) {
        return std::nullopt;
    }
    out.type = ascii_lowered(type);
    if (semicolon == std::string_view::npos) return out;
    s.remove_prefix(semicolon + 1);
    while (true) {
        s = trim(s);
        if (s.empty()) return out;
        const auto eq = s.find('=');
        if (eq == std::string_view::npos) return std::nullopt;
        const auto name = trim(s.substr(0, eq));
        if (!is_token(name)) return std::nullopt;
        s.remove_prefix(eq + 1);
        s = trim(s);
        std::string value;
        if (!s.empty() && s.front() == '"') {
            std::size_t i = 1;
            bool closed = false;
            for (; i < s.size(); ++i) {
                if (s[i] == '\\' && i + 1 < s.size()) {
                    value.push_back(s[++i]);
                } else if (s[i] == '"') {
                    closed = true;
                    break;
                } else {
                    value.push_back(s[i]);
                }
            }
            if (!closed) return std::nullopt;
            s.remove_prefix(i + 1);
        } else {
            std::size_t i = 0;
            while (i < s.size() && is_token_char(s[i])) ++i;
            if (i == 0) return std::nullopt;
            value.assign(s.substr(0, i));
            s.remove_prefix(i);
        }
        auto lowered = ascii_lowered(name);
        if (out.find(lowered) != nullptr) return std::nullopt;
        out.params.emplace_back(std::move(lowered), std::move(value));
        s = trim(s);
        if (s.empty()) return out;
        if (s.front() != ';') return std::nullopt;
        s.remove_prefix(1);
    }
}

// RFC 2046 bchars: DIGIT / ALPHA / "'()+_,-./:=?" and space, not last.
bool is_boundary(std::string_view b) noexcept {
    if (b.empty() || b.back() == ' ') return false;
    return std::all_of(b.begin(), b.end(), [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               std::string_view("'()+_,-./:=? ").find(c) != std::string_view::npos;
    });
}

}  // namespace

result<std::string> multipart_boundary(std::string_view content_type,
                                       std::size_t max_boundary_bytes) {
    const auto media = parse_media_type(content_type);
    if (!media) return make_error(errc::invalid_argument, "malformed multipart Content-Type");
    if (media->type != "multipart/form-data")
        return make_error(errc::invalid_argument, "Content-Type is not multipart/form-data");
    const auto* boundary = media->find("boundary");
    if (boundary == nullptr)
        return make_error(errc::invalid_argument, "multipart Content-Type has no boundary");
    if (boundary->size() > max_boundary_bytes)
        return make_error(
            errc::invalid_argument,
            "multipart boundary is longer than " + std::to_string(max_boundary_bytes) + " bytes");
    if (!is_boundary(*boundary))
        return make_error(errc::invalid_argument,
                          "multipart boundary is empty or has a byte RFC 2046 forbids");
    return *boundary;
}

multipart_parser::multipart_parser(std::string boundary, multipart_limits limits)
    : delimiter_("\r\n--" + boundary), limits_(limits) {
    // The first delimiter may open the body without a line break before it: start as if one had
    // been read, so every delimiter is CRLF "--" boundary.
    buffer_ = crlf;
    if (boundary.empty() || boundary.size() > limits_.max_boundary_bytes) state_ = state::failed;
}

result<void> multipart_parser::fail(std::string detail) {
    state_ = state::failed;
    buffer_.clear();
    return make_error(errc::protocol_error, std::move(detail));
}

result<void> multipart_parser::parse_head(std::string_view block, multipart_part_head& head) {
    bool has_disposition = false;
    while (!block.empty()) {
        const auto end = block.find(crlf);
        const auto line = block.substr(0, end);
        block.remove_prefix(end == std::string_view::npos ? block.size() : end + 2);
        if (line.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos)
            return fail("multipart part header has a bare CR, LF or NUL");
        const auto colon = line.find(':');
        if (colon == std::string_view::npos || !is_token(line.substr(0, colon)))
            return fail("malformed multipart part header line");
        const auto name = line.substr(0, colon);
        const auto value = trim(line.substr(colon + 1));
        if (iequals(name, "content-disposition")) {
            if (has_disposition) return fail("multipart part has two Content-Disposition headers");
            has_disposition = true;
            const auto media = parse_media_type(value);
            if (!media) return fail("malformed multipart Content-Disposition");
            head.disposition = media->type;
            if (const auto* n = media->find("name")) head.name = *n;
            if (const auto* f = media->find("filename")) {
                head.filename = *f;
                head.has_filename = true;
            }
        } else if (iequals(name, "content-type")) {
            head.content_type = value;
        }
        head.headers.emplace_back(std::string(name), std::string(value));
    }
    return {};
}

result<void> multipart_parser::feed(std::string_view piece, std::vector<multipart_event>& out) {
    if (state_ == state::failed)
        return make_error(errc::protocol_error, "multipart parser fed after a fault");
    if (state_ == state::epilogue) return {};
    buffer_.append(piece);
    const std::size_t hold = delimiter_.size() - 1;  // a delimiter's proper prefix, at most
    while (true) {
        switch (state_) {
            case state::preamble: {
                const auto pos = buffer_.find(delimiter_);
                const auto skipped = pos == std::string::npos
                                         ? buffer_.size() - std::min(buffer_.size(), hold)
                                         : pos;
                preamble_bytes_ += skipped;
                if (preamble_bytes_ > limits_.max_header_bytes + crlf.size())
                    return fail("multipart body has no boundary within its first " +
                                std::to_string(limits_.max_header_bytes) + " bytes");
                if (pos == std::string::npos) {
                    buffer_.erase(0, skipped);
                    return {};
                }
                buffer_.erase(0, pos + delimiter_.size());
                state_ = state::after_delimiter;
                break;
            }
            case state::after_delimiter: {
                if (buffer_.empty()) return {};
                if (buffer_[0] == '-') {
                    if (buffer_.size() < 2) return {};
                    if (buffer_[1] != '-') return fail("multipart boundary followed by a lone '-'");
                    state_ = state::epilogue;
                    buffer_.clear();
                    multipart_event e;
                    e.type = multipart_event::kind::finished;
                    out.push_back(std::move(e));
                    return {};
                }
                std::size_t i = 0;
                while (i < buffer_.size() && (buffer_[i] == ' ' || buffer_[i] == '\t')) ++i;
                if (i > limits_.max_header_bytes)
                    return fail("multipart boundary padding too long");
                if (i + 1 >= buffer_.size()) {
                    if (i < buffer_.size() && buffer_[i] != '\r')
                        return fail("multipart boundary not followed by a line break");
                    return {};
                }
                if (buffer_[i] != '\r' || buffer_[i + 1] != '\n')
                    return fail("multipart boundary not followed by a line break");
                buffer_.erase(0, i + 2);
                state_ = state::headers;
                break;
            }
            case state::headers: {
                std::size_t block_size = 0;
                std::size_t consumed = 0;
                if (buffer_.size() < 2) return {};
                if (buffer_.compare(0, 2, crlf) == 0) {
                    consumed = 2;  // no headers at all
                } else {
                    const auto end = buffer_.find("\r\n\r\n");
                    if (end == std::string::npos) {
                        if (buffer_.size() > limits_.max_header_bytes + 3)
                            return fail("multipart part headers longer than " +
                                        std::to_string(limits_.max_header_bytes) + " bytes");
                        return {};
                    }
                    block_size = end;
                    consumed = end + 4;
                }
                if (block_size > limits_.max_header_bytes)
                    return fail("multipart part headers longer than " +
                                std::to_string(limits_.max_header_bytes) + " bytes");
                if (++parts_ > limits_.max_parts)
                    return fail("multipart body has more than " +
                                std::to_string(limits_.max_parts) + " parts");
                multipart_event e;
                e.type = multipart_event::kind::part_begin;
                if (auto parsed =
                        parse_head(std::string_view(buffer_).substr(0, block_size), e.head);
                    !parsed)
                    return parsed;
                out.push_back(std::move(e));
                buffer_.erase(0, consumed);
                state_ = state::body;
                break;
            }
            case state::body: {
                const auto pos = buffer_.find(delimiter_);
                const auto data_size = pos == std::string::npos
                                           ? buffer_.size() - std::min(buffer_.size(), hold)
                                           : pos;
                if (data_size > 0) {
                    multipart_event e;
                    e.type = multipart_event::kind::data;
                    e.data.assign(buffer_, 0, data_size);
                    out.push_back(std::move(e));
                }
                if (pos == std::string::npos) {
                    buffer_.erase(0, data_size);
                    return {};
                }
                multipart_event e;
                e.type = multipart_event::kind::part_end;
                out.push_back(std::move(e));
                buffer_.erase(0, pos + delimiter_.size());
                state_ = state::after_delimiter;
                break;
            }
            case state::epilogue:
                buffer_.clear();
                return {};
            case state::failed:
                return make_error(errc::protocol_error, "multipart parser fed after a fault");
        }
    }
}

result<void> multipart_parser::finish() const {
    if (state_ == state::epilogue) return {};
    if (state_ == state::failed)
        return make_error(errc::protocol_error, "multipart body is malformed");
    return make_error(errc::protocol_error, "multipart body ends before its closing boundary");
}

}  // namespace moat::serve
