// d2l::nn::LayerNorm (torch::nn::LayerNorm with Python's `bias`) and the
// Transformer layers of torch::nn on d2l::nn::MultiheadAttention, with
// Python's batch_first, norm_first, layer_norm_eps, bias and is_causal
// (docs/nn.md).

#include <d2l/nn.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/normalization.h>
#include <torch/nn/init.h>

#include "checks.h"

namespace d2l::nn {

LayerNormOptions::LayerNormOptions(std::vector<int64_t> normalized_shape)
    : normalized_shape_(std::move(normalized_shape)) {}

LayerNormImpl::LayerNormImpl(LayerNormOptions options_) : options(std::move(options_)) { reset(); }

void LayerNormImpl::reset() {
  if (options.elementwise_affine()) {
    weight = register_parameter("weight", torch::empty(options.normalized_shape()));
    bias = options.bias() ? register_parameter("bias", torch::empty(options.normalized_shape()))
                          : register_parameter("bias", {}, false);
  } else {
    weight = register_parameter("weight", {}, false);
    bias = register_parameter("bias", {}, false);
  }
  reset_parameters();
}

void LayerNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  if (weight.defined()) weight.fill_(1);
  if (bias.defined()) bias.zero_();
}

void LayerNormImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::nn::LayerNorm([{}], eps={}, elementwise_affine={}, bias={})",
                        fmt::join(options.normalized_shape(), ", "), options.eps(),
                        options.elementwise_affine(), options.bias());
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& input) {
  return torch::layer_norm(input, options.normalized_shape(), weight, bias, options.eps());
}

namespace {

torch::Tensor activate(const activation_t& activation, const torch::Tensor& x) {
  if (std::holds_alternative<torch::enumtype::kReLU>(activation)) return torch::relu(x);
  if (std::holds_alternative<torch::enumtype::kGELU>(activation)) return torch::gelu(x);
  return std::get<std::function<torch::Tensor(const torch::Tensor&)>>(activation)(x);
}

void check_layer(const char* fn, int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                 double dropout, double eps) {
  TORCH_CHECK(d_model > 0 && nhead > 0 && dim_feedforward > 0,
              fmt::format("{}: d_model, nhead and dim_feedforward must be positive, got "
                          "d_model={}, nhead={}, dim_feedforward={}",
                          fn, d_model, nhead, dim_feedforward));
  TORCH_CHECK(d_model % nhead == 0,
              fmt::format("{}: d_model must be divisible by nhead, got d_model={} and nhead={}", fn,
                          d_model, nhead));
  detail::check_dropout(fn, dropout);
  TORCH_CHECK(eps > 0, fmt::format("{}: layer_norm_eps must be positive, got {}", fn, eps));
}

// The layers' inputs: 3-D with d_model features (the attention checks the rest).
void check_input(const char* fn, const char* name, const torch::Tensor& x, int64_t d_model,
                 bool batch_first) {
  TORCH_CHECK(x.defined(), fmt::format("{}: {} must be a defined tensor", fn, name));
  detail::check_strided_layout(fn, name, x);
  TORCH_CHECK(x.dim() == 3 && x.size(2) == d_model,
              fmt::format("{}: {} must be a 3-D tensor {} with d_model={} features, got {}", fn,
                          name, batch_first ? "(N, seq, d_model)" : "(seq, N, d_model)", d_model,
                          detail::shape_of(x)));
}

MultiheadAttention make_attention(int64_t d_model, int64_t nhead, double dropout, bool bias,
                                  bool batch_first, AttentionBackend backend) {
  return MultiheadAttention(MultiheadAttentionOptions(d_model, nhead)
                                .dropout(dropout)
                                .bias(bias)
                                .batch_first(batch_first)
                                .backend(backend));
}

LayerNorm make_norm(int64_t d_model, double eps, bool bias) {
  return LayerNorm(LayerNormOptions({d_model}).eps(eps).bias(bias));
}

std::string activation_name(const activation_t& a) {
  if (std::holds_alternative<torch::enumtype::kReLU>(a)) return "relu";
  if (std::holds_alternative<torch::enumtype::kGELU>(a)) return "gelu";
  return "<function>";
}

}  // namespace

