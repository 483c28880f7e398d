#include <d2l/train.h>

#include "train_loop.h"

#include <d2l/sequence_mask.h>
#include <d2l/viz/plot.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/optim/adam.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>

namespace d2l {

namespace {

std::string shape(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += fmt::format("{}{}", d ? ", " : "", t.size(d));
  return s + "]";
}

}  // namespace

torch::Tensor MaskedSoftmaxCELossImpl::forward(const torch::Tensor& pred,
                                               const torch::Tensor& label,
                                               const torch::Tensor& valid_len) {
  constexpr const char* fn = "d2l::MaskedSoftmaxCELoss";
  TORCH_CHECK(pred.defined() && pred.dim() == 3 && pred.is_floating_point(),
              fmt::format("{}: pred must be a floating-point (batch, steps, vocab) tensor, got {}",
                          fn, shape(pred)));
  TORCH_CHECK(
      label.defined() && label.dim() == 2 && !label.is_floating_point() &&
          label.size(0) == pred.size(0) && label.size(1) == pred.size(1),
      fmt::format("{}: label must be an integer (batch, steps) tensor matching pred {}, got {}", fn,
                  shape(pred), shape(label)));
  TORCH_CHECK(valid_len.defined() && valid_len.dim() == 1 && valid_len.size(0) == pred.size(0),
              fmt::format("{}: valid_len must be a (batch) tensor for pred {}, got {}", fn,
                          shape(pred), shape(valid_len)));
  if (label.numel() > 0) {
    const int64_t lo = label.min().item<int64_t>(), hi = label.max().item<int64_t>();
    const int64_t bad = lo < 0 ? lo : hi;
    TORCH_CHECK(lo >= 0 && hi < pred.size(2),
                fmt::format("{}: label holds id {}, outside the vocabulary of size {}", fn, bad,
                            pred.size(2)));
  }
  const auto weights = d2l::sequence_mask(torch::ones_like(label, pred.options()), valid_len);
  const auto unweighted = torch::nn::functional::cross_entropy(
      pred.permute({0, 2, 1}), label.to(torch::kLong),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  return (unweighted * weights).mean(1);
}

void MaskedSoftmaxCELossImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::MaskedSoftmaxCELoss()";
}

void grad_clipping(torch::nn::Module& net, double theta) {
  TORCH_CHECK(theta > 0, fmt::format("d2l::grad_clipping: theta must be positive, got {}", theta));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : net.parameters()) {
    if (p.requires_grad() && p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  auto norm = torch::zeros({}, grads.front().options().dtype(torch::kDouble));
  for (const auto& g : grads) norm += g.pow(2).sum().to(torch::kDouble);
  const double value = std::sqrt(norm.item<double>());
  if (value > theta) {
    for (auto& g : grads) g.mul_(theta / value);
  }
}

namespace {

void xavier_init_weights(torch::nn::Module& net) {
  torch::NoGradGuard no_grad;
  for (auto& module : net.modules()) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      torch::nn::init::xavier_uniform_(linear->weight);
    } else if (auto* gru = module->as<torch::nn::GRU>()) {
      for (auto& p : gru->named_parameters()) {
        if (p.key().find("weight") != std::string::npos)
          torch::nn::init::xavier_uniform_(p.value());
      }
    }
  }
}

void show_progress(int64_t epoch, int64_t num_epochs, double fraction, double loss) {
  constexpr int width = 24;
  const double done = (static_cast<double>(epoch) - 1 + fraction) / static_cast<double>(num_epochs);
  const int filled = std::clamp(static_cast<int>(done * width), 0, width);
  fmt::print("\repoch {:>4}/{} [{}{}] loss {:.4f} ", epoch, num_epochs, std::string(filled, '#'),
             std::string(width - filled, '-'), loss);
  std::fflush(stdout);
}

}  // namespace

