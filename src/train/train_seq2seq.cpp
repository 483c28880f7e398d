// The book's train_seq2seq: one loop for one process and for the ranks of a
// group (TrainSeq2SeqSync), reporting through the options' callbacks.

#include <d2l/train.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/nn/init.h>
#include <torch/optim/adam.h>

#include <chrono>

#include "train_internal.h"

namespace d2l {

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

// One step on this rank's rows of `batch`; returns (summed loss, tokens) of
// the whole batch once `sync` has added the ranks' shares.
std::pair<double, double> train_step(EncoderDecoderImpl& net,
                                     const std::vector<torch::Tensor>& batch, int64_t bos,
                                     torch::Device device, MaskedSoftmaxCELoss& loss,
                                     const detail::TrainPrecision& precision,
                                     TrainSeq2SeqSync* sync) {
  const int64_t rank = sync ? sync->rank() : 0, world_size = sync ? sync->world_size() : 1;
  const int64_t batch_size = batch[0].size(0);
  // Rank r's rows of the batch; one process takes them all.
  const int64_t begin = batch_size * rank / world_size;
  const int64_t end = batch_size * (rank + 1) / world_size;
  double step_loss = 0, step_tokens = 0;
  if (sync) sync->before_backward();
  if (end > begin) {
    const auto rows = [&](int i) { return batch[i].slice(0, begin, end).to(device); };
    const auto X = rows(0), X_valid_len = rows(1), Y = rows(2), Y_valid_len = rows(3);
    const auto bos_column = torch::full({Y.size(0), 1}, bos, Y.options());
    const auto dec_input = torch::cat({bos_column, Y.slice(1, 0, -1)}, 1);
    const auto Y_hat = std::get<0>(net.forward(X, dec_input, X_valid_len));
    const auto l = loss(precision.loss_input(Y_hat), Y, Y_valid_len).sum();
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
  return {step_loss, step_tokens};
}

TrainSeq2SeqResult train_loop(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                              int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                              const TrainSeq2SeqOptions& options, TrainSeq2SeqSync* sync) {
  using Clock = std::chrono::steady_clock;
  const char* fn = sync ? sync->name() : "d2l::train_seq2seq";
  TORCH_CHECK(lr > 0, fmt::format("{}: lr must be positive, got {}", fn, lr));
  TORCH_CHECK(num_epochs > 0,
              fmt::format("{}: num_epochs must be positive, got {}", fn, num_epochs));
  TORCH_CHECK(data_iter.arrays().size() == 4,
              fmt::format("{}: data_iter must hold (X, X_valid_len, Y, Y_valid_len), got {} arrays",
                          fn, data_iter.arrays().size()));
  detail::check_train_dtype(options, fn);
  const int64_t bos = tgt_vocab["<bos>"];
  TORCH_CHECK(bos != Vocab::unk(), fmt::format("{}: tgt_vocab has no <bos>", fn));
  const int64_t world_size = sync ? sync->world_size() : 1;
  const bool leader = !sync || sync->rank() == 0;
  xavier_init_weights(net);
  net.to(device);
  if (sync) sync->after_init(net);
  detail::TrainPrecision precision(net, options, fn);
  torch::optim::Adam optimizer(precision.optimized(), torch::optim::AdamOptions(lr));
  MaskedSoftmaxCELoss loss;
  net.train();
  const auto& on_step = options.on_step();
  const auto& on_epoch = options.on_epoch();
  TrainSeq2SeqResult result;
  for (int64_t epoch = 1; epoch <= num_epochs; ++epoch) {
    const auto start = Clock::now();
    double loss_sum = 0, num_tokens = 0, num_examples = 0;
    const auto batches = data_iter.epoch();
    for (size_t b = 0; b < batches.size(); ++b) {
      optimizer.zero_grad();
      const auto [step_loss, step_tokens] =
          train_step(net, batches[b], bos, device, loss, precision, sync);
      precision.gradients_to_master();
      detail::clip_gradients(precision.optimized(), 1);
      optimizer.step();
      precision.master_to_model();
      loss_sum += step_loss;
      num_tokens += step_tokens;
      num_examples += static_cast<double>(batches[b][0].size(0));
      result.step_losses.push_back(step_tokens > 0 ? step_loss / step_tokens : 0.0);
      if (leader && on_step) {
        StepStats stats;
        stats.epoch = epoch;
        stats.num_epochs = num_epochs;
        stats.batch = static_cast<int64_t>(b) + 1;
        stats.num_batches = static_cast<int64_t>(batches.size());
        stats.loss = result.step_losses.back();
        stats.epoch_loss = loss_sum / num_tokens;
        stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        on_step(stats);
      }
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.loss = loss_sum / num_tokens;
    result.tokens_per_sec = num_tokens / seconds;
    result.examples_per_sec = num_examples / seconds;
    result.losses.push_back(result.loss);
    result.epoch_seconds.push_back(seconds);
    if (leader && on_epoch) {
      EpochStats stats;
      stats.epoch = epoch;
      stats.num_epochs = num_epochs;
      stats.loss = result.loss;
      stats.tokens_per_sec = result.tokens_per_sec;
      stats.examples_per_sec = result.examples_per_sec;
      stats.seconds = seconds;
      on_epoch(stats);
    }
  }
  precision.finish();
  if (leader) {
    fmt::print("loss {:.3f}, {:.1f} tokens/sec on {}{}\n", result.loss, result.tokens_per_sec,
               device.str(), world_size > 1 ? fmt::format(", {} processes", world_size) : "");
  }
  return result;
}

}  // namespace

TrainSeq2SeqResult train_seq2seq(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const TrainSeq2SeqOptions& options) {
  return train_loop(net, data_iter, lr, num_epochs, tgt_vocab, device, options, nullptr);
}

TrainSeq2SeqResult train_seq2seq(const EncoderDecoder& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const TrainSeq2SeqOptions& options) {
  TORCH_CHECK(!net.is_empty(), "d2l::train_seq2seq: net is an empty EncoderDecoder holder");
  return train_loop(*net.ptr(), data_iter, lr, num_epochs, tgt_vocab, device, options, nullptr);
}

TrainSeq2SeqResult train_seq2seq(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 TrainSeq2SeqSync& sync, const TrainSeq2SeqOptions& options) {
  return train_loop(net, data_iter, lr, num_epochs, tgt_vocab, device, options, &sync);
}

}  // namespace d2l