// ---------------------------------------------------------------------------

TransformerEncoderLayerOptions::TransformerEncoderLayerOptions(int64_t d_model, int64_t nhead)
    : d_model_(d_model), nhead_(nhead) {}

TransformerEncoderLayerImpl::TransformerEncoderLayerImpl(TransformerEncoderLayerOptions options_)
    : options(std::move(options_)) {
  reset();
}

void TransformerEncoderLayerImpl::reset() {
  const auto& o = options;
  check_layer("d2l::nn::TransformerEncoderLayer", o.d_model(), o.nhead(), o.dim_feedforward(),
              o.dropout(), o.layer_norm_eps());
  using torch::nn::Linear;
  using torch::nn::LinearOptions;
  self_attn = register_module("self_attn", make_attention(o.d_model(), o.nhead(), o.dropout(),
                                                          o.bias(), o.batch_first(), o.backend()));
  linear1 = register_module("linear1",
                            Linear(LinearOptions(o.d_model(), o.dim_feedforward()).bias(o.bias())));
  dropout = register_module("dropout", torch::nn::Dropout(o.dropout()));
  linear2 = register_module("linear2",
                            Linear(LinearOptions(o.dim_feedforward(), o.d_model()).bias(o.bias())));
  norm1 = register_module("norm1", make_norm(o.d_model(), o.layer_norm_eps(), o.bias()));
  norm2 = register_module("norm2", make_norm(o.d_model(), o.layer_norm_eps(), o.bias()));
  dropout1 = register_module("dropout1", torch::nn::Dropout(o.dropout()));
  dropout2 = register_module("dropout2", torch::nn::Dropout(o.dropout()));
}

void TransformerEncoderLayerImpl::reset_parameters() {
  self_attn->_reset_parameters();
  linear1->reset_parameters();
  linear2->reset_parameters();
  norm1->reset_parameters();
  norm2->reset_parameters();
}

void TransformerEncoderLayerImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << fmt::format(
      "d2l::nn::TransformerEncoderLayer(d_model={}, nhead={}, dim_feedforward={}, dropout={}, "
      "activation={}, batch_first={}, norm_first={}, layer_norm_eps={}, bias={})",
      o.d_model(), o.nhead(), o.dim_feedforward(), o.dropout(), activation_name(o.activation()),
      o.batch_first(), o.norm_first(), o.layer_norm_eps(), o.bias());
}

torch::Tensor TransformerEncoderLayerImpl::forward(const torch::Tensor& src,
                                                   const torch::Tensor& src_mask,
                                                   const torch::Tensor& src_key_padding_mask,
                                                   bool is_causal) {
  check_input("d2l::nn::TransformerEncoderLayer", "src", src, options.d_model(),
              options.batch_first());
  const auto self_attention = [&](const torch::Tensor& x) {
    return dropout1(std::get<0>(self_attn(x, x, x, src_key_padding_mask, /*need_weights=*/false,
                                          src_mask, true, is_causal)));
  };
  const auto feed_forward = [&](const torch::Tensor& x) {
    return dropout2(linear2(dropout(activate(options.activation(), linear1(x)))));
  };
  if (options.norm_first()) {
    auto x = src + self_attention(norm1(src));
    return x + feed_forward(norm2(x));
  }
  auto x = norm1(src + self_attention(src));
  return norm2(x + feed_forward(x));
}

// ---------------------------------------------------------------------------

TransformerDecoderLayerOptions::TransformerDecoderLayerOptions(int64_t d_model, int64_t nhead)
    : d_model_(d_model), nhead_(nhead) {}

TransformerDecoderLayerImpl::TransformerDecoderLayerImpl(TransformerDecoderLayerOptions options_)
    : options(std::move(options_)) {
  reset();
}

