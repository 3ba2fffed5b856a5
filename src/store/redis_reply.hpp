// RESP (the Redis protocol): replies as values, the reader that parses them from bytes with caps,
// and the encoder of commands.
//
// Parsing is hiredis's redisReader (Debian's hiredis 0.14 has no TLS, so moat does the I/O and
// uses hiredis only for RESP). hiredis buffers without limit and nests up to 7 levels; the
// reply_reader bounds both: the bytes of one reply (strings and the buffered, unparsed input),
// the elements of one array and the nesting depth. A reply past a cap is a protocol_error, and
// the reader is unusable afterwards (the stream's framing is lost: close the connection).
#pragma once

#include <moat/result.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moat::store {

struct redis_reply {
    enum class kind { string, array, integer, nil, status, error };
    kind type = kind::nil;
    std::string text;  // string, status, error
    long long integer = 0;
    std::vector<redis_reply> elements;  // array

    bool is_error() const noexcept { return type == kind::error; }
    bool is_nil() const noexcept { return type == kind::nil; }
};

struct reply_limits {
    std::size_t max_bytes = 1 << 20;  // one reply's strings plus its unparsed input
    std::size_t max_elements = 1024;  // one array's elements
    std::size_t max_depth = 4;        // arrays within arrays (1: a flat array)
};

class reply_reader {
  public:
    explicit reply_reader(reply_limits limits);
    ~reply_reader();
    reply_reader(const reply_reader&) = delete;
    reply_reader& operator=(const reply_reader&) = delete;

    // Appends bytes read from the peer. protocol_error when the unparsed input passes the cap.
    result<void> feed(std::string_view bytes);
    // The next complete reply, nullopt when more bytes are needed, protocol_error for bytes that
    // are not RESP or a reply past a cap.
    result<std::optional<redis_reply>> next();

    struct budget;

  private:
    reply_limits limits_;
    std::unique_ptr<budget> budget_;
    void* reader_ = nullptr;  // redisReader*
    bool failed_ = false;
};

// Appends one command as a RESP array of bulk strings.
void append_command(std::string& out, std::span<const std::string> arguments);

// A reply as one short line for error details: an error's text (capped), or its kind.
std::string describe_reply(const redis_reply& reply);

}  // namespace moat::store
