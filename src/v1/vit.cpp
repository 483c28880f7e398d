// d2l 1.0's Vision Transformer (include/d2l/v1/vit.h): the book's modules
// over LibTorch's LayerNorm, GELU and Dropout, our lazy layers and d2l 1.0's
// MultiHeadAttention. Every input is checked before the first lazy layer
// takes a width from it.

#include <d2l/v1/vit.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/nn/functional/loss.h>

#include <ostream>
#include <string>
#include <utility>

#include "../checked_load.h"
#include "../checks.h"
#include "../lazy_internal.h"

namespace d2l::v1 {
namespace {

std::string pair_of(const torch::ExpandingArray<2>& a) {
  return fmt::format("({}, {})", (*a)[0], (*a)[1]);
}

void check_positive(const char* fn, const char* name, int64_t value) {
  TORCH_CHECK(value > 0, fmt::format("{}: {} must be positive, got {}", fn, name, value));
}

// img_size and patch_size as the book's _make_tuple gives them, each a
// positive pair, the image a whole number of patches.
void check_patches(const char* fn, const torch::ExpandingArray<2>& img_size,
                   const torch::ExpandingArray<2>& patch_size) {
  for (int i = 0; i < 2; ++i) {
    TORCH_CHECK((*img_size)[i] > 0 && (*patch_size)[i] > 0,
                fmt::format("{}: img_size and patch_size must be positive, got img_size={} and "
                            "patch_size={}",
                            fn, pair_of(img_size), pair_of(patch_size)));
    TORCH_CHECK((*img_size)[i] % (*patch_size)[i] == 0,
                fmt::format("{}: img_size {} must be a whole number of patches of patch_size {}",
                            fn, pair_of(img_size), pair_of(patch_size)));
  }
}

// An image batch: 4-D, floating point, non-empty height and width.
void check_images(const char* fn, const torch::Tensor& X) {
  TORCH_CHECK(X.defined() && X.dim() == 4,
              fmt::format("{}: X must be a batch of images (batch, channels, height, width), "
                          "got {}",
                          fn, d2l::detail::shape_of(X)));
  d2l::detail::check_floating(fn, "X", X, 4);
}

}  // namespace

// ---------------------------------------------------------------------------
// PatchEmbedding

PatchEmbeddingImpl::PatchEmbeddingImpl(torch::ExpandingArray<2> img_size_,
                                       torch::ExpandingArray<2> patch_size_, int64_t num_hiddens_)
    : img_size(img_size_), patch_size(patch_size_), num_hiddens(num_hiddens_) {
  reset();
}

PatchEmbedding::PatchEmbedding(torch::ExpandingArray<2> img_size,
                               torch::ExpandingArray<2> patch_size, int64_t num_hiddens)
    : ModuleHolder(std::make_shared<PatchEmbeddingImpl>(img_size, patch_size, num_hiddens)) {}

void PatchEmbeddingImpl::reset() {
  const char* fn = "d2l::v1::PatchEmbedding";
  check_patches(fn, img_size, patch_size);
  check_positive(fn, "num_hiddens", num_hiddens);
  num_patches = ((*img_size)[0] / (*patch_size)[0]) * ((*img_size)[1] / (*patch_size)[1]);
  conv = register_module(
      "conv", LazyConv2d(LazyConv2dOptions(num_hiddens, patch_size).stride(patch_size)));
}

void PatchEmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::v1::PatchEmbedding(img_size=" << pair_of(img_size)
         << ", patch_size=" << pair_of(patch_size) << ", num_hiddens=" << num_hiddens << ")";
}

void PatchEmbeddingImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::PatchEmbedding::load");
}

torch::Tensor PatchEmbeddingImpl::forward(const torch::Tensor& X) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  const char* fn = "d2l::v1::PatchEmbedding";
  check_images(fn, X);
  const auto& p = *patch_size;
  TORCH_CHECK(X.size(2) > 0 && X.size(3) > 0 && X.size(2) % p[0] == 0 && X.size(3) % p[1] == 0,
              fmt::format("{}: X's height and width must be whole numbers of patches of "
                          "patch_size {}, got X {}",
                          fn, pair_of(patch_size), d2l::detail::shape_of(X)));
  if (const auto channels = conv->in_channels()) {
    TORCH_CHECK(X.size(1) == *channels,
                fmt::format("{}: X has {} channels (shape {}), but the convolution's input "
                            "channels were fixed at {} by its first input or a loaded state dict",
                            fn, X.size(1), d2l::detail::shape_of(X), *channels));
  }
  // (batch, num_hiddens, h, w) -> (batch, h * w, num_hiddens)
  return conv(X).flatten(2).transpose(1, 2);
}

