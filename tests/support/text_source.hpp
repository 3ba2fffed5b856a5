// A byte_source (files.hpp) that yields one text as a single chunk, then the end: for streamed
// writes of small contents in tests.
#pragma once

#include <moat/files.hpp>

#include <memory>
#include <string>

namespace moat::test {

namespace detail {

struct text_state {
    std::string text;
    bool sent = false;
};

inline asio::awaitable<result<std::string>> pull_text(std::shared_ptr<text_state> state) {
    std::string chunk;
    if (!state->sent) chunk = state->text;
    state->sent = true;
    co_return chunk;
}

}  // namespace detail

inline byte_source text_source(std::string text) {
    auto state = std::make_shared<detail::text_state>();
    state->text = std::move(text);
    return [state]() { return detail::pull_text(state); };
}

}  // namespace moat::test
