# Standalone Asio (Debian's libasio-dev ships no CMake config). Provides Asio::asio, an INTERFACE
# target carrying the compile definitions every translation unit that includes Asio must agree on.
# Asio itself is compiled once, inside moat (src/core/asio_impl.cpp).
find_path(ASIO_INCLUDE_DIR asio.hpp)
if(ASIO_INCLUDE_DIR AND EXISTS "${ASIO_INCLUDE_DIR}/asio/version.hpp")
    file(STRINGS "${ASIO_INCLUDE_DIR}/asio/version.hpp" _asio_version_line
         REGEX "^#define ASIO_VERSION [0-9]+")
    string(REGEX REPLACE "^#define ASIO_VERSION ([0-9]+).*" "\\1" _asio_v "${_asio_version_line}")
    math(EXPR _asio_major "${_asio_v} / 100000")
    math(EXPR _asio_minor "${_asio_v} / 100 % 1000")
    math(EXPR _asio_patch "${_asio_v} % 100")
    set(Asio_VERSION "${_asio_major}.${_asio_minor}.${_asio_patch}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Asio REQUIRED_VARS ASIO_INCLUDE_DIR VERSION_VAR Asio_VERSION)
if(Asio_FOUND AND NOT TARGET Asio::asio)
    add_library(Asio::asio INTERFACE IMPORTED)
    set_target_properties(Asio::asio PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${ASIO_INCLUDE_DIR}")
    target_compile_definitions(Asio::asio INTERFACE
        ASIO_STANDALONE ASIO_SEPARATE_COMPILATION ASIO_NO_DEPRECATED
        # One allocation configuration for every translation unit. Asio 1.22 detects
        # std::aligned_alloc from a libstdc++ macro, so it depends on include order: a file that
        # includes Asio before any standard header (src/core/asio_impl.cpp) allocates with
        # operator new/delete, the others with aligned_alloc/free, and a block allocated in one
        # and freed in the other is an alloc-dealloc mismatch (glibc has aligned_alloc).
        ASIO_HAS_STD_ALIGNED_ALLOC=1
        # Asio 1.22 does not detect coroutine support under clang with libstdc++.
        $<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_CO_AWAIT=1 ASIO_HAS_STD_COROUTINE=1>)
endif()
