#include <d2l/backend.h>
#include <d2l/torch_version.h>

#include <fmt/format.h>

namespace d2l {

std::string to_string(Impl impl) {
  switch (impl) {
    case Impl::kAuto:
      return "auto";
    case Impl::kComposite:
      return "composite";
    case Impl::kFused:
      return "fused";
    case Impl::kSdpa:
      return "sdpa";
  }
  return fmt::format("Impl({})", static_cast<int>(impl));
}

std::string torch_version() {
  return fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
}

bool sdpa_available() { return D2L_HAS_SDPA; }

}  // namespace d2l
