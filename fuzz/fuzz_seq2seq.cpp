// fuzz_attention's sequence-to-sequence areas: Seq2SeqEncoder and both
// decoders driven through init_state and forward with hostile encoder outputs
// and decoder states (shapes, dtypes, non-finite values, altered valid
// lengths), and EncoderDecoder end to end (with clone), on hostile token ids.

#include <d2l/seq2seq.h>

#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz_common.h"

namespace d2l_fuzz {
namespace {

const std::vector<torch::Dtype> kTokenDtypes = {torch::kLong,  torch::kLong, torch::kInt,
                                                torch::kShort, torch::kByte, torch::kBool,
                                                torch::kFloat};

// Small options, sometimes invalid (zero or negative sizes, bad dropout).
d2l::Seq2SeqOptions make_options(Bytes& in) {
  auto o = d2l::Seq2SeqOptions(1 + in.below(9), 1 + in.below(5), 1 + in.below(6), 1 + in.below(3))
               .dropout(in.pick(kDropouts));
  switch (in.below(24)) {
    case 0: o.vocab_size(-in.below(2)); break;
    case 1: o.num_hiddens(-in.below(2)); break;
    case 2: o.num_layers(-in.below(2)); break;
    default: break;
  }
  return o;
}

// Token ids (B, T): mostly in [0, vocab), sometimes out of range, of another
// dtype, or of another rank.
torch::Tensor make_tokens(Bytes& in, int64_t B, int64_t T, int64_t vocab) {
  std::vector<int64_t> shape{B, T};
  if (in.below(16) == 0) shape = dims(in, in.below(4));
  int64_t count = 1;
  for (auto s : shape) count *= s;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < count; ++i) {
    switch (in.below(32)) {
      case 0: ids.push_back(-1); break;
      case 1: ids.push_back(vocab); break;
      case 2: ids.push_back(std::numeric_limits<int64_t>::min()); break;
      default: ids.push_back(vocab > 0 ? in.below(vocab) : 0); break;
    }
  }
  auto X = torch::tensor(ids, torch::kLong).reshape(shape).to(in.pick(kTokenDtypes));
  if (in.below(8) == 0 && X.dim() == 2) X = X.t().contiguous().t();
  return X;
}

// `t`, or in place of it something hostile: undefined, another shape, dtype
// or layout, or non-finite values.
torch::Tensor perturb(Bytes& in, const torch::Tensor& t) {
  if (!t.defined() || in.below(4) != 0) return t;
  auto shape = t.sizes().vec();
  switch (in.below(6)) {
    case 0: return {};
    case 1:
      if (!shape.empty()) shape[in.below(shape.size())] += in.flag() ? 1 : -1;
      return make_arg(in, shape, t.scalar_type(), false).value;
    case 2: return t.to(in.pick(kDataDtypes));
    case 3: return make_arg(in, shape, t.scalar_type(), false).value;
    case 4: return t.dim() > 1 ? t.transpose(0, 1) : t.unsqueeze(0);
    default: return torch::full_like(t, in.pick<double>({kNaN, kInf, 1e30}));
  }
}

// Valid encoder lengths: undefined, (B) or hostile (make_lengths).
torch::Tensor make_enc_lens(Bytes& in, int64_t B, int64_t T_enc) {
  return make_lengths(in, B, 1, T_enc);
}

void check_lengths_accepted(const torch::Tensor& lens) {
  if (!lens.defined() || lens.numel() == 0) return;
  const auto d = lens.to(torch::kDouble);
  FUZZ_CHECK(d.isfinite().all().item<bool>() && d.ge(0).all().item<bool>() &&
                 d.eq(d.floor()).all().item<bool>(),
             "negative, fractional or non-finite valid lengths were accepted");
}

void check_decoder_output(const torch::Tensor& out, const d2l::DecoderState& next,
                          const d2l::Seq2SeqOptions& o, int64_t B, int64_t T) {
  note("out", out);
  FUZZ_CHECK(out.sizes() == torch::IntArrayRef({B, T, o.vocab_size()}),
             "decoder output of wrong shape");
  FUZZ_CHECK(next.hidden_state.sizes() == torch::IntArrayRef({o.num_layers(), B, o.num_hiddens()}),
             "decoder state of wrong shape");
}

}  // namespace

