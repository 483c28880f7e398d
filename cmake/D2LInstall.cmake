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
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/d2l DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} ${D2L_HEADER_EXCLUDES})
install(EXPORT d2l_attentionTargets NAMESPACE d2l:: DESTINATION ${D2L_CMAKE_DIR})

configure_package_config_file(cmake/d2l_attentionConfig.cmake.in
  "${CMAKE_CURRENT_BINARY_DIR}/d2l_attentionConfig.cmake"
  INSTALL_DESTINATION ${D2L_CMAKE_DIR})
write_basic_package_version_file(
  "${CMAKE_CURRENT_BINARY_DIR}/d2l_attentionConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/d2l_attentionConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/d2l_attentionConfigVersion.cmake"
              "${CMAKE_CURRENT_SOURCE_DIR}/cmake/D2LFindTorch.cmake"
        DESTINATION ${D2L_CMAKE_DIR})
