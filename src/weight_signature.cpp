// WeightSignature (Note [Caches keyed on weights] in weight_signature.h).

#include "weight_signature.h"

#include <cstring>

namespace d2l::detail {
namespace {

// Four independent multiply-xor chains over 8-byte words (32 bytes a round),
// so that the multiplications' latency overlaps: several bytes a cycle,
// faster than the weights stream from memory.
constexpr uint64_t kPrime = 0x9E3779B97F4A7C15ull;  // odd: a bijection mod 2^64
constexpr uint64_t kSeed[4] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull,
                               0x082EFA98EC4E6C89ull};

uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  return h;
}

uint64_t hash_bytes(const unsigned char* p, size_t n) {
  uint64_t h[4] = {kSeed[0], kSeed[1], kSeed[2], kSeed[3]};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int lane = 0; lane < 4; ++lane) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * lane, 8);
      h[lane] = (h[lane] ^ w) * kPrime;
    }
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < n; ++k) tail |= uint64_t{p[i + k]} << (8 * (k % 8));
  uint64_t out = mix(h[0]) ^ mix(h[1] + 1) * 3 ^ mix(h[2] + 2) * 5 ^ mix(h[3] + 3) * 7;
  return mix(out ^ tail ^ (uint64_t{n} * kPrime));
}

}  // namespace

uint64_t fingerprint(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return hash_bytes(static_cast<const unsigned char*>(c.data_ptr()), c.nbytes());
}

WeightSignature::Entry WeightSignature::entry_of(const torch::Tensor& t, bool bytes) {
  Entry e;
  e.tensor = t;
  e.version = t._version();
  e.data = t.data_ptr();
  e.dtype = t.scalar_type();
  e.device = t.device();
  e.sizes = t.sizes().vec();
  e.fingerprint = bytes && t.device().is_cpu() ? fingerprint(t) : 0;
  return e;
}

WeightSignature::WeightSignature(const std::vector<torch::Tensor>& params, bool bytes)
    : bytes_(bytes) {
  entries_.reserve(params.size());
  for (const auto& p : params) entries_.push_back(entry_of(p, bytes));
}

WeightSignature::Match WeightSignature::match(const std::vector<torch::Tensor>& params,
                                              bool values) const {
  TORCH_INTERNAL_ASSERT(bytes_ || !values, "a WeightSignature without bytes asked for them");
  if (params.size() != entries_.size()) return Match::kOther;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!entries_[i].tensor.is_same(params[i])) return Match::kOther;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& e = entries_[i];
    const auto& p = params[i];
    if (e.version != p._version() || e.data != p.data_ptr() || e.dtype != p.scalar_type() ||
        e.device != p.device() || p.sizes() != torch::IntArrayRef(e.sizes)) {
      return Match::kChanged;
    }
  }
  for (size_t i = 0; values && i < params.size(); ++i) {
    if (params[i].device().is_cpu() && entries_[i].fingerprint != fingerprint(params[i])) {
      return Match::kChanged;
    }
  }
  return Match::kSame;
}

}  // namespace d2l::detail
