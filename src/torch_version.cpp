#include <d2l/torch_version.h>

#include <fmt/format.h>

namespace d2l {

std::string torch_version() {
  return fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
}

bool sdpa_available() { return D2L_HAS_SDPA; }

}  // namespace d2l
