#pragma once

// d2l 1.0's Vision Transformer (d2l.ai, "Transformers for Vision"): the
// patch embedding, the encoder's MLP and block, and the classifier, with the
// book's constructors and submodule names, so that named_parameters() keys
// equal the Python state_dict keys (`patch_embedding.conv.weight`,
// `blks.0.attention.W_q.weight`, `head.1.bias`, ...). Their input widths are
// lazy as the book's (d2l/lazy.h): the image channels and the MLP's input
// width come from the first call or from a loaded state dict
// (docs/vit.md).

#include <d2l/attention_mask.h>
#include <d2l/lazy.h>
#include <d2l/v1/attention.h>

#include <torch/expanding_array.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace d2l::v1 {

/// The book's `PatchEmbedding(img_size=96, patch_size=16, num_hiddens=512)`:
/// a LazyConv2d(num_hiddens, kernel_size=patch_size, stride=patch_size)
/// named `conv`. `img_size` and `patch_size` are an int (square) or a pair
/// {height, width}, as the book's _make_tuple takes them.
class PatchEmbeddingImpl : public torch::nn::Cloneable<PatchEmbeddingImpl> {
 public:
  explicit PatchEmbeddingImpl(torch::ExpandingArray<2> img_size = 96,
                              torch::ExpandingArray<2> patch_size = 16,
                              int64_t num_hiddens = 512);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// X (batch, channels, height, width) -> (batch, patches, num_hiddens),
  /// the patches in row-major order. Height and width must be multiples of
  /// the patch's (the book's convolution would drop the remainder); the
  /// first call fixes the channels.
  torch::Tensor forward(const torch::Tensor& X);

  torch::ExpandingArray<2> img_size;
  torch::ExpandingArray<2> patch_size;
  int64_t num_hiddens;
  /// (img_size[0] / patch_size[0]) * (img_size[1] / patch_size[1]), as the book's.
  int64_t num_patches = 0;
  LazyConv2d conv{nullptr};
};

/// The holder; beyond TORCH_MODULE's, it takes pairs in braces:
/// `PatchEmbedding({96, 64}, {16, 8}, 512)`.
class PatchEmbedding : public torch::nn::ModuleHolder<PatchEmbeddingImpl> {
 public:
  using torch::nn::ModuleHolder<PatchEmbeddingImpl>::ModuleHolder;
  using Impl = PatchEmbeddingImpl;
  PatchEmbedding(torch::ExpandingArray<2> img_size, torch::ExpandingArray<2> patch_size,
                 int64_t num_hiddens = 512);
};

/// The book's `ViTMLP(mlp_num_hiddens, mlp_num_outputs, dropout=0.5)`:
/// dense1 (LazyLinear), gelu (exact), dropout1, dense2 (LazyLinear),
/// dropout2: dropout after each dense layer.
class ViTMLPImpl : public torch::nn::Cloneable<ViTMLPImpl> {
 public:
  ViTMLPImpl(int64_t mlp_num_hiddens, int64_t mlp_num_outputs, double dropout = 0.5);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// x (..., features) -> (..., mlp_num_outputs).
  torch::Tensor forward(const torch::Tensor& x);

  int64_t mlp_num_hiddens;
  int64_t mlp_num_outputs;
  double dropout_p;
  LazyLinear dense1{nullptr};
  torch::nn::GELU gelu{nullptr};
  torch::nn::Dropout dropout1{nullptr};
  LazyLinear dense2{nullptr};
  torch::nn::Dropout dropout2{nullptr};
};
TORCH_MODULE(ViTMLP);

/// The book's `ViTBlock(num_hiddens, norm_shape, mlp_num_hiddens, num_heads,
/// dropout, use_bias=False)`: pre-normalisation,
///   X = X + attention(ln1(X), ln1(X), ln1(X), valid_lens)
///   return X + mlp(ln2(X))
/// with `attention` d2l 1.0's MultiHeadAttention(num_hiddens, num_heads,
/// dropout, use_bias) and `mlp` ViTMLP(mlp_num_hiddens, num_hiddens,
/// dropout). `norm_shape` is an int or a shape, as nn.LayerNorm takes it.
class ViTBlockImpl : public torch::nn::Cloneable<ViTBlockImpl> {
 public:
  ViTBlockImpl(int64_t num_hiddens, int64_t norm_shape, int64_t mlp_num_hiddens,
               int64_t num_heads, double dropout, bool use_bias = false);
  ViTBlockImpl(int64_t num_hiddens, std::vector<int64_t> norm_shape, int64_t mlp_num_hiddens,
               int64_t num_heads, double dropout, bool use_bias = false);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// X (batch, steps, num_hiddens) -> the same shape; `valid_lens` masks
  /// the keys as in MultiHeadAttention (the ViT passes none). The per-head
  /// weights of the call are attention->attention->attention_weights,
  /// (batch * num_heads, steps, steps).
  torch::Tensor forward(const torch::Tensor& X, const AttentionMask& valid_lens = {});

