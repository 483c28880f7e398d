# d2l_find_torch([REQUIRED]): find_package(Torch) without mixing two LibTorch
# installations on one machine. Used by this project's build and by the
# installed package's config, so that consumers get the same Torch.
macro(d2l_find_torch)
  # TorchConfig.cmake finds its own libraries with find_library(... PATHS
  # <prefix>/lib), which searches the system directories first. With Debian's
  # libtorch-dev installed, a pip wheel's TorchConfig then links Debian's
  # libc10.so next to the wheel's libtorch, and programs crash at start. When
  # Torch comes from a prefix outside /usr (a wheel, an official archive),
  # search that prefix, not the system directories, while Torch is found.
  set(D2L_TORCH_OUTSIDE_SYSTEM OFF)
  foreach(dir IN LISTS Torch_DIR CMAKE_PREFIX_PATH)
    foreach(sub "" "/Torch" "/share/cmake/Torch" "/lib/cmake/Torch")
      if(EXISTS "${dir}${sub}/TorchConfig.cmake" AND NOT dir MATCHES "^/usr(/|$)")
        set(D2L_TORCH_OUTSIDE_SYSTEM ON)
      endif()
    endforeach()
  endforeach()
  if(D2L_TORCH_OUTSIDE_SYSTEM)
    # The one system library Torch's CUDA set-up looks for (librt).
    find_library(CUDAToolkit_rt_LIBRARY rt)
    set(D2L_SAVED_FIND_USE_SYSTEM_PATH ${CMAKE_FIND_USE_CMAKE_SYSTEM_PATH})
    set(CMAKE_FIND_USE_CMAKE_SYSTEM_PATH FALSE)
  endif()
  find_package(Torch ${ARGN})
  if(D2L_TORCH_OUTSIDE_SYSTEM)
    set(CMAKE_FIND_USE_CMAKE_SYSTEM_PATH ${D2L_SAVED_FIND_USE_SYSTEM_PATH})
  endif()
  # D2L_TORCH_CPU_ONLY: link LibTorch's CPU libraries (torch_cpu, c10), not
  # libtorch, which on a CUDA build loads libtorch_cuda and the CUDA libraries
  # it needs (about 3 GB of the wheel's nvidia packages). A CUDA wheel installed
  # without them (make's TORCH2_VARIANT=cpu) then builds and runs on the CPU.
  if(D2L_TORCH_CPU_ONLY AND Torch_FOUND)
    if(NOT TARGET torch_cpu OR NOT TARGET c10)
      message(FATAL_ERROR "D2L_TORCH_CPU_ONLY: LibTorch at ${TORCH_INSTALL_PREFIX} defines no "
                          "torch_cpu and c10 targets; configure without it")
    endif()
    # What the torch target carries: the C++ API's include folder, the ABI flag.
    separate_arguments(D2L_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
    set_property(TARGET torch_cpu APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${TORCH_INCLUDE_DIRS})
    set_property(TARGET torch_cpu APPEND PROPERTY INTERFACE_COMPILE_OPTIONS ${D2L_TORCH_CXX_FLAGS})
    set(TORCH_LIBRARIES torch_cpu c10)
  endif()
  # Libraries of two LibTorch installations in one program abort at start.
  foreach(lib IN ITEMS TORCH_LIBRARY c10_LIBRARY torch_cpu_LIBRARY C10_CUDA_LIBRARY)
    if(${lib} AND D2L_TORCH_OUTSIDE_SYSTEM)
      get_filename_component(D2L_LIB_REAL "${${lib}}" REALPATH)
      get_filename_component(D2L_PREFIX_REAL "${TORCH_INSTALL_PREFIX}" REALPATH)
      string(FIND "${D2L_LIB_REAL}" "${D2L_PREFIX_REAL}/" D2L_AT)
      if(NOT D2L_AT EQUAL 0)
        message(FATAL_ERROR "LibTorch at ${TORCH_INSTALL_PREFIX} was configured with ${lib} = "
                            "${${lib}}, a library of another LibTorch; delete the build "
                            "directory's CMakeCache.txt (or pass -D${lib}=) and configure again")
      endif()
    endif()
  endforeach()
endmacro()
