# d2l_install_pkgconfig(<target>...): a <target>.pc for each installed
# library, in ${CMAKE_INSTALL_LIBDIR}/pkgconfig (component dev).
#
# prefix= is found from the file's own place (${pcfiledir}, which pkg-config
# and pkgconf define), so an installed prefix can move; every other path of
# ours derives from it.
function(d2l_install_pkgconfig)
  # LibTorch's flags: its include directories, its libraries (the torch,
  # torch_cpu and c10 that TORCH_LIBRARIES names, by name from its library
  # folder) and its C++ ABI flag.
  get_filename_component(torch_prefix "${TORCH_INSTALL_PREFIX}" ABSOLUTE)
  set(torch_cflags "")
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    string(REPLACE "${torch_prefix}" "\${torch_prefix}" dir "${dir}")
    list(APPEND torch_cflags "-I${dir}")
  endforeach()
  list(REMOVE_DUPLICATES torch_cflags)
  string(REGEX MATCHALL "-D_GLIBCXX_USE_CXX11_ABI=[01]" abi "${TORCH_CXX_FLAGS}")
  list(APPEND torch_cflags ${abi})
  get_filename_component(torch_libdir "${TORCH_LIBRARY}" DIRECTORY)
  string(REPLACE "${torch_prefix}" "\${torch_prefix}" torch_libdir "${torch_libdir}")
  set(torch_libs "-L${torch_libdir}")
  foreach(name IN ITEMS torch torch_cpu c10)
    list(APPEND torch_libs "-l${name}")
  endforeach()
  if(D2L_LINK_LIBSTDCXX_FIRST)
    list(PREPEND torch_libs "-Wl,--push-state,--no-as-needed" "-lstdc++" "-Wl,--pop-state")
  endif()
  string(JOIN " " torch_cflags ${torch_cflags})
  string(JOIN " " torch_libs ${torch_libs})

  # A static library brings its own dependencies (Libs.private).
  set(private "")
  if(NOT D2L_BUILD_SHARED)
    set(private "-lz")
    if(NOT D2L_FMT_INCLUDE_DIR)
      string(APPEND private " -lfmt")
    endif()
    if(OpenMP_CXX_FOUND)
      string(APPEND private " ${OpenMP_CXX_FLAGS}")
    endif()
    if(D2L_FEATURE_D2L_VECTOR_KERNELS)
      string(APPEND private " -lsleef")
    endif()
    if(TARGET d2l_distributed AND D2L_GLOO_LINK)
      string(APPEND private " -lgloo")
    endif()
  endif()

  set(staging "${CMAKE_CURRENT_BINARY_DIR}/pkgconfig")
  # From <prefix>/<libdir>/pkgconfig back up to <prefix>: "../.." or "../../..".
  file(RELATIVE_PATH pc_to_prefix "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" pc_to_prefix "${pc_to_prefix}")
  foreach(target IN LISTS ARGN)
    get_target_property(export_name ${target} EXPORT_NAME)
    if(target STREQUAL "d2l_attention")
      set(requires "")
      set(cflags "-I\${includedir} ${torch_cflags}")
      set(libs "-L\${libdir} -l${target} ${torch_libs}")
      set(description "The attention chapter of Dive into Deep Learning on LibTorch")
      set(torch_line "torch_prefix=${torch_prefix}\n")
    else()
      set(requires "Requires: d2l_attention = ${PROJECT_VERSION}\n")
      set(cflags "-I\${includedir}")
      set(libs "-L\${libdir} -l${target}")
      set(description "d2l::${export_name}, part of d2l_attention")
      set(torch_line "")
    endif()
    file(WRITE "${staging}/${target}.pc"
"prefix=\${pcfiledir}/${pc_to_prefix}
exec_prefix=\${prefix}
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}
${torch_line}
Name: ${target}
Description: ${description}
Version: ${PROJECT_VERSION}
${requires}Cflags: ${cflags}
Libs: ${libs}
Libs.private: ${private}
")
    install(FILES "${staging}/${target}.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
  endforeach()
endfunction()
