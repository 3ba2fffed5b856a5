// SHA-256, streamed (OpenSSL's EVP): a layer's listing digest and an OCI blob's check.
#pragma once

#include "core/ascii.hpp"

#include <openssl/evp.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace moat::templates {

class sha256 {
  public:
    sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
        if (ctx_) EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
    }
    void add(std::string_view bytes) {
        if (ctx_) EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size());
    }
    // The digest in lowercase hex; empty when OpenSSL failed.
    std::string hex() {
        unsigned char digest[EVP_MAX_MD_SIZE];
        unsigned int length = 0;
        if (!ctx_ || EVP_DigestFinal_ex(ctx_.get(), digest, &length) != 1) return {};
        return detail::hex_encoded(std::span<const unsigned char>(digest, length));
    }

  private:
    std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

}  // namespace moat::templates
