// The 0.17 Transformer encoder in one pass (Note [The fused decoder step]:
// the encoder of a decoding call, at the book's sizes, is a chain of about
// two hundred ATen calls for a few hundred thousand multiply-adds).

#include <fmt/format.h>

#include <vector>

#include "linear.h"
#include "packed_weights.h"
#include "select.h"
#include "transformer/fused_parts.h"
#include "transformer/fused_step.h"

namespace d2l::detail {

namespace {

constexpr const char* kEncoderFn = "d2l::TransformerEncoder";

template <typename T>
torch::Tensor fused_encoder_typed(TransformerEncoderImpl& e, const torch::Tensor& X,
                                  const AttentionMask& mask) {
  const auto& bo = e.options.block();
  const int64_t B = X.size(0), n = X.size(1), rows = B * n;
  const int64_t h = bo.num_hiddens(), f = bo.ffn_num_hiddens();
  const auto options = e.embedding->weight.options();
  auto outputs = torch::empty({B, n, h}, options);
  T* x = outputs.template data_ptr<T>();
  // The queries, keys, values, the heads joined, a sublayer's output, the
  // rows after the self-attention, the FFN's hidden units.
  std::vector<T> workspace(static_cast<size_t>(rows * (6 * h + f)));
  T* q = workspace.data();
  T* k = q + rows * h;
  T* v = k + rows * h;
  T* joined = v + rows * h;
  T* t = joined + rows * h;
  T* y = t + rows * h;
  T* hidden = y + rows * h;

  const auto tokens = (X.scalar_type() == torch::kLong ? X : X.to(torch::kLong)).contiguous();
  fused::embed(e.options, e.embedding, e.pos_encoding, tokens.data_ptr<int64_t>(), B, n, x);
  const int64_t* lens =
      mask.valid_lens().defined() ? mask.valid_lens().data_ptr<int64_t>() : nullptr;
  for (int64_t i = 0; i < e.options.num_layers(); ++i) {
    auto blk = e.block(i);
    auto& m = *blk->attention;
    linear_into<T>(q, x, rows, m.W_q->weight, m.W_q->bias);
    linear_into<T>(k, x, rows, m.W_k->weight, m.W_k->bias);
    linear_into<T>(v, x, rows, m.W_v->weight, m.W_v->bias);
    fused::HeadWeights<T> weights(m, B, n, n, options);
    fused::heads(m.options.num_heads(), q, k, v, lens, B, n, n, h, weights.data, joined);
    weights.record(m, n);
    linear_into<T>(t, joined, rows, m.W_o->weight, m.W_o->bias);
    fused::add_layer_norm(blk->addnorm1, t, x, rows, h, y);
    const auto& ffn = blk->ffn;
    linear_into<T>(hidden, y, rows, ffn->dense1->weight, ffn->dense1->bias);
    fused::relu(hidden, rows * f);
    linear_into<T>(t, hidden, rows, ffn->dense2->weight, ffn->dense2->bias);
    fused::add_layer_norm(blk->addnorm2, t, y, rows, h, x);
  }
  return outputs;
}

}  // namespace

std::string why_not_fused_encoder(const TransformerEncoderImpl& e, const torch::Tensor& X,
                                  const AttentionMask& mask) {
  if (torch::GradMode::is_enabled()) return "autograd records (the fused pass has no backward)";
  if (e.is_training() || fused::draws(e.pos_encoding->dropout)) return "training mode";
  const auto& weight = e.embedding->weight;
  const auto type = weight.scalar_type();
  if (!weight.device().is_cpu() || !X.device().is_cpu()) {
    return fmt::format("tensors on {} (the fused pass runs on the CPU)",
                       (weight.device().is_cpu() ? X : weight).device().str());
  }
  if (type != torch::kFloat && type != torch::kDouble) {
    return fmt::format("dtype {} (the fused pass runs float and double)", c10::toString(type));
  }
  if (X.size(0) == 0 || X.size(1) == 0) return "a size is zero";
  if (mask.key_padding_mask().defined() || mask.attn_mask().defined() || mask.is_causal()) {
    return "a mask other than valid_lens (the fused pass masks by lengths)";
  }
  const auto& lens = mask.valid_lens();
  if (lens.defined() &&
      (lens.dim() != 1 || lens.scalar_type() != torch::kLong || !lens.is_contiguous())) {
    return "valid_lens not a contiguous int64 (batch_size) tensor";
  }
  if (e.embedding->options.max_norm().has_value()) return "an embedding with max_norm";
  if (!weight.is_contiguous()) return "parameters not contiguous";
  const auto& bo = e.options.block();
  const int64_t n = X.size(1), d = bo.num_hiddens() / bo.num_heads();
  if (!small_heads(n, n, d)) {
    return fmt::format(
        "heads of {} x {} pairs of {} features (beyond the small-heads kernel's; "
        "the blocks take the flash kernel)",
        n, n, d);
  }
  std::vector<torch::Tensor> parameters;
  for (int64_t i = 0; i < e.options.num_layers(); ++i) {
    const auto blk = e.block(i);
    parameters.clear();
    fused::append_parameters(*blk->attention, parameters);
    fused::append_parameters(*blk->addnorm1, parameters);
    fused::append_parameters(*blk->addnorm2, parameters);
    fused::append_parameters(*blk->ffn, parameters);
    auto why = fused::why_not_modules(
        blk->options, {blk.get(), blk->addnorm1->dropout.get(), blk->addnorm2->dropout.get()},
        {blk->attention.get()}, parameters, type, i);
    if (!why.empty()) return why;
  }
  return {};
}

torch::Tensor fused_encoder(TransformerEncoderImpl& encoder, const torch::Tensor& X,
                            const AttentionMask& mask) {
  if (logging_paths()) log_path(kEncoderFn, AttentionBackend::kAuto, "fused_pass", {});
  recheck_packed_weights();  // Note [Packed weights]
  if (encoder.embedding->weight.scalar_type() == torch::kDouble) {
    return fused_encoder_typed<double>(encoder, X, mask);
  }
  return fused_encoder_typed<float>(encoder, X, mask);
}

}  // namespace d2l::detail
