#include "seq2seq_toolkit.h"

#include <d2l/sequence_mask.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

namespace d2l::examples {

Sentence split(const std::string& text) {
  Sentence words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

Vocab::Vocab(const std::vector<std::string>& words) : tokens_{"<pad>", "<bos>", "<eos>", "<unk>"} {
  tokens_.insert(tokens_.end(), words.begin(), words.end());
  for (size_t i = 0; i < tokens_.size(); ++i) index_.emplace(tokens_[i], static_cast<int64_t>(i));
}

int64_t Vocab::operator[](const std::string& token) const {
  const auto it = index_.find(token);
  return it == index_.end() ? unk() : it->second;
}

namespace {

// The book's truncate_pad of `sentence` + <eos>, as ids.
std::vector<int64_t> padded_ids(const Sentence& sentence, const Vocab& vocab, int64_t num_steps) {
  std::vector<int64_t> ids;
  for (const auto& w : sentence) ids.push_back(vocab[w]);
  ids.push_back(Vocab::eos());
  ids.resize(num_steps, Vocab::pad());
  return ids;
}

std::pair<torch::Tensor, torch::Tensor> build_array(const std::vector<Sentence>& sentences,
                                                    const Vocab& vocab, int64_t num_steps) {
  std::vector<int64_t> ids;
  for (const auto& s : sentences) {
    const auto row = padded_ids(s, vocab, num_steps);
    ids.insert(ids.end(), row.begin(), row.end());
  }
  const auto array =
      torch::tensor(ids).reshape({static_cast<int64_t>(sentences.size()), num_steps});
  return {array, (array != Vocab::pad()).sum(1)};
}

}  // namespace

Dataset build_dataset(const std::vector<Sentence>& sources, const std::vector<Sentence>& targets,
                      const Vocab& source_vocab, const Vocab& target_vocab, int64_t num_steps) {
  Dataset data;
  std::tie(data.source, data.source_valid_len) = build_array(sources, source_vocab, num_steps);
  std::tie(data.target, data.target_valid_len) = build_array(targets, target_vocab, num_steps);
  return data;
}

torch::Tensor masked_softmax_ce_loss(const torch::Tensor& pred, const torch::Tensor& label,
                                     const torch::Tensor& valid_len) {
  const auto weights = d2l::sequence_mask(torch::ones_like(label, pred.options()), valid_len);
  const auto unweighted = torch::nn::functional::cross_entropy(
      pred.permute({0, 2, 1}), label,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  return (unweighted * weights).mean(1);
}

void grad_clipping(torch::nn::Module& net, double theta) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : net.parameters()) {
    if (p.requires_grad() && p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  auto norm = torch::zeros({}, grads.front().options());
  for (const auto& g : grads) norm += g.pow(2).sum();
  norm = norm.sqrt();
  // One host read per batch, as the book's `if norm > theta`.
  if (norm.item<double>() > theta) {
    for (auto& g : grads) g.mul_(theta / norm);
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

// One line, rewritten in place: epoch, bar, loss per token, tokens per second.
void show_progress(int epoch, int num_epochs, double fraction, double loss, double tokens_per_s) {
  constexpr int width = 24;
  const double done = (epoch - 1 + fraction) / num_epochs;
  const int filled = static_cast<int>(done * width);
  fmt::print("\repoch {:>3}/{} [{}{}] loss {:.4f}, {:.0f} tokens/s ", epoch, num_epochs,
             std::string(filled, '#'), std::string(width - filled, '-'), loss, tokens_per_s);
  std::fflush(stdout);
}

}  // namespace

std::vector<double> train_seq2seq(d2l::EncoderDecoderImpl& net, const Dataset& data,
                                  const TrainOptions& options, int64_t bos, torch::Device device) {
  using Clock = std::chrono::steady_clock;
  xavier_init_weights(net);
  net.to(device);
  torch::optim::Adam optimizer(net.parameters(), torch::optim::AdamOptions(options.lr));
  net.train();
  const int64_t n = data.source.size(0);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(options.shuffle_seed);
  std::vector<double> epoch_losses;
  const auto start = Clock::now();
  auto last_shown = start;
  double tokens_seen = 0;
  for (int epoch = 1; epoch <= options.num_epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    double loss_sum = 0, num_tokens = 0;
    for (int64_t first = 0; first < n; first += options.batch_size) {
      const auto index = torch::tensor(std::vector<int64_t>(
          order.begin() + first, order.begin() + std::min(n, first + options.batch_size)));
      const auto X = data.source.index_select(0, index).to(device);
      const auto X_valid_len = data.source_valid_len.index_select(0, index).to(device);
      const auto Y = data.target.index_select(0, index).to(device);
      const auto Y_valid_len = data.target_valid_len.index_select(0, index).to(device);
      // Teacher forcing: the decoder reads <bos> and the target shifted right.
      const auto bos_column = torch::full({Y.size(0), 1}, bos, Y.options());
      const auto dec_input = torch::cat({bos_column, Y.slice(1, 0, -1)}, 1);
      optimizer.zero_grad();
      const auto Y_hat = std::get<0>(net.forward(X, dec_input, X_valid_len));
      const auto l = masked_softmax_ce_loss(Y_hat, Y, Y_valid_len).sum();
      l.backward();
      grad_clipping(net, 1);
      optimizer.step();
      const double batch_tokens = Y_valid_len.sum().item<double>();
      loss_sum += l.item<double>();
      num_tokens += batch_tokens;
      tokens_seen += batch_tokens;
      const auto now = Clock::now();
      const int64_t done = std::min(n, first + options.batch_size);
      if (done == n || now - last_shown > std::chrono::milliseconds(250)) {
        const double seconds = std::chrono::duration<double>(now - start).count();
        show_progress(epoch, options.num_epochs, static_cast<double>(done) / n,
                      loss_sum / num_tokens, tokens_seen / seconds);
        last_shown = now;
      }
    }
    epoch_losses.push_back(loss_sum / num_tokens);
  }
  fmt::print("\n");
  return epoch_losses;
}

Prediction predict_seq2seq(d2l::EncoderDecoderImpl& net, const Sentence& source,
                           const Vocab& source_vocab, const Vocab& target_vocab, int64_t num_steps,
                           torch::Device device, bool save_attention_weights) {
  net.eval();
  torch::NoGradGuard no_grad;
  auto* attention_decoder = dynamic_cast<d2l::AttentionDecoder*>(net.decoder.get());
  if (save_attention_weights && attention_decoder == nullptr) {
    throw std::invalid_argument("predict_seq2seq: the decoder has no attention weights");
  }
  const auto ids = padded_ids(source, source_vocab, num_steps);
  const int64_t valid = std::min<int64_t>(static_cast<int64_t>(source.size()) + 1, num_steps);
  const auto enc_valid_len = torch::tensor({valid}, torch::TensorOptions(device));
  const auto enc_X = torch::tensor(ids, torch::TensorOptions(device)).unsqueeze(0);
  auto state = net.decoder->init_state(net.encoder->forward(enc_X, enc_valid_len), enc_valid_len);
  auto dec_X = torch::full({1, 1}, Vocab::bos(), torch::TensorOptions(device).dtype(torch::kLong));
  Prediction prediction;
  std::vector<torch::Tensor> weights;
  for (int64_t step = 0; step < num_steps; ++step) {
    torch::Tensor Y;
    std::tie(Y, state) = net.decoder->forward(dec_X, state);
    dec_X = Y.argmax(2);
    const int64_t pred = dec_X.item<int64_t>();
    if (save_attention_weights) weights.push_back(attention_decoder->attention_weights()[0]);
    if (pred == Vocab::eos()) break;
    prediction.tokens.push_back(target_vocab.to_token(pred));
  }
  if (save_attention_weights) prediction.attention_weights = torch::cat(weights, 0);
  return prediction;
}

double bleu(const Sentence& pred, const Sentence& label, int k) {
  const auto len_pred = static_cast<int64_t>(pred.size());
  const auto len_label = static_cast<int64_t>(label.size());
  if (len_pred < k) return 0;
  auto ngram = [](const Sentence& s, int64_t i, int n) {
    return fmt::format("{}", fmt::join(s.begin() + i, s.begin() + i + n, " "));
  };
  double score = std::exp(std::min(0.0, 1.0 - static_cast<double>(len_label) / len_pred));
  for (int n = 1; n <= k; ++n) {
    std::map<std::string, int> label_subs;
    for (int64_t i = 0; i + n <= len_label; ++i) ++label_subs[ngram(label, i, n)];
    int64_t num_matches = 0;
    for (int64_t i = 0; i + n <= len_pred; ++i) {
      auto& count = label_subs[ngram(pred, i, n)];
      if (count > 0) {
        ++num_matches;
        --count;
      }
    }
    score *= std::pow(static_cast<double>(num_matches) / (len_pred - n + 1), std::pow(0.5, n));
  }
  return score;
}

}  // namespace d2l::examples
