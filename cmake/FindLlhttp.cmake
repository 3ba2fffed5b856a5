# llhttp (HTTP/1.1 framing) as Debian's node-llhttp package ships it: the C sources of llhttp 8.1
# under /usr/share/llhttp and its header under /usr/share/include/llhttp. There is no library to
# link; moat compiles the sources itself (src/CMakeLists.txt: the object library moat_llhttp).
#
# Sets Llhttp_FOUND, Llhttp_SOURCES (api.c http.c llhttp.c), Llhttp_INCLUDE_DIR and Llhttp_VERSION.
# LLHTTP_ROOT, if set, is searched first (a directory holding the three sources and llhttp.h).
find_path(Llhttp_INCLUDE_DIR llhttp.h
    HINTS ${LLHTTP_ROOT} PATHS /usr/share/include/llhttp /usr/include/llhttp /usr/include
    NO_CACHE)
set(Llhttp_SOURCES)
foreach(_llhttp_source api.c http.c llhttp.c)
    find_file(_llhttp_${_llhttp_source} ${_llhttp_source}
        HINTS ${LLHTTP_ROOT} PATHS /usr/share/llhttp NO_DEFAULT_PATH NO_CACHE)
    if(_llhttp_${_llhttp_source})
        list(APPEND Llhttp_SOURCES ${_llhttp_${_llhttp_source}})
    endif()
endforeach()

if(Llhttp_INCLUDE_DIR AND EXISTS ${Llhttp_INCLUDE_DIR}/llhttp.h)
    file(STRINGS ${Llhttp_INCLUDE_DIR}/llhttp.h _llhttp_version_lines
         REGEX "#define LLHTTP_VERSION_(MAJOR|MINOR|PATCH) ")
    foreach(_part MAJOR MINOR PATCH)
        string(REGEX MATCH "LLHTTP_VERSION_${_part} ([0-9]+)" _ "${_llhttp_version_lines}")
        set(_llhttp_${_part} ${CMAKE_MATCH_1})
    endforeach()
    set(Llhttp_VERSION ${_llhttp_MAJOR}.${_llhttp_MINOR}.${_llhttp_PATCH})
endif()

list(LENGTH Llhttp_SOURCES _llhttp_source_count)
if(NOT _llhttp_source_count EQUAL 3)
    set(Llhttp_INCLUDE_DIR Llhttp_INCLUDE_DIR-NOTFOUND)  # all three sources or nothing
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Llhttp
    REQUIRED_VARS Llhttp_INCLUDE_DIR Llhttp_SOURCES
    VERSION_VAR Llhttp_VERSION
    REASON_FAILURE_MESSAGE
        "llhttp's C sources (api.c http.c llhttp.c under /usr/share/llhttp) and llhttp.h (under \
/usr/share/include/llhttp) are needed: install Debian's node-llhttp (scripts/install-deps) or \
set LLHTTP_ROOT to a directory holding them")
