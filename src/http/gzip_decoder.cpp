#include "http/gzip_decoder.hpp"

#include <zlib.h>

#include <algorithm>
#include <climits>

namespace moat::http {

struct gzip_decoder::state {
    z_stream stream{};
    bool initialized = false;
    ~state() {
        if (initialized) ::inflateEnd(&stream);
    }
};

gzip_decoder::gzip_decoder(std::uint64_t max_output)
    : z_(std::make_unique<state>()), max_output_(max_output) {
    // 16 + MAX_WBITS: a gzip wrapper only (no zlib or raw deflate), its trailer checked.
    if (::inflateInit2(&z_->stream, 16 + MAX_WBITS) == Z_OK)
        z_->initialized = true;
    else
        failed_ = "the gzip decoder could not start (out of memory)";
}

gzip_decoder::~gzip_decoder() = default;

result<std::string> gzip_decoder::decode(std::string_view& input, std::size_t most) {
    if (!failed_.empty()) return make_error(errc::protocol_error, failed_);
    const auto fail = [&](errc code, std::string why) -> error {
        failed_ = why;
        return make_error(code, std::move(why));
    };
    std::string out;
    const std::uint64_t room = max_output_ - total_out_;
    // One byte more than the room, so that inflating past the cap is seen.
    const std::size_t want =
        static_cast<std::size_t>(std::min<std::uint64_t>(std::max<std::size_t>(most, 1), room + 1));
    out.resize(want);
    std::size_t used = 0;
    auto& z = z_->stream;
    while (used < want && (!input.empty() || pending_output_)) {
        if (at_member_end_) {
            if (input.empty()) break;
            // Another member follows the one that ended.
            if (::inflateReset(&z) != Z_OK) return fail(errc::protocol_error, "gzip reset failed");
            at_member_end_ = false;
        }
        const auto in_size = static_cast<uInt>(std::min<std::size_t>(input.size(), UINT_MAX));
        z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(input.data()));
        z.avail_in = in_size;
        z.next_out = reinterpret_cast<Bytef*>(out.data() + used);
        z.avail_out = static_cast<uInt>(std::min<std::size_t>(want - used, UINT_MAX));
        const uInt out_before = z.avail_out;
        const int rc = ::inflate(&z, Z_NO_FLUSH);
        input.remove_prefix(in_size - z.avail_in);
        used += out_before - z.avail_out;
        // The room ran out: zlib may hold more output (a long match, a stored block) that needs
        // no more input, so the next call inflates even with none.
        pending_output_ = z.avail_out == 0;
        if (rc == Z_STREAM_END) {
            at_member_end_ = true;
            pending_output_ = false;
            continue;
        }
        if (rc == Z_BUF_ERROR) {  // no progress possible: everything pending is out
            pending_output_ = false;
            break;
        }
        if (rc != Z_OK) {
            const char* why = z.msg != nullptr ? z.msg : "invalid data";
            return fail(errc::protocol_error, std::string("the gzip body is corrupt: ") + why);
        }
    }
    if (used == 0 && !input.empty())
        return fail(errc::protocol_error, "the gzip body is corrupt: no progress");
    if (used > room)
        return fail(errc::too_large, "the gzip body inflates to more than " +
                                         std::to_string(max_output_) + " bytes");
    out.resize(used);
    total_out_ += used;
    return out;
}

}  // namespace moat::http
