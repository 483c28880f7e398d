# `make package` (cpack in a build tree): Debian packages of this build.
#   libd2l-attention<major.minor>  the shared libraries (component runtime)
#   libd2l-attention-dev           headers, CMake package, pkg-config files,
#                                  the .so links (component dev)
# Runtime dependencies come from dpkg-shlibdeps (LibTorch's libtorchX.Y and
# the rest, by package name); the dev package depends on the runtime one and
# on libtorch-dev of the same minor version. Installed under /usr.
set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "d2l-attention")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_VENDOR "d2l-attention")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "The attention chapter of Dive into Deep Learning as LibTorch modules")
set(CPACK_PACKAGE_DESCRIPTION
    "C++17 torch::nn::Module classes mirroring the PyTorch code of the attention chapter of Dive into Deep Learning: masked softmax, the scoring functions, multi-head attention, the Bahdanau and Transformer encoder-decoders, with fused CPU kernels.")
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_PACKAGE_CONTACT "d2l-attention maintainers <d2l-attention@users.noreply.github.com>")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "libs")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# libd2l_train needs libd2l_attention, from the same package.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${PROJECT_BINARY_DIR}/src" "${PROJECT_BINARY_DIR}/src/train")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME "libd2l-attention${D2L_SOVERSION}")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION "libs")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME "libd2l-attention-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION "libdevel")
# Only shared libraries make a runtime package; a static build's dev package
# stands alone.
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" D2L_TORCH_MINOR "${Torch_VERSION}")
math(EXPR D2L_TORCH_NEXT_MINOR "${CMAKE_MATCH_2} + 1")
set(D2L_DEV_DEPENDS
    "libtorch-dev (>= ${D2L_TORCH_MINOR}), libtorch-dev (<< ${CMAKE_MATCH_1}.${D2L_TORCH_NEXT_MINOR})")
if(D2L_BUILD_SHARED)
  string(PREPEND D2L_DEV_DEPENDS
         "libd2l-attention${D2L_SOVERSION} (= ${PROJECT_VERSION}), ")
else()
  set(CPACK_COMPONENTS_ALL dev)
  string(APPEND D2L_DEV_DEPENDS ", zlib1g-dev")
  if(NOT D2L_FMT_INCLUDE_DIR)
    string(APPEND D2L_DEV_DEPENDS ", libfmt-dev")
  endif()
endif()
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${D2L_DEV_DEPENDS}")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)
set(CPACK_PACKAGE_DIRECTORY "${PROJECT_BINARY_DIR}/packages")
include(CPack)
