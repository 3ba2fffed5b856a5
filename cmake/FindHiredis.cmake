# hiredis (Debian's libhiredis-dev, 0.14): moat uses only its RESP reader (hiredis/read.h), and
# does the I/O on its own sockets (0.14 has no TLS).
#
# Provides the imported target Hiredis::hiredis and sets Hiredis_FOUND, Hiredis_INCLUDE_DIR,
# Hiredis_LIBRARY and Hiredis_VERSION. HIREDIS_ROOT, if set, is searched first.
find_path(Hiredis_INCLUDE_DIR hiredis/read.h HINTS ${HIREDIS_ROOT} PATH_SUFFIXES include)
find_library(Hiredis_LIBRARY NAMES hiredis HINTS ${HIREDIS_ROOT} PATH_SUFFIXES lib)

if(Hiredis_INCLUDE_DIR AND EXISTS ${Hiredis_INCLUDE_DIR}/hiredis/hiredis.h)
    file(STRINGS ${Hiredis_INCLUDE_DIR}/hiredis/hiredis.h _hiredis_version_lines
         REGEX "#define HIREDIS_(MAJOR|MINOR|PATCH) ")
    foreach(_part MAJOR MINOR PATCH)
        string(REGEX MATCH "HIREDIS_${_part} ([0-9]+)" _ "${_hiredis_version_lines}")
        set(_hiredis_${_part} ${CMAKE_MATCH_1})
    endforeach()
    set(Hiredis_VERSION ${_hiredis_MAJOR}.${_hiredis_MINOR}.${_hiredis_PATCH})
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Hiredis
    REQUIRED_VARS Hiredis_LIBRARY Hiredis_INCLUDE_DIR
    VERSION_VAR Hiredis_VERSION
    REASON_FAILURE_MESSAGE
        "hiredis (hiredis/read.h and libhiredis) is needed for the Redis session store: install \
Debian's libhiredis-dev (scripts/install-deps) or set HIREDIS_ROOT")

if(Hiredis_FOUND AND NOT TARGET Hiredis::hiredis)
    add_library(Hiredis::hiredis UNKNOWN IMPORTED)
    set_target_properties(Hiredis::hiredis PROPERTIES
        IMPORTED_LOCATION ${Hiredis_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${Hiredis_INCLUDE_DIR})
endif()
mark_as_advanced(Hiredis_INCLUDE_DIR Hiredis_LIBRARY)
