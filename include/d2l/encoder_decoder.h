#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <memory>
#include <tuple>
#include <vector>

namespace d2l {

namespace detail {
struct StepCache;  // 0.3's, for the deprecated DecoderState::step_cache only
}  // namespace detail

/// What an encoder hands to a decoder's `init_state`: the book's `enc_outputs`,
/// the pair `(output, state)` that `nn.GRU` returns.
struct EncoderOutput {
  /// Top-layer outputs of every encoder step, time-major: (num_steps, B,
  /// num_hiddens); batch-first, (B, num_steps, num_hiddens), from
  /// TransformerEncoder, whose hidden_state is undefined (the book's shapes).
  torch::Tensor outputs;
  /// Final hidden state of every layer: (num_layers, B, num_hiddens).
  torch::Tensor hidden_state;
};

/// What a decoder keeps for itself from one call to the next beside the
/// book's state: projections made once per decoding, buffers. Each decoder
/// derives its own; callers only copy the pointer (DecoderState::cache).
struct DecoderState;

struct DecoderCache {
  virtual ~DecoderCache() = default;
  /// The cache of `selected`, the state of batch rows `index` ((R) int64 on
  /// the state's device) of `state`, which this cache serves
  /// (d2l::select_rows calls it with every field of `selected` but
  /// key_values selected already; an entry of key_values that it leaves as
  /// `state`'s is selected after it, so a cache may set the entries it holds
  /// to views of its own). With `same_sources`, row i of `index` comes from
  /// the same source as row i (beam search): what depends on the source only
  /// may be kept. Null (the default): no cache, the decoder rebuilds what
  /// it needs from the book's fields.
  virtual std::shared_ptr<DecoderCache> select_rows(const DecoderState& state,
                                                    const torch::Tensor& index,
                                                    DecoderState& selected,
                                                    bool same_sources) const {
    (void)state, (void)index, (void)selected, (void)same_sources;
    return nullptr;
  }
};

/// The state a decoder carries from one `forward` call to the next (the book's
/// `state`). The book's decoders fit in one type so that `EncoderDecoder` and
/// greedy decoding need not know which decoder they drive:
///
/// * `Seq2SeqDecoder` uses `hidden_state` only (the book's state is that tensor).
/// * `Seq2SeqAttentionDecoder` uses the book's triple `(enc_outputs,
///   hidden_state, enc_valid_lens)`, and `cache` for the encoder outputs passed
///   once through the attention's key projection W_k (the keys never change
///   while a sequence is decoded).
/// * `TransformerDecoder` uses the book's `[enc_outputs, enc_valid_lens,
///   key_values]`, and in evaluation mode without autograd `cache` for each
///   block's projected keys and values (docs/transformer.md).
///
/// Fields a decoder does not use stay undefined.
// The copies and moves the compiler writes copy the deprecated field too:
// not a use of it to warn users about (GCC reports those at the struct).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct DecoderState {
  // User-provided, so that `DecoderState{}` is this constructor, not an
  // aggregate initialisation that names the deprecated fields in users' code.
  DecoderState() {}

  /// Recurrent state of every layer: (num_layers, B, num_hiddens).
  torch::Tensor hidden_state;
  /// Encoder outputs to attend to, batch-first: (B, num_enc_steps, num_hiddens).
  torch::Tensor enc_outputs;
  /// Valid encoder steps per example, (B), or undefined when all are valid.
  torch::Tensor enc_valid_lens;
  /// torch::kBool (B, num_enc_steps), true at the encoder's padding steps,
  /// which no decoder step attends to (AttentionMask::key_padding_mask: what
  /// TransformerDecoder::init_state takes from the source mask), or undefined.
  torch::Tensor enc_key_padding_mask;
  /// TransformerDecoder: per block, the block's inputs at every target step so
  /// far (the book's `state[2][i]`), (B, steps, num_hiddens); undefined before
  /// the block's first call.
  std::vector<torch::Tensor> key_values;
  /// The decoder's own data, made by its init_state or forward (null where
  /// it keeps none). It serves a state only while the book's fields above
  /// are the ones it was made from: a state whose fields are changed by hand,
  /// or advanced twice (beam search), gets the book's numbers, the decoder
  /// rebuilding what it needs. Shared by the copies of a state.
  std::shared_ptr<DecoderCache> cache;
  /// Seq2SeqAttentionDecoder's W_k(enc_outputs) until 0.3, set by its
  /// init_state and no longer read by its forward, which keeps the projected
  /// keys in `cache`. Removed in the next minor version.
  [[deprecated(
      "Seq2SeqAttentionDecoder keeps its projected keys in DecoderState::cache; this "
      "field is no longer read")]] torch::Tensor projected_keys;
  /// TransformerDecoder's step cache in 0.3; it keeps it in `cache` now and
  /// leaves this null (setting it does nothing). Removed in the next minor
  /// version.
  [[deprecated(
      "TransformerDecoder keeps its step cache in DecoderState::cache; this field is "
      "always null")]] std::shared_ptr<detail::StepCache>
      step_cache;
};
#pragma GCC diagnostic pop