void fuzz_seq2seq(Bytes& in) {
  const auto o = make_options(in);
  const bool with_attention = in.flag();
  std::ostringstream description;
  description << "Seq2Seq vocab=" << o.vocab_size() << " embed=" << o.embed_size()
              << " hiddens=" << o.num_hiddens() << " layers=" << o.num_layers()
              << " dropout=" << o.dropout() << " attention=" << with_attention;
  current.description = description.str();
  d2l::Seq2SeqEncoder encoder(o);
  std::shared_ptr<d2l::Decoder> decoder;
  std::shared_ptr<d2l::Seq2SeqAttentionDecoderImpl> attention_decoder;
  if (with_attention) {
    attention_decoder = std::make_shared<d2l::Seq2SeqAttentionDecoderImpl>(o);
    decoder = attention_decoder;
  } else {
    decoder = std::make_shared<d2l::Seq2SeqDecoderImpl>(o);
  }
  const bool training = in.flag();
  encoder->train(training);
  decoder->as_module().train(training);
  const int64_t B = in.below(4), T_enc = in.below(5), T_dec = in.below(4);
  const auto enc_X = make_tokens(in, B, T_enc, o.vocab_size());
  note("enc_X", enc_X);
  const auto grad_mode = pick_grad_mode(in);
  GradModeScope scope(grad_mode);
  auto enc = encoder(enc_X);
  // make_tokens may have picked another shape; the encoder accepted it, so
  // it is (batch, steps) (a finding of an early run: the check used B, T_enc).
  FUZZ_CHECK(enc_X.dim() == 2, "the encoder accepted tokens that are not 2-D");
  const int64_t batch = enc_X.size(0), steps = enc_X.size(1);
  FUZZ_CHECK(
      enc.outputs.sizes() == torch::IntArrayRef({steps, batch, o.num_hiddens()}) &&
          enc.hidden_state.sizes() == torch::IntArrayRef({o.num_layers(), batch, o.num_hiddens()}),
      "encoder output of wrong shape");
  FUZZ_CHECK(all_finite(enc.outputs) && all_finite(enc.hidden_state), "encoder output not finite");
  enc.outputs = perturb(in, enc.outputs);
  enc.hidden_state = perturb(in, enc.hidden_state);
  note("enc.outputs", enc.outputs);
  note("enc.hidden_state", enc.hidden_state);
  const auto lens = make_enc_lens(in, B, T_enc);
  note("enc_valid_lens", lens);
  auto state = decoder->init_state(enc, lens);
  if (with_attention) check_lengths_accepted(lens);
  state.hidden_state = perturb(in, state.hidden_state);
  state.enc_outputs = perturb(in, state.enc_outputs);
  if (in.below(4) == 0) state.enc_valid_lens = make_enc_lens(in, B, T_enc);
  note("state.hidden_state", state.hidden_state);
  note("state.enc_outputs", state.enc_outputs);
  note("state.enc_valid_lens", state.enc_valid_lens);
  const auto dec_X = make_tokens(in, B, T_dec, o.vocab_size());
  note("dec_X", dec_X);
  const auto [out, next] = decoder->forward(dec_X, state);
  // Accepted tokens are (batch, steps), whatever shape make_tokens picked.
  const int64_t dec_batch = dec_X.size(0), dec_steps = dec_X.size(1);
  check_decoder_output(out, next, o, dec_batch, dec_steps);
  const bool finite_expected =
      tame(state.hidden_state) && tame(state.enc_outputs);
  if (finite_expected) FUZZ_CHECK(all_finite(out), "decoder output not finite");
  if (with_attention) {
    check_lengths_accepted(state.enc_valid_lens);
    const auto weights = attention_decoder->attention_weights();
    note("attention_weights", weights);
    const int64_t m = state.enc_outputs.size(1);
    check_weights(weights, valid_mask(state.enc_valid_lens, dec_batch, dec_steps, m),
                  finite_expected);
  }
  check_backward(out, decoder->as_module().parameters(), finite_expected, in);
}

void fuzz_encoder_decoder(Bytes& in) {
  const auto o = make_options(in);
  const bool with_attention = in.flag();
  d2l::Seq2SeqEncoder encoder(o);
  auto model = with_attention ? d2l::EncoderDecoder(encoder, d2l::Seq2SeqAttentionDecoder(o))
                              : d2l::EncoderDecoder(encoder, d2l::Seq2SeqDecoder(o));
  if (in.flag())
    model = d2l::EncoderDecoder(std::dynamic_pointer_cast<d2l::EncoderDecoderImpl>(model->clone()));
  model->train(in.flag());
  current.description = std::string("EncoderDecoder attention=") + (with_attention ? "1" : "0");
  const int64_t B = in.below(4), T_enc = in.below(5), T_dec = in.below(4);
  const auto enc_X = make_tokens(in, B, T_enc, o.vocab_size());
  const auto dec_X = in.below(16) == 0 ? make_tokens(in, B + 1, T_dec, o.vocab_size())
                                       : make_tokens(in, B, T_dec, o.vocab_size());
  const auto lens = make_enc_lens(in, B, T_enc);
  note("enc_X", enc_X);
  note("dec_X", dec_X);
  note("enc_valid_lens", lens);
  const auto grad_mode = pick_grad_mode(in);
  torch::Tensor out;
  d2l::DecoderState next;
  {
    GradModeScope scope(grad_mode);
    std::tie(out, next) = model(enc_X, dec_X, lens);
  }
  const int64_t dec_batch = dec_X.size(0), dec_steps = dec_X.size(1);
  check_decoder_output(out, next, o, dec_batch, dec_steps);
  FUZZ_CHECK(all_finite(out), "EncoderDecoder output not finite");
  if (with_attention) {
    check_lengths_accepted(lens);
    const auto weights =
        std::dynamic_pointer_cast<d2l::AttentionDecoder>(model->decoder)->attention_weights();
    note("attention_weights", weights);
    check_weights(weights, valid_mask(lens, dec_batch, dec_steps, enc_X.size(1)), true);
  }
  check_backward(out, model->parameters(), true, in);
}

}  // namespace d2l_fuzz
