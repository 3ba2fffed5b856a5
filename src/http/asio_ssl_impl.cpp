// Asio's SSL implementation, compiled once (ASIO_SEPARATE_COMPILATION), beside core/asio_impl.cpp:
// kept apart so that what compiles Asio's core (the fuzzers too) does not need OpenSSL.
#include <asio/ssl/impl/src.hpp>
