// fuzz_attention's additive area: functional::additive_scores (bounded by
// sum |w_v|) and the AdditiveAttention module, sizes and dtypes included.

#include <d2l/additive_attention.h>

#include <sstream>
#include <string>
#include <vector>

#include "fuzz_common.h"

namespace d2l_fuzz {

void fuzz_additive_scores(Bytes& in) {
  auto d = dims(in, 4);  // B, n, m, h
  std::vector<int64_t> qs{d[0], d[1], d[3]}, ks{d[0], d[2], d[3]}, ws{1, d[3]};
  switch (in.below(12)) {
    case 0: ks[2] += 1; break;
    case 1: ws[0] = 2; break;
    case 2: ws.pop_back(); break;
    case 3: ks[0] += 1; break;
    default: break;
  }
  const auto dtype = in.pick(kDataDtypes);
  const bool grad = in.flag();
  const auto q = make_arg(in, qs, dtype, grad), k = make_arg(in, ks, dtype, grad);
  const auto w = make_arg(in, ws, in.below(8) == 0 ? in.pick(kDataDtypes) : dtype, grad);
  const auto path = in.pick(kPaths);
  const auto grad_mode = pick_grad_mode(in);
  current.description = "additive_scores path=" + std::to_string(static_cast<int>(path)) +
                        " grad_mode=" + std::to_string(static_cast<int>(grad_mode));
  note("projected_queries", q.value);
  note("projected_keys", k.value);
  note("w_v", w.value);
  torch::Tensor scores;
  {
    GradModeScope scope(grad_mode);
    scores = d2l::functional::additive_scores(
        q.value, k.value, w.value, d2l::functional::AdditiveScoresFuncOptions().backend(path));
  }
  FUZZ_CHECK(scores.sizes() == torch::IntArrayRef({d[0], d[1], d[2]}),
             "additive_scores has the wrong shape");
  const bool tame_inputs = tame(q.value) && tame(k.value) && tame(w.value);
  if (tame_inputs) {
    FUZZ_CHECK(all_finite(scores), "additive scores not finite for finite inputs");
    const double bound = w.value.detach().to(torch::kDouble).abs().sum().item<double>();
    FUZZ_CHECK(
        scores.numel() == 0 || scores.detach().to(torch::kDouble).abs().max().item<double>() <=
                                   bound * (1 + sum_tolerance(dtype)) + sum_tolerance(dtype),
        "additive score beyond sum |w_v|");
  }
  check_backward(scores, {q.leaf, k.leaf, w.leaf}, tame_inputs, in);
}

void fuzz_additive_module(Bytes& in) {
  auto a = make_qkv(in, false);
  int64_t key_size = a.keys.value.dim() == 3 ? a.keys.value.size(2) : 1;
  int64_t query_size = a.queries.value.size(2);
  if (in.below(8) == 0) key_size = in.below(10);
  if (in.below(8) == 0) query_size = in.below(10);
  const auto options = d2l::AdditiveAttentionOptions(key_size, query_size, in.below(10))
                           .dropout(in.pick(kDropouts))
                           .backend(in.pick(kPaths))
                           .record_attention_weights(in.flag());
  d2l::AdditiveAttention attention(options);
  const auto module_dtype = in.below(4) == 0 ? in.pick(kDataDtypes) : a.queries.value.scalar_type();
  if (at::isFloatingType(module_dtype)) attention->to(module_dtype);
  attention->train(in.flag());
  check_attention_module(in, attention, options, a, attention->parameters());
}

}  // namespace d2l_fuzz
