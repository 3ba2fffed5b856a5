#include "egress/byte_meter.hpp"

#include "core/unique_fd.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace moat::egress {

namespace {

constexpr std::size_t meter_file_bytes = 2 * sizeof(std::uint64_t);

static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free,
              "a meter shared between processes needs a lock-free 64-bit atomic");

error failed(const std::string& what, const std::string& path, int error) {
    return make_error(errc::backend_failure,
                      "egress byte meter " + path + ": " + what + ": " + std::strerror(error));
}

}  // namespace

byte_meter::~byte_meter() {
    if (shared_ != nullptr) ::munmap(shared_, meter_file_bytes);
}

result<std::shared_ptr<byte_meter>> byte_meter::open_file(const std::string& path) {
    unique_fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.is_open()) return failed("open", path, errno);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return failed("stat", path, errno);
    if (!S_ISREG(st.st_mode)) return failed("not a regular file", path, EINVAL);
    // A new file is empty; extending it zero-fills. Two processes creating it at once both
    // extend it to the same size, which changes nothing.
    if (st.st_size == 0 && ::ftruncate(fd.get(), meter_file_bytes) != 0)
        return failed("ftruncate", path, errno);
    if (st.st_size != 0 && static_cast<std::size_t>(st.st_size) != meter_file_bytes) {
        return make_error(errc::backend_failure, "egress byte meter " + path + " is " +
                                                     std::to_string(st.st_size) + " bytes, not " +
                                                     std::to_string(meter_file_bytes));
    }
    void* mapped =
        ::mmap(nullptr, meter_file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (mapped == MAP_FAILED) return failed("mmap", path, errno);
    auto meter = std::make_shared<byte_meter>();
    meter->shared_ = static_cast<std::uint64_t*>(mapped);
    return meter;
}

std::atomic_ref<std::uint64_t> byte_meter::counter(std::size_t which) const noexcept {
    return std::atomic_ref<std::uint64_t>(shared_ != nullptr ? shared_[which] : local_[which]);
}

std::uint64_t byte_meter::used() const noexcept {
    return counter(0).load(std::memory_order_relaxed);
}

std::uint64_t byte_meter::buffered() const noexcept {
    return counter(1).load(std::memory_order_relaxed);
}

void byte_meter::add_buffered(std::int64_t delta) noexcept {
    auto count = counter(1);
    std::uint64_t seen = count.load(std::memory_order_relaxed);
    for (;;) {
        const auto magnitude = static_cast<std::uint64_t>(delta < 0 ? -delta : delta);
        const std::uint64_t next =
            delta >= 0 ? seen + magnitude : (seen > magnitude ? seen - magnitude : 0);
        if (count.compare_exchange_weak(seen, next, std::memory_order_relaxed)) return;
    }
}

bool byte_meter::try_charge(std::uint64_t n, std::uint64_t limit) noexcept {
    auto count = counter(0);
    std::uint64_t seen = count.load(std::memory_order_relaxed);
    for (;;) {
        const bool fits = seen <= limit && n <= limit - seen;
        const std::uint64_t next = fits ? seen + n : std::max(seen, limit);
        if (count.compare_exchange_weak(seen, next, std::memory_order_relaxed)) return fits;
    }
}

std::optional<meter_reading> read_meter_file(const std::string& path) {
    unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.is_open()) return std::nullopt;
    std::uint64_t counts[2] = {0, 0};
    const ssize_t n = ::pread(fd.get(), counts, sizeof counts, 0);
    if (n != static_cast<ssize_t>(sizeof counts)) return std::nullopt;
    return meter_reading{counts[0], counts[1]};
}

}  // namespace moat::egress
