// The pids of a cgroup.procs file (one decimal pid per line, as the kernel writes it), parsed as
// the file is read. A read(2) of cgroup.procs may end anywhere, also in the middle of a number:
// the part of a line a chunk ends with waits for the next chunk, so a pid split across two reads
// is one pid, never two. Pure: no I/O, unit-tested (tests/sandboxd_units_test.cpp).
//
// Only whole lines count, and only a line of 1-10 digits naming a pid in [1, INT_MAX]: an empty
// line, a sign, a space, an overlong or too large number, and a last line without its newline are
// skipped (and counted), never read as a pid. A 0 (a process of another pid namespace, as the
// reader sees it) is skipped too: kill(0) would signal the caller's own process group. Memory is
// bounded whatever the input: only the unfinished line's digits are kept.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace moat::sandboxd {

class pid_lines {
  public:
    // Appends to `pids` the pid of each line that `chunk` completes.
    void feed(std::string_view chunk, std::vector<int>& pids);
    // At the end of the file: an unfinished last line is dropped (and counted as skipped).
    void finish();
    // Lines that were not a pid.
    std::size_t skipped() const noexcept { return skipped_; }

  private:
    void end_line(std::vector<int>& pids);

    static constexpr std::size_t max_digits = 10;  // INT_MAX has 10
    char digits_[max_digits] = {};
    std::size_t length_ = 0;
    bool bad_ = false;  // the current line already holds something that is not a pid
    std::size_t skipped_ = 0;
};

}  // namespace moat::sandboxd
