# What `cmake --install` and `make package` (CPack, cmake/D2LPackaging.cmake)
# put where. Two components: runtime (the shared libraries) and dev (headers,
# the CMake package, pkg-config files, the static libraries or the .so links).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(D2L_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/d2l_attention")

# d2l::train, d2l::viz and d2l::distributed go into the same export set, so
# that the package provides each whenever it was built.
set(D2L_INSTALL_TARGETS d2l_attention d2l_train)
set(D2L_HEADER_EXCLUDES "")
if(TARGET d2l_distributed)
  list(APPEND D2L_INSTALL_TARGETS d2l_distributed)
else()
  list(APPEND D2L_HEADER_EXCLUDES PATTERN distributed.h EXCLUDE)
endif()
if(TARGET d2l_viz)
  list(APPEND D2L_INSTALL_TARGETS d2l_viz)
else()
  # No headers without their library.
  list(APPEND D2L_HEADER_EXCLUDES PATTERN viz EXCLUDE PATTERN viz.h EXCLUDE
                          PATTERN heatmap.h EXCLUDE PATTERN plot.h EXCLUDE)
endif()
install(TARGETS ${D2L_INSTALL_TARGETS} EXPORT d2l_attentionTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(DIRECTORY include/d2l DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev
        ${D2L_HEADER_EXCLUDES})
install(EXPORT d2l_attentionTargets NAMESPACE d2l:: DESTINATION ${D2L_CMAKE_DIR} COMPONENT dev)

# What the package config records of this build: the LibTorch version it
# must meet again, whether it is static (its dependencies then come along),
# and which optional parts were built (its components). No path of this
# machine: LibTorch is found through the consumer's settings, then beside
# the installed package (docs/building.md, "Installing").
set(D2L_CONFIG_STATIC OFF)
if(NOT D2L_BUILD_SHARED)
  set(D2L_CONFIG_STATIC ON)
endif()
set(D2L_CONFIG_FMT_PACKAGE OFF)
if(NOT D2L_FMT_INCLUDE_DIR)
  set(D2L_CONFIG_FMT_PACKAGE ON)
endif()
configure_package_config_file(cmake/d2l_attentionConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/d2l_attentionConfig.cmake"
  INSTALL_DESTINATION ${D2L_CMAKE_DIR})
write_basic_package_version_file(
  "${CMAKE_CURRENT_BINARY_DIR}/d2l_attentionConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/d2l_attentionConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/d2l_attentionConfigVersion.cmake"
              "${CMAKE_CURRENT_SOURCE_DIR}/cmake/D2LFindTorch.cmake"
        DESTINATION ${D2L_CMAKE_DIR} COMPONENT dev)

# pkg-config files, one per library: d2l_attention (with LibTorch's flags:
# Debian's LibTorch has no .pc of its own), d2l_train, d2l_viz and
# d2l_distributed, which require it. Their paths derive from ${prefix}, which
# derives from the file's own place, so a moved prefix still works.
# LibTorch's own paths are its own: ${torch_prefix}.
include(D2LPkgConfig)
d2l_install_pkgconfig(${D2L_INSTALL_TARGETS})