void TransformerDecoderLayerImpl::reset() {
  const auto& o = options;
  check_layer("d2l::nn::TransformerDecoderLayer", o.d_model(), o.nhead(), o.dim_feedforward(),
              o.dropout(), o.layer_norm_eps());
  using torch::nn::Linear;
  using torch::nn::LinearOptions;
  self_attn = register_module("self_attn", make_attention(o.d_model(), o.nhead(), o.dropout(),
                                                          o.bias(), o.batch_first(), o.backend()));
  multihead_attn = register_module(
      "multihead_attn",
      make_attention(o.d_model(), o.nhead(), o.dropout(), o.bias(), o.batch_first(), o.backend()));
  linear1 = register_module("linear1",
                            Linear(LinearOptions(o.d_model(), o.dim_feedforward()).bias(o.bias())));
  dropout = register_module("dropout", torch::nn::Dropout(o.dropout()));
  linear2 = register_module("linear2",
                            Linear(LinearOptions(o.dim_feedforward(), o.d_model()).bias(o.bias())));
  norm1 = register_module("norm1", make_norm(o.d_model(), o.layer_norm_eps(), o.bias()));
  norm2 = register_module("norm2", make_norm(o.d_model(), o.layer_norm_eps(), o.bias()));
  norm3 = register_module("norm3", make_norm(o.d_model(), o.layer_norm_eps(), o.bias()));
  dropout1 = register_module("dropout1", torch::nn::Dropout(o.dropout()));
  dropout2 = register_module("dropout2", torch::nn::Dropout(o.dropout()));
  dropout3 = register_module("dropout3", torch::nn::Dropout(o.dropout()));
}

void TransformerDecoderLayerImpl::reset_parameters() {
  self_attn->_reset_parameters();
  multihead_attn->_reset_parameters();
  linear1->reset_parameters();
  linear2->reset_parameters();
  norm1->reset_parameters();
  norm2->reset_parameters();
  norm3->reset_parameters();
}

void TransformerDecoderLayerImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << fmt::format(
      "d2l::nn::TransformerDecoderLayer(d_model={}, nhead={}, dim_feedforward={}, dropout={}, "
      "activation={}, batch_first={}, norm_first={}, layer_norm_eps={}, bias={})",
      o.d_model(), o.nhead(), o.dim_feedforward(), o.dropout(), activation_name(o.activation()),
      o.batch_first(), o.norm_first(), o.layer_norm_eps(), o.bias());
}

torch::Tensor TransformerDecoderLayerImpl::forward(
    const torch::Tensor& tgt, const torch::Tensor& memory, const torch::Tensor& tgt_mask,
    const torch::Tensor& memory_mask, const torch::Tensor& tgt_key_padding_mask,
    const torch::Tensor& memory_key_padding_mask, bool tgt_is_causal, bool memory_is_causal) {
  constexpr const char* fn = "d2l::nn::TransformerDecoderLayer";
  check_input(fn, "tgt", tgt, options.d_model(), options.batch_first());
  check_input(fn, "memory", memory, options.d_model(), options.batch_first());
  const auto self_attention = [&](const torch::Tensor& x) {
    return dropout1(std::get<0>(self_attn(x, x, x, tgt_key_padding_mask, /*need_weights=*/false,
                                          tgt_mask, true, tgt_is_causal)));
  };
  const auto cross_attention = [&](const torch::Tensor& x) {
    return dropout2(
        std::get<0>(multihead_attn(x, memory, memory, memory_key_padding_mask,
                                   /*need_weights=*/false, memory_mask, true, memory_is_causal)));
  };
  const auto feed_forward = [&](const torch::Tensor& x) {
    return dropout3(linear2(dropout(activate(options.activation(), linear1(x)))));
  };
  if (options.norm_first()) {
    auto x = tgt + self_attention(norm1(tgt));
    x = x + cross_attention(norm2(x));
    return x + feed_forward(norm3(x));
  }
  auto x = norm1(tgt + self_attention(tgt));
  x = norm2(x + cross_attention(x));
  return norm3(x + feed_forward(x));
}

}  // namespace d2l::nn
