// fuzz_attention's dot-product area: functional::dot_product_attention and the
// DotProductAttention module, on every implementation, mode and grad mode.

#include <d2l/dot_product_attention.h>

#include <sstream>
#include <string>
#include <tuple>

#include "fuzz_common.h"

namespace d2l_fuzz {

void fuzz_dot_product_functional(Bytes& in) {
  auto a = make_qkv(in, in.below(8) != 0);
  const double dropout = in.pick(kDropouts);
  const bool training = in.flag();
  const auto path = in.pick(kPaths);
  const auto grad_mode = pick_grad_mode(in);
  // Without weights (and training dropout) the CPU paths run the flash kernel.
  const bool need_weights = in.flag();
  current.description = "dot_product_attention dropout=" + std::to_string(dropout) +
                        " training=" + std::to_string(training) +
                        " path=" + std::to_string(static_cast<int>(path)) +
                        " grad_mode=" + std::to_string(static_cast<int>(grad_mode)) +
                        " need_weights=" + std::to_string(need_weights);
  torch::Tensor out, weights;
  {
    GradModeScope scope(grad_mode);
    std::tie(out, weights) =
        d2l::functional::dot_product_attention(a.queries.value, a.keys.value, a.values.value,
                                               d2l::functional::DotProductAttentionFuncOptions()
                                                   .valid_lens(a.lens)
                                                   .dropout(dropout)
                                                   .training(training)
                                                   .backend(path)
                                                   .need_weights(need_weights));
  }
  note("out", out);
  note("weights", weights);
  const int64_t B = a.queries.value.size(0), n = a.queries.value.size(1), m = a.keys.value.size(1);
  FUZZ_CHECK(out.sizes() == torch::IntArrayRef({B, n, a.values.value.size(2)}),
             "dot_product_attention output has the wrong shape");
  FUZZ_CHECK(weights.defined() == need_weights, "weights returned exactly when asked for");
  if (need_weights) check_weights(weights, valid_mask(a.lens, B, n, m), a.tame_inputs);
  if (a.tame_inputs) FUZZ_CHECK(all_finite(out), "output not finite for finite inputs");
  check_backward(out, {a.queries.leaf, a.keys.leaf, a.values.leaf}, a.tame_inputs, in);
}

void fuzz_dot_product_module(Bytes& in) {
  auto a = make_qkv(in, in.below(8) != 0);
  const auto options = d2l::DotProductAttentionOptions()
                           .dropout(in.pick(kDropouts))
                           .backend(in.pick(kPaths))
                           .record_attention_weights(in.flag());
  d2l::DotProductAttention attention(options);
  attention->train(in.flag());
  check_attention_module(in, attention, options, a, {});
}

}  // namespace d2l_fuzz
