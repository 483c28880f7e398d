#include "seq2seq/sequence_checks.h"

#include <fmt/format.h>

#include "checks.h"

namespace d2l::detail {

torch::Tensor checked_tokens(const char* fn, const torch::Tensor& X,
                             const torch::nn::Embedding& embedding) {
  check_strided_layout(fn, "X", X);
  TORCH_CHECK(X.defined() && X.dim() == 2 && X.size(0) > 0 && X.size(1) > 0,
              fmt::format("{}: X must be a 2-D tensor (batch_size, num_steps) of token ids with "
                          "at least one example and one step, got {}",
                          fn, shape_of(X)));
  TORCH_CHECK(at::isIntegralType(X.scalar_type(), /*includeBool=*/false),
              fmt::format("{}: X must hold integer token ids, got dtype {}", fn,
                          c10::toString(X.scalar_type())));
  check_same_device(fn, "embedding.weight", embedding->weight, "X", X);
  const int64_t vocab_size = embedding->options.num_embeddings();
  const auto [lo, hi] = torch::aminmax(X);
  const int64_t min_id = lo.item<int64_t>(), max_id = hi.item<int64_t>();
  TORCH_CHECK(min_id >= 0 && max_id < vocab_size,
              fmt::format("{}: X must hold token ids in [0, vocab_size={}), got ids from {} to {}",
                          fn, vocab_size, min_id, max_id));
  return X.to(torch::kLong);
}

void check_enc_valid_lens(const char* fn, const char* name, const torch::Tensor& lens,
                          int64_t batch, const torch::Tensor& ref, const char* ref_name) {
  if (!lens.defined()) return;
  check_strided_layout(fn, name, lens);
  TORCH_CHECK(lens.dim() == 1 && lens.size(0) == batch,
              fmt::format("{}: {} must have shape [batch_size={}], got {}", fn, name, batch,
                          shape_of(lens)));
  check_same_device(fn, ref_name, ref, name, lens);
  check_length_values(fn, name, lens);
}

}  // namespace d2l::detail
