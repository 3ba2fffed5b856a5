#include "serve/server_secret.hpp"

#include "core/ascii.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace moat::serve {
namespace {

constexpr std::size_t secret_bytes = 32;

std::string hex(const unsigned char* data, std::size_t size) {
    return detail::hex_encoded(std::span(data, size));
}

std::string hmac_hex(const std::string& key, std::string_view message) {
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
    unsigned int length = 0;
    HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
         reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest.data(),
         &length);
    return hex(digest.data(), length);
}

error file_error(const std::string& path, std::string_view what) {
    return make_error(errc::backend_failure, "server secret " + path + ": " + std::string(what) +
                                                 ": " + std::strerror(errno));
}

result<std::string> read_secret(const std::string& path, int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return file_error(path, "cannot stat");
    if ((st.st_mode & 077) != 0 || st.st_uid != ::geteuid()) {
        return make_error(
            errc::backend_failure,
            "server secret " + path + " must be owned by this user with mode 0600 (chmod 600 it)");
    }
    std::string bytes(secret_bytes + 1, '\0');
    const ssize_t n = ::read(fd, bytes.data(), bytes.size());
    if (n != static_cast<ssize_t>(secret_bytes)) {
        return make_error(errc::backend_failure, "server secret " + path + " is not " +
                                                     std::to_string(secret_bytes) + " bytes");
    }
    bytes.resize(secret_bytes);
    return bytes;
}

}  // namespace

result<server_secret> server_secret::load_or_create(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno != ENOENT) return file_error(path, "cannot open");
    if (fd >= 0) {
        auto bytes = read_secret(path, fd);
        ::close(fd);
        if (!bytes) return std::move(bytes).error();
        return server_secret(std::move(*bytes));
    }
    std::array<unsigned char, secret_bytes> fresh{};
    if (RAND_bytes(fresh.data(), static_cast<int>(fresh.size())) != 1) {
        return make_error(errc::backend_failure, "server secret: no random bytes from OpenSSL");
    }
    const std::string temporary = path + ".tmp." + std::to_string(::getpid());
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return file_error(temporary, "cannot create");
    const bool written =
        ::write(fd, fresh.data(), fresh.size()) == static_cast<ssize_t>(fresh.size()) &&
        ::fsync(fd) == 0;
    ::close(fd);
    // link() does not replace: when two servers start at once, the first secret wins and both
    // read it back.
    const bool linked =
        written && (::link(temporary.c_str(), path.c_str()) == 0 || errno == EEXIST);
    const int saved = errno;
    ::unlink(temporary.c_str());
    errno = saved;
    if (!linked) return file_error(path, "cannot write");
    return load_or_create(path);
}

std::string server_secret::access_token(std::string_view sandbox_id) const {
    return hmac_hex(bytes_, sandbox_id);
}

std::string server_secret::traffic_token(std::string_view sandbox_id) const {
    return hmac_hex(bytes_, "moat.serve.traffic:" + std::string(sandbox_id));
}

std::string server_secret::scope() const {
    return hmac_hex(bytes_, "moat.serve.scope").substr(0, 16);
}

bool constant_time_equals(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) return false;
    if (a.empty()) return true;
    return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace moat::serve