namespace detail {

TrainSeq2SeqResult train_seq2seq_loop(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                      int64_t num_epochs, const Vocab& tgt_vocab,
                                      torch::Device device, const TrainSeq2SeqOptions& options,
                                      Seq2SeqSync* sync, const char* fn) {
  using Clock = std::chrono::steady_clock;
  TORCH_CHECK(lr > 0, fmt::format("{}: lr must be positive, got {}", fn, lr));
  TORCH_CHECK(num_epochs > 0,
              fmt::format("{}: num_epochs must be positive, got {}", fn, num_epochs));
  TORCH_CHECK(data_iter.arrays().size() == 4,
              fmt::format("{}: data_iter must hold (X, X_valid_len, Y, Y_valid_len), got {} arrays",
                          fn, data_iter.arrays().size()));
  const int64_t bos = tgt_vocab["<bos>"];
  TORCH_CHECK(bos != Vocab::unk(), fmt::format("{}: tgt_vocab has no <bos>", fn));
  const int64_t rank = sync ? sync->rank() : 0, world_size = sync ? sync->world_size() : 1;
  const bool leader = rank == 0;
  xavier_init_weights(net);
  net.to(device);
  if (sync) sync->after_init(net);
  torch::optim::Adam optimizer(net.parameters(), torch::optim::AdamOptions(lr));
  MaskedSoftmaxCELoss loss;
  net.train();
  const bool progress = leader && options.progress() && isatty(fileno(stdout));
  TrainSeq2SeqResult result;
  d2l::Series curve;
  for (int64_t epoch = 1; epoch <= num_epochs; ++epoch) {
    const auto start = Clock::now();
    auto last_shown = start;
    double loss_sum = 0, num_tokens = 0, num_examples = 0;
    const auto batches = data_iter.epoch();
    for (size_t b = 0; b < batches.size(); ++b) {
      optimizer.zero_grad();
      const int64_t batch_size = batches[b][0].size(0);
      // Rank r's rows of the batch; one process takes them all.
      const int64_t begin = batch_size * rank / world_size;
      const int64_t end = batch_size * (rank + 1) / world_size;
      double step_loss = 0, step_tokens = 0;
      if (sync) sync->before_backward();
      if (end > begin) {
        const auto rows = [&](int i) { return batches[b][i].slice(0, begin, end).to(device); };
        const auto X = rows(0), X_valid_len = rows(1), Y = rows(2), Y_valid_len = rows(3);
        const auto bos_column = torch::full({Y.size(0), 1}, bos, Y.options());
        const auto dec_input = torch::cat({bos_column, Y.slice(1, 0, -1)}, 1);
        const auto Y_hat = std::get<0>(net.forward(X, dec_input, X_valid_len));
        const auto l = loss(Y_hat, Y, Y_valid_len).sum();
        l.backward();
        step_loss = l.item<double>();
        step_tokens = Y_valid_len.sum().item<double>();
      }
      if (sync) {
        sync->after_backward();
        auto totals = torch::tensor({step_loss, step_tokens}, torch::kDouble);
        sync->sum(totals);
        step_loss = totals[0].item<double>();
        step_tokens = totals[1].item<double>();
      }
      grad_clipping(net, 1);
      optimizer.step();
      loss_sum += step_loss;
      num_tokens += step_tokens;
      num_examples += static_cast<double>(batch_size);
      result.step_losses.push_back(step_tokens > 0 ? step_loss / step_tokens : 0.0);
      const auto now = Clock::now();
      if (progress &&
          (b + 1 == batches.size() || now - last_shown > std::chrono::milliseconds(250))) {
        show_progress(epoch, num_epochs, static_cast<double>(b + 1) / batches.size(),
                      loss_sum / num_tokens);
        last_shown = now;
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.loss = loss_sum / num_tokens;
    result.tokens_per_sec = num_tokens / seconds;
    result.examples_per_sec = num_examples / seconds;
    result.losses.push_back(result.loss);
    result.epoch_seconds.push_back(seconds);
    if (leader && !options.svg_path().empty() && (epoch % 10 == 0 || epoch == num_epochs)) {
      curve.x.push_back(static_cast<double>(epoch));
      curve.y.push_back(result.loss);
      d2l::save_plot({curve}, d2l::PlotOptions().xlabel("epoch").ylabel("loss"),
                     options.svg_path());
    }
  }
  if (progress) fmt::print("\n");
  if (leader) {
    fmt::print("loss {:.3f}, {:.1f} tokens/sec on {}{}\n", result.loss, result.tokens_per_sec,
               device.str(), world_size > 1 ? fmt::format(", {} processes", world_size) : "");
  }
  return result;
}

}  // namespace detail

TrainSeq2SeqResult train_seq2seq(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const TrainSeq2SeqOptions& options) {
  return detail::train_seq2seq_loop(net, data_iter, lr, num_epochs, tgt_vocab, device, options,
                                    nullptr, "d2l::train_seq2seq");
}

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
    const Vocab& tgt_vocab, int64_t num_steps, torch::Device device, bool save_attention_weights) {
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
  torch::NoGradGuard no_grad;
  std::string lowered = src_sentence;
  for (auto& c : lowered) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  auto src_tokens = src_vocab[split_on_space(lowered)];
  src_tokens.push_back(src_vocab["<eos>"]);
  const auto valid = std::min<int64_t>(static_cast<int64_t>(src_tokens.size()), num_steps);
  const auto enc_valid_len =
      torch::tensor({valid}, torch::TensorOptions(device).dtype(torch::kLong));
  const auto padded = truncate_pad(src_tokens, num_steps, src_vocab["<pad>"]);
  const auto enc_X =
      torch::tensor(padded, torch::TensorOptions(device).dtype(torch::kLong)).unsqueeze(0);
  auto dec_state =
      net.decoder->init_state(net.encoder->forward(enc_X, enc_valid_len), enc_valid_len);
  auto dec_X = torch::full({1, 1}, bos, torch::TensorOptions(device).dtype(torch::kLong));
  std::vector<int64_t> output_seq;
  std::vector<torch::Tensor> attention_weight_seq;
  for (int64_t step = 0; step < num_steps; ++step) {
    torch::Tensor Y;
    std::tie(Y, dec_state) = net.decoder->forward(dec_X, dec_state);
    dec_X = Y.argmax(2);
    const int64_t pred = dec_X.item<int64_t>();
    if (save_attention_weights)
      attention_weight_seq.push_back(attention_decoder->attention_weights()[0]);
    if (pred == eos) break;
    output_seq.push_back(pred);
  }
  std::string translation;
  for (size_t i = 0; i < output_seq.size(); ++i) {
    if (i > 0) translation += ' ';
    translation += tgt_vocab.to_tokens(output_seq[i]);
  }
  return {translation, attention_weight_seq};
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
