// libFuzzer target for the inotify record decoder (src/local/inotify_records.cpp): a name is read
// only within its record, decoding stops at the first record that runs past the bytes, and the
// event types of any mask are at most five.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_inotify_records_fuzzer &&
//   build/fuzz/fuzz/moat_inotify_records_fuzzer -max_total_time=60 fuzz/corpus/inotify_records
#include "local/inotify_records.hpp"

#include <sys/inotify.h>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto bytes = std::as_bytes(std::span(data, size));
    std::vector<moat::inotify_record> records;
    const bool whole = moat::decode_inotify_records(bytes, records);
    const char* begin = reinterpret_cast<const char*>(data);
    std::size_t covered = 0;
    for (const auto& record : records) {
        if (record.name.data() < begin + sizeof(inotify_event) ||
            record.name.data() + record.name.size() > begin + size) {
            __builtin_trap();
        }
        covered += sizeof(inotify_event);
        moat::watch_event_type types[5];
        if (moat::event_types(record.mask, types) > 5) __builtin_trap();
    }
    if (whole && size > 0 && records.empty()) __builtin_trap();
    if (covered > size) __builtin_trap();
    return 0;
}
