// Host uid/gid ranges for sandboxes. Slot n maps sandbox ids [0, wire::uid_range_size) onto host
// ids starting at first_uid + n * wire::uid_range_size, so no two live sandboxes share a host id
// and none maps host root.
//
// The ranges are allocated host-wide, whatever state directory a backend uses: a slot is claimed
// by an exclusive flock on <host_lock_dir>/<first host uid>.lock (a fixed path on the host's
// tmpfs /run, so stale lock files vanish at boot and a lock outlives no process). The lock fd is
// handed to the sandbox's pid 1, so the slot stays claimed exactly as long as the sandbox lives,
// even after the helper that created it is gone.
//
// Where the slots lie, per systemd's UIDS-GIDS.md: above the container range nspawn and
// nsresourced allocate from (524288-1879048191), below the foreign-image range of newer
// systemd (2147352576-2147418111) and below 2^31 (which many programs mishandle); so never in
// systemd's dynamic (61184-65519), homed (60001-60513) or nspawn bind-user (60514-60577) users,
// nor in the regular and system users below 60001. A slot that overlaps an entry of
// /etc/subuid or /etc/subgid (any user) is skipped, read again at every claim.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "wire/protocol.hpp"

namespace moat::sandboxd {

inline constexpr std::uint32_t first_uid = 0x70000000u;  // 1879048192
inline constexpr std::uint32_t slot_count = 4094;        // up to 0x7ffe0000, the foreign range
inline constexpr const char* host_lock_dir = "/run/moat-uid-ranges";

static_assert(std::uint64_t{first_uid} > 1879048191u, "above systemd's container range");
static_assert(std::uint64_t{first_uid} + std::uint64_t{slot_count} * wire::uid_range_size <=
                  2147352576u,
              "below systemd's foreign uid range and 2^31");

struct uid_slot {
    int lock_fd = -1;  // close-on-exec; closing the last copy releases the slot
    std::uint32_t uid_base = 0;
};

struct uid_slot_options {
    // The lock directory; only the low-level tests pass another one.
    std::string lock_dir = host_lock_dir;
    // Files in /etc/subuid format (name:first:count) whose ranges no slot may overlap.
    std::vector<std::string> reserved_files = {"/etc/subuid", "/etc/subgid"};
};

class uid_slots {
  public:
    uid_slots() = default;
    uid_slots(const uid_slots&) = delete;
    uid_slots& operator=(const uid_slots&) = delete;
    ~uid_slots();

    // Creates the lock directory (0700; its parents 0755) if needed and checks it is this
    // user's and writable by no one else. Returns 0 or an errno.
    int open(uid_slot_options options = {});

    // Claims a free slot, probing from a random one. Returns 0, EAGAIN when every slot is taken
    // or reserved, or the errno of the failing call.
    int claim(uid_slot& out);
    // The same, probing from slot `first` (tests use it to ask for a given slot first).
    int claim_from(std::uint32_t first, uid_slot& out);

  private:
    int dir_fd_ = -1;
    std::vector<std::string> reserved_files_;
};

// Parses /etc/subuid-format text into [first, first + count) ranges; lines that are blank,
// comments or malformed are skipped.
struct id_range {
    std::uint64_t first = 0;
    std::uint64_t count = 0;
};
std::vector<id_range> parse_subid_ranges(std::string_view text);

}  // namespace moat::sandboxd
