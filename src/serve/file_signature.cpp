#include "serve/file_signature.hpp"

#include "core/base64.hpp"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <charconv>

namespace moat::serve {

std::string file_signature(std::string_view path, file_operation operation,
                           std::string_view username, std::string_view access_token,
                           std::optional<std::int64_t> expiration) {
    std::string raw;
    raw.reserve(path.size() + username.size() + access_token.size() + 32);
    raw.append(path);
    raw.append(operation == file_operation::read ? ":read:" : ":write:");
    raw.append(username);
    raw.push_back(':');
    raw.append(access_token);
    if (expiration) {
        raw.push_back(':');
        raw.append(std::to_string(*expiration));
    }
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(raw.data()), raw.size(), digest);
    OPENSSL_cleanse(raw.data(), raw.size());
    std::string out = "v1_";
    out += base64_encode(std::string_view(reinterpret_cast<const char*>(digest), sizeof digest));
    while (out.back() == '=') out.pop_back();
    return out;
}

signature_check check_file_signature(std::string_view signature, std::string_view path,
                                     file_operation operation, std::string_view username,
                                     std::string_view access_token,
                                     std::optional<std::string_view> expiration_text,
                                     std::int64_t now_unix) {
    std::optional<std::int64_t> expiration;
    if (expiration_text) {
        std::int64_t value = 0;
        const auto* first = expiration_text->data();
        const auto* last = first + expiration_text->size();
        const auto [end, ec] = std::from_chars(first, last, value);
        if (ec != std::errc() || end != last || expiration_text->empty())
            return signature_check::mismatch;
        expiration = value;
    }
    const auto expected = file_signature(path, operation, username, access_token, expiration);
    if (signature.size() != expected.size() ||
        CRYPTO_memcmp(signature.data(), expected.data(), expected.size()) != 0)
        return signature_check::mismatch;
    if (expiration && *expiration < now_unix) return signature_check::expired;
    return signature_check::valid;
}

bool is_well_formed_signature(std::string_view signature) noexcept {
    constexpr std::size_t digest_characters = 43;  // 32 bytes in base64, padding stripped
    if (signature.size() != 3 + digest_characters || !signature.starts_with("v1_")) return false;
    for (const char c : signature.substr(3)) {
        const bool base64 = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '+' || c == '/';
        if (!base64) return false;
    }
    return true;
}

bool signature_scan_budget::take(std::size_t checks, clock::time_point now) noexcept {
    if (now > last_) {
        const std::chrono::duration<double> elapsed = now - last_;
        tokens_ = std::min(rate_, tokens_ + elapsed.count() * rate_);
        last_ = now;
    }
    const auto wanted = static_cast<double>(checks);
    if (tokens_ < wanted) return false;
    tokens_ -= wanted;
    return true;
}

bool signature_scan_budget::should_warn(clock::time_point now) noexcept {
    if (warned_ && now - *warned_ < std::chrono::minutes(1)) return false;
    warned_ = now;
    return true;
}

}  // namespace moat::serve
