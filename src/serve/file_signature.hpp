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

#include <chrono>
#include <cstddef>
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

// Whether `signature` has the shape of one (the "v1_" prefix and 43 base64 characters): a
// request whose signature cannot match any token costs no hashing at all.
bool is_well_formed_signature(std::string_view signature) noexcept;

// What signed requests that name no sandbox may cost the server: each is checked against every
// live sandbox's token, so an unauthenticated client could make the server hash as many tokens
// per request as there are sandboxes. A token bucket of checks (`per_second`, up to one second's
// worth saved) bounds that; a request that finds it empty is refused without hashing.
class signature_scan_budget {
  public:
    using clock = std::chrono::steady_clock;
    explicit signature_scan_budget(double per_second, clock::time_point now = clock::now()) noexcept
        : rate_(per_second), tokens_(per_second), last_(now) {}
    // Takes `checks` from the bucket at `now`; false (and nothing taken) if it holds fewer.
    bool take(std::size_t checks, clock::time_point now = clock::now()) noexcept;
    // True at most once a minute: whether a refusal should be logged now.
    bool should_warn(clock::time_point now = clock::now()) noexcept;

  private:
    double rate_;
    double tokens_;
    clock::time_point last_;
    std::optional<clock::time_point> warned_;
};

}  // namespace moat::serve
