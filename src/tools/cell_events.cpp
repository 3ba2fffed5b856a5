#include "tools/cell_events.hpp"

#include <algorithm>
#include <charconv>

namespace moat {

const representation* display_result::find(std::string_view media_type) const noexcept {
    for (const auto& r : representations)
        if (r.media_type == media_type) return &r;
    return nullptr;
}

std::string_view display_result::text() const noexcept {
    const auto* plain = find(media::text_plain);
    return plain == nullptr ? std::string_view() : std::string_view(plain->data);
}

const display_result* cell_result::main_result() const noexcept {
    for (const auto& event : events)
        if (const auto* r = std::get_if<display_result>(&event); r && r->is_main_result) return r;
    return nullptr;
}

const cell_error* cell_result::error() const noexcept {
    for (const auto& event : events)
        if (const auto* e = std::get_if<cell_error>(&event)) return e;
    return nullptr;
}

std::vector<const display_result*> cell_result::results() const {
    std::vector<const display_result*> found;
    for (const auto& event : events)
        if (const auto* r = std::get_if<display_result>(&event)) found.push_back(r);
    return found;
}

bool is_media_type(std::string_view text) noexcept {
    const auto slash = text.find('/');
    if (text.empty() || text.size() > 127 || slash == 0 || slash == std::string_view::npos ||
        slash + 1 == text.size() || text.find('/', slash + 1) != std::string_view::npos) {
        return false;
    }
    return std::all_of(text.begin(), text.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '/' || c == '+' || c == '-' || c == '.' || c == '_';
    });
}

namespace {

// Space-separated decimal numbers; false unless exactly `count` of them fill `text`.
bool parse_numbers(std::string_view text, std::uint64_t* out, int count) {
    for (int i = 0; i < count; ++i) {
        if (i != 0) {
            if (text.empty() || text.front() != ' ') return false;
            text.remove_prefix(1);
        }
        const auto parsed = std::from_chars(text.data(), text.data() + text.size(), out[i]);
        if (parsed.ec != std::errc() || parsed.ptr == text.data()) return false;
        text.remove_prefix(static_cast<std::size_t>(parsed.ptr - text.data()));
    }
    return text.empty();
}

}  // namespace

void cell_result_builder::emit(cell_event event) {
    if (sink_) sink_(event);
    result_.events.push_back(std::move(event));
}

void cell_result_builder::add_stream(output_channel channel, std::string_view data) {
    const std::size_t room = limits_.max_stream_bytes - kept_stream_;
    const auto kept = data.substr(0, room);
    result_.omitted_stream_bytes += data.size() - kept.size();
    if (kept.empty()) return;
    kept_stream_ += kept.size();
    if (!result_.events.empty()) {
        if (auto* last = std::get_if<stream_text>(&result_.events.back());
            last && last->channel == channel) {
            last->text.append(kept);
            return;
        }
    }
    result_.events.emplace_back(stream_text{channel, std::string(kept)});
}

void cell_result_builder::feed(std::string_view data) {
    while (!data.empty() && state_ != state::broken) {
        if (state_ == state::body) {
            const auto n =
                static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, data.size()));
            if (target_ != nullptr && target_->size() < keep_) {
                target_->append(data.substr(0, std::min(n, keep_ - target_->size())));
            }
            data.remove_prefix(n);
            remaining_ -= n;
            if (remaining_ == 0) on_body_done();
            continue;
        }
        const auto newline = data.find('\n');
        const auto take = newline == std::string_view::npos ? data.size() : newline;
        if (line_.size() + take > max_header) {
            fail();
            return;
        }
        line_.append(data.substr(0, take));
        if (newline == std::string_view::npos) return;
        data.remove_prefix(newline + 1);
        std::string line = std::move(line_);
        line_.clear();
        if (state_ == state::header) {
            on_header(line);
        } else {
            on_representation_header(line);
        }
    }
}

void cell_result_builder::start_body(std::string* target, std::uint64_t size, std::size_t keep) {
    target_ = target;
    remaining_ = size;
    keep_ = keep;
    state_ = state::body;
    if (size == 0) on_body_done();
}

void cell_result_builder::on_header(std::string_view line) {
    if (line.size() < 3 || line[1] != ' ') return fail();
    const char kind = line[0];
    line.remove_prefix(2);
    if (kind == 'C') {
        std::uint64_t count = 0;
        if (!parse_numbers(line, &count, 1)) return fail();
        result_.execution_count = count;
        return;
    }
    if (kind == 'R') {
        std::uint64_t fields[2] = {0, 0};
        if (!parse_numbers(line, fields, 2) || fields[0] > 1 || fields[1] > max_representations) {
            return fail();
        }
        pending_result_ = display_result{};
        pending_result_.is_main_result = fields[0] == 1;
        representations_left_ = fields[1];
        if (representations_left_ == 0) return end_result();
        state_ = state::representation_header;
        return;
    }
    if (kind == 'E') {
        if (!parse_numbers(line, error_sizes_, 3)) return fail();
        pending_error_ = cell_error{};
        reading_error_ = true;
        error_field_ = 0;
        return start_body(&pending_error_.name, error_sizes_[0], limits_.max_error_bytes);
    }
    fail();
}

void cell_result_builder::on_representation_header(std::string_view line) {
    if (line.size() < 2) return fail();
    const char how = line[0];
    line.remove_prefix(1);
    const auto space = line.rfind(' ');
    if (space == std::string_view::npos) return fail();
    const auto type = line.substr(0, space);
    std::uint64_t size = 0;
    if (!is_media_type(type) || !parse_numbers(line.substr(space + 1), &size, 1)) return fail();
    if (how == '-') {
        pending_result_.dropped.push_back({std::string(type), size});
    } else if (how == '+' || how == '~') {
        const bool fits = size <= limits_.max_representation_bytes &&
                          kept_result_bytes_ + size <= limits_.max_result_bytes;
        if (!fits) {
            pending_result_.dropped.push_back({std::string(type), size});
            return start_body(nullptr, size, 0);
        }
        kept_result_bytes_ += size;
        representation r;
        r.media_type = std::string(type);
        r.is_truncated = how == '~';
        pending_result_.representations.push_back(std::move(r));
        return start_body(&pending_result_.representations.back().data, size,
                          static_cast<std::size_t>(size));
    } else {
        return fail();
    }
    if (--representations_left_ == 0) end_result();
}

void cell_result_builder::on_body_done() {
    state_ = state::header;
    target_ = nullptr;
    if (reading_error_) {
        if (++error_field_ < 3) {
            std::string* next =
                error_field_ == 1 ? &pending_error_.value : &pending_error_.traceback;
            return start_body(next, error_sizes_[error_field_], limits_.max_error_bytes);
        }
        reading_error_ = false;
        return emit(std::move(pending_error_));
    }
    if (--representations_left_ == 0) return end_result();
    state_ = state::representation_header;
}

void cell_result_builder::end_result() {
    state_ = state::header;
    if (results_ == limits_.max_results) {
        ++result_.dropped_results;
        return;
    }
    ++results_;
    emit(std::move(pending_result_));
}

cell_result cell_result_builder::finish() {
    cell_result done = std::move(result_);
    result_ = cell_result{};
    kept_stream_ = 0;
    kept_result_bytes_ = 0;
    results_ = 0;
    return done;
}

}  // namespace moat
