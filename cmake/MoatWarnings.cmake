# Warning and sanitizer flags, as INTERFACE targets so each target opts in (the static sandbox
# helper must not get sanitizers).
add_library(moat_warnings INTERFACE)
target_compile_options(moat_warnings INTERFACE
    -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
    -Woverloaded-virtual -Wimplicit-fallthrough
    # g++ 12 reports Asio's coroutine frame allocator (aligned new + sized delete) as mismatched.
    $<$<CXX_COMPILER_ID:GNU>:-Wno-mismatched-new-delete>
    $<$<BOOL:${MOAT_WERROR}>:-Werror>)

add_library(moat_sanitizers INTERFACE)
if(MOAT_SANITIZE)
    string(REPLACE ";" "," _moat_san "${MOAT_SANITIZE}")
    target_compile_options(moat_sanitizers INTERFACE -fsanitize=${_moat_san} -fno-omit-frame-pointer
        -fno-sanitize-recover=all)
    target_link_options(moat_sanitizers INTERFACE -fsanitize=${_moat_san})
    if(MOAT_SANITIZE STREQUAL "thread" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
        target_compile_options(moat_sanitizers INTERFACE -Wno-tsan)
    endif()
endif()
