# The compiler cache: every preset compiles through ccache when it is installed, into one cache
# directory that every clone on the machine shares. CI runs in a fresh clone on the machine that
# built the same sources a moment before, so its four builds are mostly cache hits.
#
# - The directory: $CCACHE_DIR when the environment sets it; else /var/cache/moat-ccache when it
#   exists and is writable (scripts/install-deps creates it, with a size cap in its ccache.conf);
#   else ccache's own default (~/.cache/ccache). Fixed rather than under $HOME because CI's HOME
#   may differ from the developer's.
# - Clones in other folders hit the same entries: CCACHE_BASEDIR turns the clone's absolute paths
#   on the command line into relative ones, and -ffile-prefix-map takes the clone's path out of
#   __FILE__ and the debug info (ccache then hashes the mapped path, not the absolute one).
#   Absolute paths of the clone compiled into a translation unit (a -D with a path) defeat that:
#   keep them in one small file each (tests/support/build_paths.cpp).
# - MOAT_CCACHE=OFF turns it off; a launcher set by the user (CMAKE_<LANG>_COMPILER_LAUNCHER) wins.
option(MOAT_CCACHE "Compile through ccache when it is installed" ON)

# Relative paths in __FILE__ and the debug info, with or without the cache: builds of the same
# sources in two clones produce the same objects. A debugger finds sources from the build
# directory's parent (`directory <clone>` in gdb).
add_compile_options(-ffile-prefix-map=${PROJECT_SOURCE_DIR}/=)

find_program(MOAT_CCACHE_PROGRAM ccache)
if(NOT MOAT_CCACHE OR NOT MOAT_CCACHE_PROGRAM)
    return()
endif()
if(CMAKE_CXX_COMPILER_LAUNCHER OR CMAKE_C_COMPILER_LAUNCHER)
    return()
endif()

set(_moat_ccache_environment CCACHE_BASEDIR=${PROJECT_SOURCE_DIR})
if(NOT DEFINED ENV{CCACHE_DIR})
    set(_moat_shared_cache /var/cache/moat-ccache)
    if(IS_DIRECTORY ${_moat_shared_cache})
        # Writable by this user? (file(ACCESS) has no writable test before CMake 3.29.)
        execute_process(COMMAND test -w ${_moat_shared_cache} RESULT_VARIABLE _moat_not_writable)
        if(_moat_not_writable EQUAL 0)
            list(APPEND _moat_ccache_environment CCACHE_DIR=${_moat_shared_cache})
        endif()
    endif()
endif()
# env(1) sets the variables for each compile: the launcher is one program and its arguments.
find_program(MOAT_ENV_PROGRAM env REQUIRED)
set(_moat_launcher ${MOAT_ENV_PROGRAM} ${_moat_ccache_environment} ${MOAT_CCACHE_PROGRAM})
set(CMAKE_C_COMPILER_LAUNCHER ${_moat_launcher})
set(CMAKE_CXX_COMPILER_LAUNCHER ${_moat_launcher})
message(STATUS "compiling through ccache: ${_moat_ccache_environment}")
