// Decoding one UTF-8 sequence of untrusted bytes: the one rule every writer of model- or
// client-facing text uses (JSON strings, shaped output), so they agree on what is valid.
#pragma once

#include <cstddef>
#include <string_view>

namespace moat {

struct utf8_step {
    std::size_t length;  // bytes consumed: the whole sequence, or its maximal ill-formed subpart
    bool is_valid;       // a well-formed sequence (no overlong, surrogate or value past U+10FFFF)
};

// The sequence starting at s[i] (i < s.size()), by the Unicode "maximal subpart" rule (Table 3-7
// byte ranges): an ill-formed start consumes exactly the bytes that one U+FFFD replaces.
utf8_step decode_utf8(std::string_view s, std::size_t i) noexcept;

}  // namespace moat
