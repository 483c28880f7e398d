// fuzz_attention's masking area: sequence_mask, and masked_softmax through the
// public entry point, the composite path and the fused kernel.

#include <d2l/masked_softmax.h>
#include <d2l/sequence_mask.h>

#include <cmath>
#include <string>
#include <vector>

#include "fuzz_common.h"

namespace d2l_fuzz {

void fuzz_sequence_mask(Bytes& in) {
  const auto shape = dims(in, in.below(5));
  const auto dtype = in.pick(kDataDtypes);
  const auto X = make_arg(in, shape, dtype, in.flag());
  const int64_t N = shape.empty() ? 0 : shape[0], L = shape.size() < 2 ? 0 : shape[1];
  const auto lens = make_lengths(in, N, 1, L);
  const double value = in.pick<double>({0.0, -1.0, 1e6, -1e6, 1e30, kInf, -kInf, kNaN, 65504, 7e4});
  current.description = "sequence_mask value=" + std::to_string(value);
  note("X", X.value);
  note("valid_len", lens);
  const auto out = d2l::sequence_mask(X.value, lens, value);
  note("out", out);
  FUZZ_CHECK(out.sizes() == X.value.sizes() && out.scalar_type() == dtype,
             "sequence_mask changed the shape or dtype");
  if (!floating(out) || out.numel() == 0) return;
  std::vector<int64_t> view(out.dim(), 1);
  view[0] = N;
  view[1] = L;
  const auto keep = valid_mask(lens.reshape({N}), N, 1, L).reshape(view).expand(out.sizes());
  const auto od = out.detach().to(torch::kDouble), xd = X.value.detach().to(torch::kDouble);
  const auto nan_fill = std::isnan(value) ? keep.logical_not() : torch::zeros_like(keep);
  FUZZ_CHECK(torch::equal(od.isnan(), xd.isnan().logical_and(keep).logical_or(nan_fill)),
             "sequence_mask put NaN where it does not belong");
  const auto filled = torch::scalar_tensor(value, torch::kDouble).to(dtype).to(torch::kDouble);
  const auto expected = torch::where(keep, xd, filled.expand(out.sizes()));
  FUZZ_CHECK(torch::equal(od.nan_to_num(0, kInf, -kInf), expected.nan_to_num(0, kInf, -kInf)),
             "sequence_mask values differ from X and value");
  check_backward(out, {X.leaf}, true, in);
}

void fuzz_masked_softmax(Bytes& in) {
  const int64_t variant = in.below(3);
  const int64_t rank = in.below(4) == 0 ? in.below(5) : 3;
  auto shape = dims(in, rank);
  const auto dtype = in.pick(kDataDtypes);
  const auto X = make_arg(in, shape, dtype, in.flag());
  const int64_t B = rank > 0 ? shape[0] : 0, n = rank > 1 ? shape[1] : 0,
                m = rank > 2 ? shape[2] : 0;
  const auto lens = make_lengths(in, B, n, m);
  const auto grad_mode = pick_grad_mode(in);
  current.description = "masked_softmax variant=" + std::to_string(variant) +
                        " grad_mode=" + std::to_string(static_cast<int>(grad_mode));
  note("X", X.value);
  note("valid_lens", lens);
  torch::Tensor y;
  {
    GradModeScope scope(grad_mode);
    y = variant == 0   ? d2l::masked_softmax(X.value, lens)
        : variant == 1 ? d2l::masked_softmax(X.value, lens, d2l::AttentionBackend::kComposite)
                       : d2l::masked_softmax(X.value, lens, d2l::AttentionBackend::kFused);
  }
  note("y", y);
  FUZZ_CHECK(y.sizes() == X.value.sizes() && y.scalar_type() == dtype,
             "masked_softmax changed the shape or dtype");
  bool valid_finite;
  if (lens.defined()) {
    FUZZ_CHECK(y.dim() == 3, "masked_softmax accepted lengths for scores that are not 3-D");
    const auto valid = valid_mask(lens, B, n, m);
    valid_finite =
        X.value.detach().to(torch::kDouble).masked_select(valid).isfinite().all().item<bool>();
    check_weights(y, valid, valid_finite);
  } else {
    valid_finite = all_finite(X.value);
    if (y.dim() >= 1 && y.numel() > 0) {
      const auto flat = y.reshape({-1, y.size(-1)});
      check_weights(flat.unsqueeze(0), torch::ones({1, flat.size(0), flat.size(1)}, torch::kBool),
                    valid_finite);
    }
  }
  check_backward(y, {X.leaf}, valid_finite, in);
}

}  // namespace d2l_fuzz
