// A small streaming JSON writer (simdjson parses; it does not write). Produces compact JSON with
// correct string escaping; invalid UTF-8 bytes are replaced with U+FFFD so output always parses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moat {

class json_writer {
  public:
    json_writer& begin_object() { return open('{'); }
    json_writer& end_object() { return close('}'); }
    json_writer& begin_array() { return open('['); }
    json_writer& end_array() { return close(']'); }
    json_writer& key(std::string_view name);
    json_writer& value(std::string_view s);
    json_writer& value(const char* s) { return value(std::string_view(s)); }
    json_writer& value(bool b);
    json_writer& value(std::int64_t n);
    json_writer& value(std::uint64_t n);
    json_writer& value(int n) { return value(static_cast<std::int64_t>(n)); }
    json_writer& value(double d);
    json_writer& null();
    // A value that is already JSON text (the caller parsed it), written as it is.
    json_writer& raw_value(std::string_view json);

    const std::string& str() const noexcept { return out_; }
    std::string take() noexcept { return std::move(out_); }

  private:
    void separate();
    json_writer& open(char bracket);
    json_writer& close(char bracket);
    std::string out_;
    std::vector<bool> first_;  // per open container: no element written yet
    bool after_key_ = false;
};

// Appends `s` as a quoted JSON string.
void append_json_string(std::string& out, std::string_view s);

}  // namespace moat
