// normalize_file_metadata (files.hpp): the rules every backend and `moat serve` apply to file
// metadata before any of it reaches a filesystem.
#include "core/file_metadata.hpp"

#include "core/ascii.hpp"

#include <moat/files.hpp>

#include <string_view>

namespace moat {
namespace {

// A key as it may appear in a detail: at most 64 bytes, bytes outside printable ASCII as '?'.
std::string shown(std::string_view key) {
    std::string out(key.substr(0, 64));
    for (char& c : out)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
    if (key.size() > 64) out += "...";
    return out;
}

}  // namespace

result<file_metadata> normalize_file_metadata(const file_metadata& metadata) {
    file_metadata out;
    std::size_t total = 0;
    for (const auto& [key, value] : metadata) {
        if (key.empty()) return make_error(errc::invalid_argument, "a metadata key is empty");
        if (key.size() > max_file_metadata_key_bytes)
            return make_error(errc::invalid_argument,
                              "metadata key '" + shown(key) + "' is longer than " +
                                  std::to_string(max_file_metadata_key_bytes) + " bytes");
        std::string lowered;
        lowered.reserve(key.size());
        for (const char c : key) {
            if (!detail::is_token_char(c))
                return make_error(errc::invalid_argument,
                                  "metadata key '" + shown(key) +
                                      "' has a character other than letters, digits and "
                                      "!#$%&'*+-.^_`|~");
            lowered.push_back(detail::ascii_lower(c));
        }
        for (const char c : value) {
            const auto byte = static_cast<unsigned char>(c);
            if (byte < 0x20 || byte > 0x7e)
                return make_error(
                    errc::invalid_argument,
                    "the value of metadata key '" + shown(key) + "' is not printable US-ASCII");
        }
        total += file_metadata_prefix.size() + lowered.size() + value.size();
        if (!out.emplace(std::move(lowered), value).second)
            return make_error(
                errc::invalid_argument,
                "metadata key '" + shown(key) + "' is given twice (keys are case-insensitive)");
    }
    if (total > max_file_metadata_bytes)
        return make_error(errc::too_large, "the file's metadata is " + std::to_string(total) +
                                               " bytes, over the limit of " +
                                               std::to_string(max_file_metadata_bytes));
    return out;
}

namespace detail {

void file_metadata_collector::add(std::string_view key, std::string_view value) {
    file_metadata one;
    one.emplace(std::string(key), std::string(value));
    auto checked = normalize_file_metadata(one);
    if (!checked || checked->begin()->first != key) return;
    const std::size_t cost = file_metadata_prefix.size() + key.size() + value.size();
    if (cost > budget_) return;
    budget_ -= cost;
    out_.insert(std::move(*checked->begin()));
}

}  // namespace detail

}  // namespace moat
