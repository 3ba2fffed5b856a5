// Base64 (RFC 4648), one implementation for every place moat reads or writes it: the standard
// alphabet with padding (envd's proto3 `bytes`, HTTP Basic credentials, the tools' file content,
// envd's file signatures) and base64url without padding (moat serve's page tokens).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace moat {

// The standard alphabet (+/), padded with '=' to whole quartets: "hi" -> "aGk=".
std::string base64_encode(std::string_view bytes);
// The URL-safe alphabet (-_), without padding: "hi" -> "aGk".
std::string base64url_encode(std::string_view bytes);

// What a decoder accepts beside whole quartets of the alphabet.
enum class base64_padding {
    // "aGk" and "aGk=" alike; padding that is there must complete the last quartet (at most two
    // '=', nothing after them), and ASCII whitespace between characters is skipped (MIME's line
    // breaks, a JSON string wrapped by hand).
    optional,
    // Whole quartets only, no whitespace (as OpenSSL's EVP_DecodeBlock reads HTTP Basic
    // credentials).
    required,
};

// The bytes of standard base64 text; nullopt for a character outside the alphabet, a lone
// trailing character (a length of 4n+1) or misplaced padding.
std::optional<std::string> base64_decode(std::string_view text,
                                         base64_padding padding = base64_padding::optional);
// The bytes of base64url text, padding optional as above.
std::optional<std::string> base64url_decode(std::string_view text);

}  // namespace moat