  /// The attention weights of the last forward call.
  torch::Tensor attention_weights() const;

  int64_t num_hiddens;
  std::vector<int64_t> norm_shape;
  int64_t mlp_num_hiddens;
  int64_t num_heads;
  double dropout_p;
  bool use_bias;
  torch::nn::LayerNorm ln1{nullptr};
  MultiHeadAttention attention{nullptr};
  torch::nn::LayerNorm ln2{nullptr};
  ViTMLP mlp{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(AttentionMask())})
};

/// The holder; beyond TORCH_MODULE's, it takes a shape in braces:
/// `ViTBlock(24, {24}, 48, 8, 0.5)`.
class ViTBlock : public torch::nn::ModuleHolder<ViTBlockImpl> {
 public:
  using torch::nn::ModuleHolder<ViTBlockImpl>::ModuleHolder;
  using Impl = ViTBlockImpl;
  ViTBlock(int64_t num_hiddens, std::vector<int64_t> norm_shape, int64_t mlp_num_hiddens,
           int64_t num_heads, double dropout, bool use_bias = false);
};

/// The book's `ViT(img_size, patch_size, num_hiddens, mlp_num_hiddens,
/// num_heads, num_blks, emb_dropout, blk_dropout, lr=0.1, use_bias=False,
/// num_classes=10)`, a d2l.Classifier:
///   patch_embedding  PatchEmbedding(img_size, patch_size, num_hiddens)
///   cls_token        zeros (1, 1, num_hiddens)
///   pos_embedding    randn (1, num_patches + 1, num_hiddens)
///   dropout          Dropout(emb_dropout)
///   blks             Sequential of ViTBlock(num_hiddens, num_hiddens,
///                    mlp_num_hiddens, num_heads, blk_dropout, use_bias),
///                    named "0", "1", ...
///   head             Sequential(LayerNorm(num_hiddens),
///                    Linear(num_hiddens, num_classes))
/// The classifier's loss, accuracy and SGD (at `lr`) are the book's
/// Classifier's methods.
class ViTImpl : public torch::nn::Cloneable<ViTImpl> {
 public:
  ViTImpl(torch::ExpandingArray<2> img_size, torch::ExpandingArray<2> patch_size,
          int64_t num_hiddens, int64_t mlp_num_hiddens, int64_t num_heads, int64_t num_blks,
          double emb_dropout, double blk_dropout, double lr = 0.1, bool use_bias = false,
          int64_t num_classes = 10);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// X (batch, channels, img_size[0], img_size[1]) -> logits (batch,
  /// num_classes), from the <cls> token's representation.
  torch::Tensor forward(const torch::Tensor& X);

  /// Classifier.loss(Y_hat, Y, averaged=True): cross entropy of the logits
  /// against the labels, the mean (or each example's, not averaged).
  torch::Tensor loss(const torch::Tensor& Y_hat, const torch::Tensor& Y,
                     bool averaged = true) const;
  /// Classifier.accuracy(Y_hat, Y, averaged=True): the share of rows whose
  /// largest logit is the label (float32), or each row's 0/1.
  torch::Tensor accuracy(const torch::Tensor& Y_hat, const torch::Tensor& Y,
                         bool averaged = true) const;
  /// Module.configure_optimizers(): SGD over parameters() at `lr`. The lazy
  /// parameters it holds are those the first batch fills.
  torch::optim::SGD configure_optimizers();

  /// Block i of `blks`.
  ViTBlock block(int64_t i) const;
  /// Each block's attention weights of the last forward call,
  /// (batch * num_heads, steps, steps).
  std::vector<torch::Tensor> attention_weights() const;

  torch::ExpandingArray<2> img_size;
  torch::ExpandingArray<2> patch_size;
  int64_t num_hiddens;
  int64_t mlp_num_hiddens;
  int64_t num_heads;
  int64_t num_blks;
  double emb_dropout;
  double blk_dropout;
  double lr;
  bool use_bias;
  int64_t num_classes;
  PatchEmbedding patch_embedding{nullptr};
  torch::Tensor cls_token;
  torch::Tensor pos_embedding;
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Sequential blks{nullptr};
  torch::nn::Sequential head{nullptr};
};

/// The holder; beyond TORCH_MODULE's, it takes pairs in braces:
/// `ViT({96, 64}, {16, 8}, 512, 2048, 8, 2, 0.1, 0.1)`.
class ViT : public torch::nn::ModuleHolder<ViTImpl> {
 public:
  using torch::nn::ModuleHolder<ViTImpl>::ModuleHolder;
  using Impl = ViTImpl;
  ViT(torch::ExpandingArray<2> img_size, torch::ExpandingArray<2> patch_size,
      int64_t num_hiddens, int64_t mlp_num_hiddens, int64_t num_heads, int64_t num_blks,
      double emb_dropout, double blk_dropout, double lr = 0.1, bool use_bias = false,
      int64_t num_classes = 10);
};

}  // namespace d2l::v1