// ---------------------------------------------------------------------------
// ViTMLP

ViTMLPImpl::ViTMLPImpl(int64_t mlp_num_hiddens_, int64_t mlp_num_outputs_, double dropout)
    : mlp_num_hiddens(mlp_num_hiddens_), mlp_num_outputs(mlp_num_outputs_), dropout_p(dropout) {
  reset();
}

void ViTMLPImpl::reset() {
  const char* fn = "d2l::v1::ViTMLP";
  check_positive(fn, "mlp_num_hiddens", mlp_num_hiddens);
  check_positive(fn, "mlp_num_outputs", mlp_num_outputs);
  d2l::detail::check_dropout(fn, dropout_p);
  dense1 = register_module("dense1", LazyLinear(mlp_num_hiddens));
  gelu = register_module("gelu", torch::nn::GELU());
  dropout1 = register_module("dropout1", torch::nn::Dropout(dropout_p));
  dense2 = register_module("dense2", LazyLinear(mlp_num_outputs));
  dropout2 = register_module("dropout2", torch::nn::Dropout(dropout_p));
}

void ViTMLPImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::v1::ViTMLP(mlp_num_hiddens=" << mlp_num_hiddens
         << ", mlp_num_outputs=" << mlp_num_outputs << ", dropout=" << dropout_p << ")";
}

void ViTMLPImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::ViTMLP::load");
}

torch::Tensor ViTMLPImpl::forward(const torch::Tensor& x) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  const char* fn = "d2l::v1::ViTMLP";
  TORCH_CHECK(x.defined() && x.dim() >= 1,
              fmt::format("{}: x must have at least one dimension, got {}", fn,
                          d2l::detail::shape_of(x)));
  dense1->ensure_width(fn, "x", x);
  if (dense2->has_uninitialized_params()) dense2->materialize(mlp_num_hiddens);
  return dropout2(dense2(dropout1(gelu(dense1(x)))));
}

// ---------------------------------------------------------------------------
// ViTBlock

ViTBlockImpl::ViTBlockImpl(int64_t num_hiddens, int64_t norm_shape, int64_t mlp_num_hiddens,
                           int64_t num_heads, double dropout, bool use_bias)
    : ViTBlockImpl(num_hiddens, std::vector<int64_t>{norm_shape}, mlp_num_hiddens, num_heads,
                   dropout, use_bias) {}

ViTBlockImpl::ViTBlockImpl(int64_t num_hiddens_, std::vector<int64_t> norm_shape_,
                           int64_t mlp_num_hiddens_, int64_t num_heads_, double dropout,
                           bool use_bias_)
    : num_hiddens(num_hiddens_),
      norm_shape(std::move(norm_shape_)),
      mlp_num_hiddens(mlp_num_hiddens_),
      num_heads(num_heads_),
      dropout_p(dropout),
      use_bias(use_bias_) {
  reset();
}

ViTBlock::ViTBlock(int64_t num_hiddens, std::vector<int64_t> norm_shape, int64_t mlp_num_hiddens,
                   int64_t num_heads, double dropout, bool use_bias)
    : ModuleHolder(std::make_shared<ViTBlockImpl>(num_hiddens, std::move(norm_shape),
                                                  mlp_num_hiddens, num_heads, dropout,
                                                  use_bias)) {}

void ViTBlockImpl::reset() {
  const char* fn = "d2l::v1::ViTBlock";
  TORCH_CHECK(!norm_shape.empty(), fmt::format("{}: norm_shape must not be empty", fn));
  for (const auto d : norm_shape) check_positive(fn, "norm_shape's sizes", d);
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions(norm_shape)));
  attention = register_module("attention",
                              MultiHeadAttention(num_hiddens, num_heads, dropout_p, use_bias));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions(norm_shape)));
  mlp = register_module("mlp", ViTMLP(mlp_num_hiddens, num_hiddens, dropout_p));
}

void ViTBlockImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::v1::ViTBlock(num_hiddens=" << num_hiddens << ", norm_shape=["
         << fmt::format("{}", fmt::join(norm_shape, ", ")) << "], mlp_num_hiddens="
         << mlp_num_hiddens << ", num_heads=" << num_heads << ", dropout=" << dropout_p
         << ", use_bias=" << std::boolalpha << use_bias << ")";
}

void ViTBlockImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::ViTBlock::load");
}

torch::Tensor ViTBlockImpl::forward(const torch::Tensor& X, const AttentionMask& valid_lens) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  const char* fn = "d2l::v1::ViTBlock";
  d2l::detail::check_floating(fn, "X", X, 3);
  const auto n = norm_shape.size();
  TORCH_CHECK(X.size(2) == num_hiddens && n <= 3 &&
                  X.sizes().slice(3 - n) == torch::IntArrayRef(norm_shape),
              fmt::format("{}: X must be (batch, steps, num_hiddens={}) ending in norm_shape "
                          "[{}], got X {}",
                          fn, num_hiddens, fmt::join(norm_shape, ", "), d2l::detail::shape_of(X)));
  const auto normed = ln1(X);
  const auto Y = X + attention(normed, normed, normed, valid_lens);
  return Y + mlp(ln2(Y));
}

torch::Tensor ViTBlockImpl::attention_weights() const {
  return attention->last_attention_weights();
}

// ---------------------------------------------------------------------------
// ViT

ViTImpl::ViTImpl(torch::ExpandingArray<2> img_size_, torch::ExpandingArray<2> patch_size_,
                 int64_t num_hiddens_, int64_t mlp_num_hiddens_, int64_t num_heads_,
                 int64_t num_blks_, double emb_dropout_, double blk_dropout_, double lr_,
                 bool use_bias_, int64_t num_classes_)
    : img_size(img_size_),
      patch_size(patch_size_),
      num_hiddens(num_hiddens_),
      mlp_num_hiddens(mlp_num_hiddens_),
      num_heads(num_heads_),
      num_blks(num_blks_),
      emb_dropout(emb_dropout_),
      blk_dropout(blk_dropout_),
      lr(lr_),
      use_bias(use_bias_),
      num_classes(num_classes_) {
  reset();
}

ViT::ViT(torch::ExpandingArray<2> img_size, torch::ExpandingArray<2> patch_size,
         int64_t num_hiddens, int64_t mlp_num_hiddens, int64_t num_heads, int64_t num_blks,
         double emb_dropout, double blk_dropout, double lr, bool use_bias, int64_t num_classes)
    : ModuleHolder(std::make_shared<ViTImpl>(img_size, patch_size, num_hiddens, mlp_num_hiddens,
                                             num_heads, num_blks, emb_dropout, blk_dropout, lr,
                                             use_bias, num_classes)) {}

void ViTImpl::reset() {
  const char* fn = "d2l::v1::ViT";
  check_positive(fn, "num_hiddens", num_hiddens);
  check_positive(fn, "num_classes", num_classes);
  TORCH_CHECK(num_blks >= 0, fmt::format("{}: num_blks must not be negative, got {}", fn, num_blks));
  d2l::detail::check_dropout(fn, emb_dropout);
  patch_embedding =
      register_module("patch_embedding", PatchEmbedding(img_size, patch_size, num_hiddens));
  cls_token = register_parameter("cls_token", torch::zeros({1, 1, num_hiddens}));
  const int64_t num_steps = patch_embedding->num_patches + 1;  // the <cls> token
  pos_embedding = register_parameter("pos_embedding", torch::randn({1, num_steps, num_hiddens}));
  dropout = register_module("dropout", torch::nn::Dropout(emb_dropout));
  blks = register_module("blks", torch::nn::Sequential());
  for (int64_t i = 0; i < num_blks; ++i) {
    blks->push_back(std::to_string(i), ViTBlock(num_hiddens, num_hiddens, mlp_num_hiddens,
                                                num_heads, blk_dropout, use_bias));
  }
  head = register_module(
      "head", torch::nn::Sequential(
                  torch::nn::LayerNorm(torch::nn::LayerNormOptions({num_hiddens})),
                  torch::nn::Linear(num_hiddens, num_classes)));
}

void ViTImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::v1::ViT(img_size=" << pair_of(img_size) << ", patch_size=" << pair_of(patch_size)
         << ", num_hiddens=" << num_hiddens << ", mlp_num_hiddens=" << mlp_num_hiddens
         << ", num_heads=" << num_heads << ", num_blks=" << num_blks
         << ", emb_dropout=" << emb_dropout << ", blk_dropout=" << blk_dropout << ", lr=" << lr
         << ", use_bias=" << std::boolalpha << use_bias << ", num_classes=" << num_classes << ")";
}

void ViTImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::ViT::load");
}

torch::Tensor ViTImpl::forward(const torch::Tensor& X) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  const char* fn = "d2l::v1::ViT";
  check_images(fn, X);
  TORCH_CHECK(X.size(2) == (*img_size)[0] && X.size(3) == (*img_size)[1],
              fmt::format("{}: X must be images of img_size {} (batch, channels, {}, {}), got {}",
                          fn, pair_of(img_size), (*img_size)[0], (*img_size)[1],
                          d2l::detail::shape_of(X)));
  d2l::detail::check_same_dtype(fn, "cls_token", cls_token, "X", X);
  d2l::detail::check_same_device(fn, "cls_token", cls_token, "X", X);
  auto Y = patch_embedding(X);
  Y = torch::cat({cls_token.expand({Y.size(0), -1, -1}), Y}, 1);
  Y = dropout(Y + pos_embedding);
  for (size_t i = 0; i < blks->size(); ++i) Y = blks->ptr<ViTBlockImpl>(i)->forward(Y);
  return head->forward(Y.select(1, 0));
}

torch::Tensor ViTImpl::loss(const torch::Tensor& Y_hat, const torch::Tensor& Y,
                            bool averaged) const {
  const char* fn = "d2l::v1::ViT::loss";
  TORCH_CHECK(Y_hat.defined() && Y_hat.dim() >= 1 && Y.defined() &&
                  Y.numel() * Y_hat.size(-1) == Y_hat.numel(),
              fmt::format("{}: Y must hold one label per row of Y_hat's last dimension, got "
                          "Y_hat {} and Y {}",
                          fn, d2l::detail::shape_of(Y_hat), d2l::detail::shape_of(Y)));
  d2l::detail::check_class_labels(fn, "Y", Y, Y_hat.size(-1), "Y_hat's last dimension");
  namespace F = torch::nn::functional;
  auto options = F::CrossEntropyFuncOptions();
  if (!averaged) options.reduction(torch::kNone);
  // Any integer dtype of labels, as int64 (cross entropy takes no other).
  return F::cross_entropy(Y_hat.reshape({-1, Y_hat.size(-1)}), Y.reshape(-1).to(torch::kLong),
                          options);
}

torch::Tensor ViTImpl::accuracy(const torch::Tensor& Y_hat, const torch::Tensor& Y,
                                bool averaged) const {
  const char* fn = "d2l::v1::ViT::accuracy";
  TORCH_CHECK(Y_hat.defined() && Y_hat.dim() >= 1 && Y.defined() &&
                  Y.numel() * Y_hat.size(-1) == Y_hat.numel(),
              fmt::format("{}: Y must hold one label per row of Y_hat's last dimension, got "
                          "Y_hat {} and Y {}",
                          fn, d2l::detail::shape_of(Y_hat), d2l::detail::shape_of(Y)));
  const auto preds = Y_hat.reshape({-1, Y_hat.size(-1)}).argmax(1).to(Y.scalar_type());
  const auto compare = (preds == Y.reshape(-1)).to(torch::kFloat32);
  return averaged ? compare.mean() : compare;
}

torch::optim::SGD ViTImpl::configure_optimizers() {
  return torch::optim::SGD(parameters(), torch::optim::SGDOptions(lr));
}

ViTBlock ViTImpl::block(int64_t i) const {
  TORCH_CHECK(i >= 0 && i < static_cast<int64_t>(blks->size()),
              fmt::format("d2l::v1::ViT::block: i must be in [0, {}), got {}", blks->size(), i));
  return ViTBlock(blks->ptr<ViTBlockImpl>(static_cast<size_t>(i)));
}

std::vector<torch::Tensor> ViTImpl::attention_weights() const {
  std::vector<torch::Tensor> weights;
  for (size_t i = 0; i < blks->size(); ++i) {
    weights.push_back(blks->ptr<ViTBlockImpl>(i)->attention_weights());
  }
  return weights;
}

}  // namespace d2l::v1
