# c-ares (Debian's libc-ares-dev, 1.18): the egress proxy's asynchronous DNS resolver
# (src/egress/name_resolver.cpp). Debian ships no CMake config for it, only libcares.pc.
#
# Provides the imported target c-ares::cares (the name c-ares' own CMake config uses) and sets
# c-ares_FOUND, c-ares_INCLUDE_DIR, c-ares_LIBRARY and c-ares_VERSION. CARES_ROOT, if set, is
# searched first.
find_path(c-ares_INCLUDE_DIR ares.h HINTS ${CARES_ROOT} PATH_SUFFIXES include)
find_library(c-ares_LIBRARY NAMES cares HINTS ${CARES_ROOT} PATH_SUFFIXES lib)

if(c-ares_INCLUDE_DIR AND EXISTS ${c-ares_INCLUDE_DIR}/ares_version.h)
    file(STRINGS ${c-ares_INCLUDE_DIR}/ares_version.h _cares_version_line
         REGEX "#define ARES_VERSION_STR ")
    string(REGEX MATCH "\"([0-9.]+)\"" _ "${_cares_version_line}")
    set(c-ares_VERSION ${CMAKE_MATCH_1})
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(c-ares
    REQUIRED_VARS c-ares_LIBRARY c-ares_INCLUDE_DIR
    VERSION_VAR c-ares_VERSION
    REASON_FAILURE_MESSAGE
        "c-ares (ares.h and libcares) is needed for the egress proxy's resolver: install Debian's \
libc-ares-dev (scripts/install-deps) or set CARES_ROOT")

if(c-ares_FOUND AND NOT TARGET c-ares::cares)
    add_library(c-ares::cares UNKNOWN IMPORTED)
    set_target_properties(c-ares::cares PROPERTIES
        IMPORTED_LOCATION ${c-ares_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${c-ares_INCLUDE_DIR})
endif()
mark_as_advanced(c-ares_INCLUDE_DIR c-ares_LIBRARY)
