#include "sandboxd/uid_slots.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <charconv>

namespace moat::sandboxd {
namespace {

constexpr std::size_t max_subid_file_bytes = 1 << 20;

// mkdir -p with `mode` for the last component and 0755 for the others.
int make_directory(const std::string& dir, mode_t mode) {
    for (std::size_t at = dir.find('/', 1); at != std::string::npos; at = dir.find('/', at + 1)) {
        if (::mkdir(dir.substr(0, at).c_str(), 0755) != 0 && errno != EEXIST) return errno;
    }
    if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) return errno;
    return 0;
}

// 0 with the file's ranges appended (none when it does not exist), or an errno.
int read_reserved(const std::string& path, std::vector<id_range>& out) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : errno;
    std::string text;
    char buffer[4096];
    for (;;) {
        const ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || text.size() + static_cast<std::size_t>(n) > max_subid_file_bytes) {
            const int err = n < 0 ? errno : (n == 0 ? 0 : EFBIG);
            ::close(fd);
            if (err != 0) return err;
            break;
        }
        text.append(buffer, static_cast<std::size_t>(n));
    }
    for (const auto& r : parse_subid_ranges(text)) out.push_back(r);
    return 0;
}

bool overlaps(std::uint64_t first, std::uint64_t count, const std::vector<id_range>& ranges) {
    for (const auto& r : ranges) {
        if (first < r.first + r.count && r.first < first + count) return true;
    }
    return false;
}

bool parse_number(std::string_view text, std::uint64_t& out) {
    if (text.empty()) return false;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

std::vector<id_range> parse_subid_ranges(std::string_view text) {
    std::vector<id_range> out;
    while (!text.empty()) {
        const auto eol = text.find('\n');
        std::string_view line = text.substr(0, eol);
        text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
        if (line.empty() || line.front() == '#') continue;
        const auto first_colon = line.find(':');
        if (first_colon == std::string_view::npos) continue;
        const std::string_view rest = line.substr(first_colon + 1);
        const auto second_colon = rest.find(':');
        if (second_colon == std::string_view::npos) continue;
        id_range r;
        if (!parse_number(rest.substr(0, second_colon), r.first) ||
            !parse_number(rest.substr(second_colon + 1), r.count) || r.count == 0 ||
            r.first > 0xffffffffull || r.count > 0x100000000ull)
            continue;
        out.push_back(r);
    }
    return out;
}

uid_slots::~uid_slots() {
    if (dir_fd_ >= 0) ::close(dir_fd_);
}

int uid_slots::open(uid_slot_options options) {
    if (const int err = make_directory(options.lock_dir, 0700)) return err;
    dir_fd_ = ::open(options.lock_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dir_fd_ < 0) return errno;
    // Whoever could write here could take or fake every other helper's slots.
    struct stat st {};
    if (::fstat(dir_fd_, &st) != 0) return errno;
    if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) return EPERM;
    reserved_files_ = std::move(options.reserved_files);
    return 0;
}

int uid_slots::claim(uid_slot& out) {
    // Randomness only spreads where the probe starts (any start finds a free slot, every slot is
    // tried once): one call, no loop, and without it the pid still spreads helpers apart.
    std::uint32_t start = 0;
    if (::getrandom(&start, sizeof start, GRND_NONBLOCK) != sizeof start) {
        start = static_cast<std::uint32_t>(::getpid());
    }
    return claim_from(start, out);
}

int uid_slots::claim_from(std::uint32_t first, uid_slot& out) {
    std::vector<id_range> reserved;
    for (const auto& path : reserved_files_) {
        if (const int err = read_reserved(path, reserved)) return err;
    }
    for (std::uint32_t i = 0; i < slot_count; ++i) {
        const std::uint32_t slot = (first + i) % slot_count;
        const std::uint32_t base = first_uid + slot * wire::uid_range_size;
        if (overlaps(base, wire::uid_range_size, reserved)) continue;
        char name[24];
        auto [end, ec] = std::to_chars(name, name + sizeof name - 6, base);
        (void)ec;
        std::char_traits<char>::copy(end, ".lock", 6);
        const int fd = ::openat(dir_fd_, name, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) return errno;
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
            out.lock_fd = fd;
            out.uid_base = base;
            return 0;
        }
        const int err = errno;
        ::close(fd);
        if (err != EWOULDBLOCK) return err;
    }
    return EAGAIN;
}

}  // namespace moat::sandboxd
