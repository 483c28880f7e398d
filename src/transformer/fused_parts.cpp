#include "transformer/fused_parts.h"

#include <fmt/format.h>

namespace d2l::detail::fused {

void append_parameters(const MultiHeadAttentionImpl& m, std::vector<torch::Tensor>& out) {
  for (const auto* l : {&m.W_q, &m.W_k, &m.W_v, &m.W_o}) {
    out.push_back((*l)->weight);
    if ((*l)->bias.defined()) out.push_back((*l)->bias);
  }
}

void append_parameters(const AddNormImpl& a, std::vector<torch::Tensor>& out) {
  // Undefined without elementwise_affine: refused by why_not_modules.
  out.push_back(a.ln->weight);
  out.push_back(a.ln->bias);
}

void append_parameters(const PositionWiseFFNImpl& f, std::vector<torch::Tensor>& out) {
  out.insert(out.end(), {f.dense1->weight, f.dense1->bias, f.dense2->weight, f.dense2->bias});
}

std::string why_not_modules(const TransformerBlockOptions& o,
                            const std::vector<const torch::nn::Module*>& training_modules,
                            const std::vector<const MultiHeadAttentionImpl*>& attentions,
                            const std::vector<torch::Tensor>& parameters, c10::ScalarType type,
                            int64_t block) {
  const int64_t h = o.num_hiddens();
  if (o.key_size() != h || o.query_size() != h || o.value_size() != h || o.ffn_num_input() != h ||
      o.norm_shape() != std::vector<int64_t>{h}) {
    return "key, query, value and FFN input sizes or norm_shape other than num_hiddens";
  }
  for (const auto* m : training_modules) {
    if (m->is_training()) return fmt::format("block {} in training mode", block);
  }
  for (const auto* m : attentions) {
    const auto backend = m->attention->options.backend();
    if (m->attention->dropout->is_training()) {
      return fmt::format("block {} in training mode", block);
    }
    if (backend != AttentionBackend::kAuto && backend != AttentionBackend::kFused) {
      return fmt::format("block {}'s attention asks for another backend than kAuto or kFused",
                         block);
    }
  }
  for (const auto& p : parameters) {
    if (!p.defined() || !p.is_contiguous() || p.scalar_type() != type || !p.device().is_cpu()) {
      return fmt::format(
          "block {}'s parameters not all contiguous {} on the CPU (or a layer "
          "norm without its affine parameters)",
          block, c10::toString(type));
    }
  }
  return {};
}

}  // namespace d2l::detail::fused
