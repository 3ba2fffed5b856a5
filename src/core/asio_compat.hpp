// Differences between Asio versions, kept in one place. Asio 1.22 (Debian 12) has as_tuple and
// deferred only under asio::experimental; later versions promote them to asio::.
#pragma once

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/deferred.hpp>

namespace moat {

using asio::experimental::as_tuple;
inline constexpr auto& deferred = asio::experimental::deferred;

}  // namespace moat