/// The book's `Encoder` interface: `forward(X, *args)`. The only extra argument
/// the book passes is the valid length of each source sequence, (B); encoders
/// that do not mask (such as `Seq2SeqEncoder`) ignore it.
///
/// Unlike the book's `Encoder(nn.Module)`, this is an interface only: an
/// encoder is a module that also implements it,
///
///     struct MyEncoderImpl : torch::nn::Cloneable<MyEncoderImpl>, d2l::Encoder { ... };
///
/// Inheriting `torch::nn::Module` here (virtually, so that both bases share
/// one) stopped compiling with LibTorch 2.2, whose `Cloneable<T>` inherits
/// `Module` non-virtually; this design builds on 1.13 and 2.x alike.
class Encoder {
 public:
  virtual ~Encoder() = default;
  virtual EncoderOutput forward(const torch::Tensor& X, const torch::Tensor& valid_lens = {}) = 0;

  /// The module this encoder is; throws c10::Error if its class does not
  /// also derive from torch::nn::Module.
  torch::nn::Module& as_module();
  const torch::nn::Module& as_module() const;
};

/// The book's `Decoder` interface: `init_state(enc_outputs, *args)` and
/// `forward(X, state) -> (output, state)`. Like `Encoder`, an interface that a
/// module implements: `struct MyDecoderImpl : torch::nn::Cloneable<MyDecoderImpl>, d2l::Decoder`.
class Decoder {
 public:
  virtual ~Decoder() = default;
  /// The module this decoder is; throws c10::Error if its class does not
  /// also derive from torch::nn::Module.
  torch::nn::Module& as_module();
  const torch::nn::Module& as_module() const;

  virtual DecoderState init_state(const EncoderOutput& enc_outputs,
                                  const torch::Tensor& enc_valid_lens = {}) = 0;
  virtual std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& X,
                                                          const DecoderState& state) = 0;
};

/// The book's `AttentionDecoder`: a decoder that exposes the attention weights
/// of its last `forward` call.
class AttentionDecoder : public Decoder {
 public:
  /// (B, num_dec_steps, num_enc_steps): row t holds the weights of decoding
  /// step t of the last `forward` call (the book keeps a list of the per-step
  /// (B, 1, num_enc_steps) tensors; here they are concatenated along dim 1).
  virtual torch::Tensor attention_weights() const = 0;
};

/// d2l's `EncoderDecoder`: `forward(enc_X, dec_X, *args)` runs
/// `dec_state = decoder.init_state(encoder(enc_X, *args), *args)` and returns
/// `decoder(dec_X, dec_state)`. Parameters are named `encoder.*` and
/// `decoder.*`, as in the book's state_dict. It keeps no state of its own:
/// shared by threads, it is as safe as its encoder and decoder (ours are:
/// Note [Recording attention weights] in src/attention_weights.h).
class EncoderDecoderImpl : public torch::nn::Cloneable<EncoderDecoderImpl> {
 public:
  /// `encoder` and `decoder` must also be `torch::nn::Module`s (see `Encoder`);
  /// they are registered as the submodules "encoder" and "decoder".
  EncoderDecoderImpl(std::shared_ptr<Encoder> encoder, std::shared_ptr<Decoder> decoder);

  /// Accepts module holders directly: `EncoderDecoder(Seq2SeqEncoder(...), Seq2SeqDecoder(...))`.
  template <typename E, typename D>
  EncoderDecoderImpl(const torch::nn::ModuleHolder<E>& encoder,
                     const torch::nn::ModuleHolder<D>& decoder)
      : EncoderDecoderImpl(std::shared_ptr<Encoder>(encoder.ptr()),
                           std::shared_ptr<Decoder>(decoder.ptr())) {}

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// Module::load, checked first: a tensor of another shape or dtype, or a
  /// missing or extra one, is a c10::Error and nothing is loaded.
  void load(torch::serialize::InputArchive& archive) override;

  /// Deep copy. (`torch::optional` is `c10::optional` on 1.13 and
  /// `std::optional` on 2.x: the type of the `Module::clone` it overrides.)
  /// The encoder and decoder are held through their interfaces, so
  /// `Cloneable`'s copy-then-reset scheme cannot rebuild them; they are cloned
  /// through their own `clone()` instead, as `torch::nn::Sequential` does.
  std::shared_ptr<torch::nn::Module> clone(
      const torch::optional<torch::Device>& device = torch::nullopt) const override;

  /// enc_X (B, num_enc_steps) and dec_X (B, num_dec_steps) token ids;
  /// enc_valid_lens (B) or undefined. Returns the decoder's (output, state).
  std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& enc_X,
                                                  const torch::Tensor& dec_X,
                                                  const torch::Tensor& enc_valid_lens = {});

  std::shared_ptr<Encoder> encoder;
  std::shared_ptr<Decoder> decoder;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({2, torch::nn::AnyValue(torch::Tensor())})
};
TORCH_MODULE(EncoderDecoder);

}  // namespace d2l
