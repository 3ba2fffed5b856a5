// The bytes a sandbox's egress has moved over its life, charged against its byte budget, and the
// host memory its tunnels hold right now.
//
// A sandbox outlives the process that created it (survive_owner), and every process that attaches
// to it serves its egress proxy: the count must be the sandbox's, not one process's. A meter
// opened on a file keeps the count in that file, mapped shared: every process that opens the same
// file charges one counter (an atomic in the mapping; lock-free across processes). The local
// backend keeps it beside the sandbox's record (<state_dir>/sandboxes/<id>.egress) and removes it
// with the record. A meter made without a file counts in this process only (tests, and sandboxes
// whose meter file cannot be opened are refused instead: see local_backend).
//
// The second counter is the host memory (socket buffers and pipes) the sandbox's proxied
// connections hold: each serving process adds what its own connections' count changed by when it
// measures them (egress_proxy, about once a second while any are open) and takes its share back
// when it stops serving. `moat inventory` reads both with read_meter_file(). A process that dies
// leaves its last share counted (its sockets are gone): the figure is what the live processes last
// published plus that, until the sandbox ends and the file with it.
//
// The byte count only grows, so a process that dies mid-transfer loses nothing already charged;
// bytes are charged before they are passed on (egress_proxy), so the budget is never passed by more
// than what one splice moved before the charge failed, which is not passed on.
#pragma once

#include <moat/result.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace moat::egress {

class byte_meter {
  public:
    byte_meter() = default;  // counts in this process only
    byte_meter(const byte_meter&) = delete;
    byte_meter& operator=(const byte_meter&) = delete;
    ~byte_meter();

    // The meter kept in `path`: created 0600 and zeroed if missing, else the counts it holds (a
    // file of another size is refused: backend_failure naming it).
    static result<std::shared_ptr<byte_meter>> open_file(const std::string& path);

    std::uint64_t used() const noexcept;
    std::uint64_t buffered() const noexcept;
    void add_buffered(std::int64_t delta) noexcept;  // never below 0

    // Adds `n` when used() + n <= limit and returns true; otherwise sets the count to `limit`
    // (the budget is spent: later requests are refused) and returns false.
    bool try_charge(std::uint64_t n, std::uint64_t limit) noexcept;

  private:
    std::atomic_ref<std::uint64_t> counter(std::size_t which) const noexcept;

    mutable std::uint64_t local_[2] = {0, 0};  // bytes used, bytes buffered
    std::uint64_t* shared_ = nullptr;          // the mapping, when kept in a file
};

struct meter_reading {
    std::uint64_t bytes_used = 0;
    std::uint64_t buffered_bytes = 0;
};

// What a meter file holds, read without creating or mapping it; nullopt if it is missing or not
// a meter file.
std::optional<meter_reading> read_meter_file(const std::string& path);

}  // namespace moat::egress
