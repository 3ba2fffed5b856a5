# `cmake --install`: libmoat.a (the moat-sandboxd helper is embedded in it: nothing else ships),
# the public headers, and a CMake package under lib/cmake/moat, so that a consumer writes
#
#     find_package(moat REQUIRED)
#     target_link_libraries(app PRIVATE moat::moat)
#
# A sanitized build installs a sanitized libmoat.a, which only links into sanitized programs.
include(CMakePackageConfigHelpers)

set(MOAT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/moat)

install(TARGETS moat EXPORT moatTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/moat DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
install(FILES ${PROJECT_BINARY_DIR}/include/moat/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/moat)
install(EXPORT moatTargets NAMESPACE moat:: DESTINATION ${MOAT_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/moatConfig.cmake.in
    ${PROJECT_BINARY_DIR}/moatConfig.cmake INSTALL_DESTINATION ${MOAT_INSTALL_CMAKEDIR})
# 0.x: a new minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/moatConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
install(FILES
    ${PROJECT_BINARY_DIR}/moatConfig.cmake
    ${PROJECT_BINARY_DIR}/moatConfigVersion.cmake
    ${PROJECT_SOURCE_DIR}/cmake/FindAsio.cmake
    ${PROJECT_SOURCE_DIR}/cmake/FindHiredis.cmake
    ${PROJECT_SOURCE_DIR}/cmake/Findc-ares.cmake
    DESTINATION ${MOAT_INSTALL_CMAKEDIR})
