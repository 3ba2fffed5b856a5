// Signed file URLs of envd's /files routes (the SDK's files.downloadUrl / uploadUrl): a request
// without the sandbox's access token may carry `signature` (and `signature_expiration`) query
// parameters instead, computed by the client from that token.
//
// The signature is "v1_" + base64 (standard alphabet, padding stripped) of SHA-256 over
// "<path>:<read|write>:<username or ''>:<access token>[:<expiration, unix seconds>]", with the
// path and username exactly as they appear in the query (not resolved), as envd and the SDK
// compute it. An expiration in the past makes a matching signature expired.
//
// Pure functions; the comparison is constant-time. Tokens never appear in an error detail.
#pragma once

#include <moat/result.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moat::serve {

enum class file_operation { read, write };

std::string file_signature(std::string_view path, file_operation operation,
                           std::string_view username, std::string_view access_token,
                           std::optional<std::int64_t> expiration);

// The outcome of checking a signature against one token.
enum class signature_check {
    valid,
    mismatch,  // not this token's signature (or malformed)
    expired,   // this token's signature, past its expiration
};

// `expiration_text` is the raw signature_expiration parameter (nullopt when absent); a value that
// is not a decimal integer is a mismatch. `now_unix` is the current time in unix seconds.
signature_check check_file_signature(std::string_view signature, std::string_view path,
                                     file_operation operation, std::string_view username,
                                     std::string_view access_token,
                                     std::optional<std::string_view> expiration_text,
                                     std::int64_t now_unix);

}  // namespace moat::serve
