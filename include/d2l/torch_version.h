#pragma once

// The LibTorch version this code is compiled against, and the features of
// the library that depend on it. `torch/version.h` defines
// TORCH_VERSION_MAJOR/MINOR on 1.13 and 2.x alike (Debian's 1.13.1 says 1.13.0).

#include <torch/version.h>

#include <string>

/// True when the LibTorch being compiled against is `major.minor` or newer.
/// (Compare both numbers: `TORCH_VERSION_MINOR >= 13` alone holds for 1.13
/// and not for 2.0.)
#define D2L_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||              \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

/// `at::scaled_dot_product_attention` with its fused CPU kernel (2.1).
#define D2L_HAS_SDPA D2L_TORCH_VERSION_AT_LEAST(2, 1)

namespace d2l {

/// The version of LibTorch this library was compiled against, "2.11.0".
std::string torch_version();

/// Whether this build can run AttentionBackend::kSdpa (LibTorch 2.1 or newer).
bool sdpa_available();

}  // namespace d2l
