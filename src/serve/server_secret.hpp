// The server secret and what is derived from it: each sandbox's envd access token and traffic
// token, and the scope label that marks the sandboxes this server created.
//
// The secret is 32 random bytes in a 0600 file of the state directory, made on first start and
// read on every later one, so a restarted server derives the same tokens for the sandboxes it
// adopts without storing any token. Tokens and the secret never appear in a log or an error.
#pragma once

#include <moat/result.hpp>

#include <string>
#include <string_view>

namespace moat::serve {

class server_secret {
  public:
    // Reads `path`, or creates it (0600, written atomically) with 32 bytes from the kernel's
    // random source. Errors: backend_failure naming the path (unreadable, wrong size, a mode
    // that lets others read it).
    static result<server_secret> load_or_create(const std::string& path);

    // HMAC-SHA256(secret, sandbox id), lower-case hex: the sandbox's envdAccessToken.
    std::string access_token(std::string_view sandbox_id) const;
    // HMAC-SHA256(secret, "moat.serve.traffic:" + sandbox id), lower-case hex: the
    // trafficAccessToken of a sandbox whose ports are private (never equal to any access token).
    std::string traffic_token(std::string_view sandbox_id) const;
    // A short public name for this secret (hex of HMAC-SHA256(secret, "moat.serve.scope"), 16
    // digits): the value of the scope label on every sandbox this server creates, so servers
    // with different state directories never see each other's sandboxes.
    std::string scope() const;

  private:
    explicit server_secret(std::string bytes) : bytes_(std::move(bytes)) {}
    std::string bytes_;
};

// Equality that takes the same time whatever the contents (CRYPTO_memcmp); strings of different
// lengths are unequal (the length of a token is not a secret).
bool constant_time_equals(std::string_view a, std::string_view b) noexcept;

}  // namespace moat::serve
