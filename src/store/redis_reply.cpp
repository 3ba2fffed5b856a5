#include "store/redis_reply.hpp"

#include <hiredis/read.h>

#include <new>

namespace moat::store {

// What the reader's callbacks check against, and why they refused (hiredis reports any refusal
// as "out of memory").
struct reply_reader::budget {
    reply_limits limits;
    std::size_t bytes = 0;  // of the reply being built
    std::string refusal;
};

namespace {

reply_reader::budget& budget_of(const redisReadTask* task) {
    return *static_cast<reply_reader::budget*>(task->privdata);
}

std::size_t depth_of(const redisReadTask* task) {
    std::size_t depth = 0;
    for (const auto* t = task->parent; t != nullptr; t = t->parent) ++depth;
    return depth;
}

// The root reply is allocated; every element lives in its parent's vector, sized by createArray
// before any element is made, so the pointers hiredis keeps stay valid.
redis_reply* place(const redisReadTask* task) {
    if (task->parent == nullptr) return new (std::nothrow) redis_reply{};
    auto* parent = static_cast<redis_reply*>(task->parent->obj);
    const auto index = static_cast<std::size_t>(task->idx);
    if (parent == nullptr || index >= parent->elements.size()) return nullptr;
    return &parent->elements[index];
}

bool charge(const redisReadTask* task, std::size_t bytes) {
    auto& b = budget_of(task);
    b.bytes += bytes;
    if (b.bytes > b.limits.max_bytes) {
        b.refusal = "a reply larger than " + std::to_string(b.limits.max_bytes) + " bytes";
        return false;
    }
    return true;
}

void* create_string(const redisReadTask* task, char* data, size_t length) {
    // 16: what an element costs beyond its bytes, so a flood of empty strings is bounded too.
    if (!charge(task, length + 16)) return nullptr;
    auto* reply = place(task);
    if (reply == nullptr) return nullptr;
    if (task->type == REDIS_REPLY_ERROR) {
        reply->type = redis_reply::kind::error;
    } else if (task->type == REDIS_REPLY_STATUS) {
        reply->type = redis_reply::kind::status;
    } else {
        reply->type = redis_reply::kind::string;
    }
    reply->text.assign(data, length);
    return reply;
}

void* create_array(const redisReadTask* task, int elements) {
    auto& b = budget_of(task);
    if (elements < 0) {
        b.refusal = "an array of negative length";
        return nullptr;
    }
    if (static_cast<std::size_t>(elements) > b.limits.max_elements) {
        b.refusal = "an array of more than " + std::to_string(b.limits.max_elements) + " elements";
        return nullptr;
    }
    if (depth_of(task) + 1 > b.limits.max_depth) {
        b.refusal = "arrays nested deeper than " + std::to_string(b.limits.max_depth);
        return nullptr;
    }
    if (!charge(task, 16 * (static_cast<std::size_t>(elements) + 1))) return nullptr;
    auto* reply = place(task);
    if (reply == nullptr) return nullptr;
    reply->type = redis_reply::kind::array;
    reply->elements.resize(static_cast<std::size_t>(elements));
    return reply;
}

void* create_integer(const redisReadTask* task, long long value) {
    if (!charge(task, 16)) return nullptr;
    auto* reply = place(task);
    if (reply == nullptr) return nullptr;
    reply->type = redis_reply::kind::integer;
    reply->integer = value;
    return reply;
}

void* create_nil(const redisReadTask* task) {
    if (!charge(task, 16)) return nullptr;
    auto* reply = place(task);
    if (reply == nullptr) return nullptr;
    reply->type = redis_reply::kind::nil;
    return reply;
}

// hiredis frees only the root (the elements belong to it).
void free_object(void* object) {
    delete static_cast<redis_reply*>(object);
}

redisReplyObjectFunctions reply_functions = {create_string, create_array, create_integer,
                                             create_nil, free_object};

redisReader* as_reader(void* reader) {
    return static_cast<redisReader*>(reader);
}

}  // namespace

reply_reader::reply_reader(reply_limits limits)
    : limits_(limits), budget_(std::make_unique<budget>()) {
    budget_->limits = limits;
    auto* reader = redisReaderCreateWithFunctions(&reply_functions);
    if (reader == nullptr) throw std::bad_alloc();
    // hiredis copies the reader's privdata into every task it makes.
    reader->privdata = budget_.get();
    // Keep the buffer (do not free and reallocate it after each reply) up to the cap.
    reader->maxbuf = limits.max_bytes;
    reader_ = reader;
}

reply_reader::~reply_reader() {
    redisReaderFree(as_reader(reader_));
}

result<void> reply_reader::feed(std::string_view bytes) {
    if (failed_) return make_error(errc::protocol_error, "Redis: the reply stream is unusable");
    auto* reader = as_reader(reader_);
    const auto pending = reader->len - reader->pos;
    // The unparsed input is what one incomplete reply occupies: a bulk string's bytes arrive
    // here before hiredis hands them to create_string.
    if (pending + bytes.size() > limits_.max_bytes + 64) {
        failed_ = true;
        return make_error(errc::protocol_error, "Redis sent a reply larger than " +
                                                    std::to_string(limits_.max_bytes) + " bytes");
    }
    if (redisReaderFeed(reader, bytes.data(), bytes.size()) != REDIS_OK) {
        failed_ = true;
        return make_error(errc::protocol_error, "Redis reply: the reader cannot buffer it");
    }
    return {};
}

result<std::optional<redis_reply>> reply_reader::next() {
    if (failed_) return make_error(errc::protocol_error, "Redis: the reply stream is unusable");
    auto* reader = as_reader(reader_);
    void* object = nullptr;
    const int status = redisReaderGetReply(reader, &object);
    if (status != REDIS_OK) {
        failed_ = true;
        std::string why = budget_->refusal;
        if (why.empty()) why = reader->errstr;
        return make_error(errc::protocol_error, "Redis sent " + why);
    }
    if (object == nullptr) return std::optional<redis_reply>{};
    budget_->bytes = 0;
    std::unique_ptr<redis_reply> owned(static_cast<redis_reply*>(object));
    return std::optional<redis_reply>{std::move(*owned)};
}

void append_command(std::string& out, std::span<const std::string> arguments) {
    out += '*';
    out += std::to_string(arguments.size());
    out += "\r\n";
    for (const auto& argument : arguments) {
        out += '$';
        out += std::to_string(argument.size());
        out += "\r\n";
        out += argument;
        out += "\r\n";
    }
}

std::string describe_reply(const redis_reply& reply) {
    switch (reply.type) {
        case redis_reply::kind::error: {
            // Redis's error line, as Redis wrote it; never carries a command's arguments.
            constexpr std::size_t cap = 160;
            std::string line = reply.text.substr(0, cap);
            for (auto& c : line) {
                if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
            }
            return line;
        }
        case redis_reply::kind::string:
            return "a string reply";
        case redis_reply::kind::array:
            return "an array reply";
        case redis_reply::kind::integer:
            return "an integer reply";
        case redis_reply::kind::nil:
            return "a nil reply";
        case redis_reply::kind::status:
            return "status " + reply.text.substr(0, 40);
    }
    return "a reply";
}

}  // namespace moat::store
