// The book's predict_seq2seq (greedy decoding) and bleu.

#include <d2l/generate.h>
#include <d2l/train.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace d2l {

namespace {

std::vector<std::string> split_on_space(const std::string& s) {
  std::vector<std::string> words;
  for (size_t start = 0;;) {
    const size_t end = s.find(' ', start);
    words.push_back(s.substr(start, end == std::string::npos ? end : end - start));
    if (end == std::string::npos) return words;
    start = end + 1;
  }
}

std::string join(const std::vector<std::string>& tokens, size_t first, size_t n) {
  std::string out;
  for (size_t i = first; i < first + n; ++i) {
    if (i > first) out += ' ';
    out += tokens[i];
  }
  return out;
}

}  // namespace

std::pair<std::string, std::vector<torch::Tensor>> predict_seq2seq(
    EncoderDecoderImpl& net, const std::string& src_sentence, const Vocab& src_vocab,
    const Vocab& tgt_vocab, int64_t num_steps, torch::Device device, bool save_attention_weights,
    const PredictStepCallback& on_step) {
  constexpr const char* fn = "d2l::predict_seq2seq";
  TORCH_CHECK(num_steps > 0, fmt::format("{}: num_steps must be positive, got {}", fn, num_steps));
  auto* attention_decoder = dynamic_cast<AttentionDecoder*>(net.decoder.get());
  TORCH_CHECK(!save_attention_weights || attention_decoder != nullptr, fn,
              ": save_attention_weights needs an AttentionDecoder, got a decoder without "
              "attention weights");
  const int64_t eos = tgt_vocab["<eos>"], bos = tgt_vocab["<bos>"];
  TORCH_CHECK(eos != Vocab::unk() && bos != Vocab::unk(), fn,
              ": tgt_vocab must hold <bos> and <eos>");
  net.eval();
  std::string lowered = src_sentence;
  for (auto& c : lowered) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  auto src_tokens = src_vocab[split_on_space(lowered)];
  src_tokens.push_back(src_vocab["<eos>"]);
  // The book's loop is greedy decoding of one source padded to num_steps.
  auto options = GenerationOptions()
                     .max_length(num_steps)
                     .start_id(bos)
                     .end_id(eos)
                     .pad_id(src_vocab["<pad>"])
                     .source_length(num_steps)
                     .return_attention(save_attention_weights);
  if (on_step) {
    options.callback([&](int64_t step, int64_t, int64_t token) { on_step(step, token); });
  }
  (void)device;  // the model's own: generate puts the source where its parameters are
  auto hypothesis =
      std::move(generate(*net.encoder, *net.decoder, {src_tokens}, options)[0].hypotheses[0]);
  const auto& output_seq = hypothesis.tokens;
  std::vector<torch::Tensor> attention_weight_seq;
  if (save_attention_weights) {
    for (const auto& step : hypothesis.attention.unbind(0)) {
      attention_weight_seq.push_back(step.unsqueeze(-2));
    }
  }
  std::string translation;
  for (size_t i = 0; i < output_seq.size(); ++i) {
    if (i > 0) translation += ' ';
    translation += tgt_vocab.to_tokens(output_seq[i]);
  }
  return {translation, attention_weight_seq};
}

std::pair<std::string, std::vector<torch::Tensor>> predict_seq2seq(
    const EncoderDecoder& net, const std::string& src_sentence, const Vocab& src_vocab,
    const Vocab& tgt_vocab, int64_t num_steps, torch::Device device, bool save_attention_weights,
    const PredictStepCallback& on_step) {
  TORCH_CHECK(!net.is_empty(), "d2l::predict_seq2seq: net is an empty EncoderDecoder holder");
  return predict_seq2seq(*net.ptr(), src_sentence, src_vocab, tgt_vocab, num_steps, device,
                         save_attention_weights, on_step);
}

double bleu(const std::string& pred_seq, const std::string& label_seq, int64_t k) {
  TORCH_CHECK(k > 0, fmt::format("d2l::bleu: k must be positive, got {}", k));
  const auto pred_tokens = split_on_space(pred_seq), label_tokens = split_on_space(label_seq);
  const auto len_pred = static_cast<int64_t>(pred_tokens.size());
  const auto len_label = static_cast<int64_t>(label_tokens.size());
  if (len_pred < k) return 0;
  double score = std::exp(std::min(0.0, 1.0 - static_cast<double>(len_label) / len_pred));
  for (int64_t n = 1; n <= k; ++n) {
    std::map<std::string, int64_t> label_subs;
    for (int64_t i = 0; i + n <= len_label; ++i) ++label_subs[join(label_tokens, i, n)];
    int64_t num_matches = 0;
    for (int64_t i = 0; i + n <= len_pred; ++i) {
      auto& count = label_subs[join(pred_tokens, i, n)];
      if (count > 0) {
        ++num_matches;
        --count;
      }
    }
    score *= std::pow(static_cast<double>(num_matches) / static_cast<double>(len_pred - n + 1),
                      std::pow(0.5, static_cast<double>(n)));
  }
  return score;
}

}  // namespace d2l
