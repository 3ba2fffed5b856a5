// Metadata read back from where it is kept (extended attributes, an envd reply): what a reader
// keeps of it. The rules themselves are in files.hpp (normalize_file_metadata).
#pragma once

#include <moat/files.hpp>

#include <cstddef>
#include <string_view>

namespace moat::detail {

// Keeps an entry only if it follows the rules as it stands (its key already lowercased, as a
// writer through moat leaves it) and fits in what is left of max_file_metadata_bytes; anything
// else (an attribute set from inside a sandbox by other means) is left out, never an error.
class file_metadata_collector {
  public:
    void add(std::string_view key, std::string_view value);
    file_metadata take() { return std::move(out_); }

  private:
    file_metadata out_;
    std::size_t budget_ = max_file_metadata_bytes;
};

}  // namespace moat::detail
