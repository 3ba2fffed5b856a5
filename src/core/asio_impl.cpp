// The one translation unit that compiles Asio (ASIO_SEPARATE_COMPILATION). It includes Asio before
// any standard header, so it is where Asio's include-order-dependent detection would differ from
// the other files: the allocation configuration must come from the Asio::asio definitions.
#if !defined(ASIO_HAS_STD_ALIGNED_ALLOC)
#error "build with the Asio::asio compile definitions (cmake/FindAsio.cmake)"
#endif
#include <asio/impl/src.hpp>
