// Generation with an encoder-decoder (include/d2l/generate.h): batched
// greedy decoding, beam search and sampling over the Encoder and Decoder
// interfaces (select_rows, in select_rows.cpp, carries a state's rows into
// the next step's batch). Note [Generation].

#include <d2l/generate.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include "attention_weights.h"
#include "checks.h"
#include "packed_weights.h"
#include "seq2seq/generate_setup.h"
#include "seq2seq/generate_tokens.h"

// Note [Generation]
// One call encodes its sources once, as one batch padded to a common length,
// and decodes them step by step: each step runs the decoder once on the
// last token of every live row. A row is a (source, hypothesis) pair: one a
// source for greedy decoding and sampling, beam_size of them for beam
// search. What a row carries from step to step is the decoder's state,
// whose rows follow the rows of the batch through select_rows: when a
// source is done its rows leave the batch (later steps pay for live rows
// only), and when beam search keeps other hypotheses than it had, the rows
// are reordered by index. The library's decoders keep caches (projected
// encoder outputs and self-attention keys and values) whose rows
// select_rows selects too, so no step projects the past again; with
// same_sources (a reorder within each source's rows) what depends on the
// source only is not copied. What one step of beam search copies: for the
// Transformer, each block's inputs and self-attention keys and values so
// far (as much as the step's attention reads); for the GRU decoders, their
// hidden state.
//
// Beam search keeps, per source, the beam_size best live hypotheses by
// their log-probability. At each step every live hypothesis is extended by
// every token; of the candidates in order (log-probability, then earlier
// hypothesis, then smaller token id), those ending in <eos> among the first
// beam_size become finished hypotheses, scored log P / L^α (L counting the
// <eos>), and the first beam_size not ending in <eos> stay live. A source
// is done when it has num_hypotheses finished hypotheses and no live one can
// score above the worst of them: a live hypothesis of log-probability c
// (<= 0) can reach at most c / max_length^α, since extending it only lowers
// c, and α >= 0. At max_length the live hypotheses finish unfinished. With a
// beam that holds every prefix, this is exhaustive search.

namespace d2l {

namespace {

constexpr const char* kFn = "d2l::generate";

struct Hyp {
  std::vector<int64_t> tokens;
  std::vector<double> log_probs;
  std::vector<torch::Tensor> attention;
  double log_prob = 0;  // the sum of log_probs
};

double normalized(double log_prob, int64_t length, double alpha) {
  return alpha == 0 ? log_prob : log_prob / std::pow(static_cast<double>(length), alpha);
}

GenerationHypothesis finish(Hyp&& h, bool finished, double alpha, const GenerationOptions& o) {
  GenerationHypothesis out;
  const auto length = static_cast<int64_t>(h.log_probs.size());
  out.score = normalized(h.log_prob, length, alpha);
  out.finished = finished;
  out.tokens = std::move(h.tokens);
  if (finished) out.tokens.pop_back();  // the <eos>
  if (o.return_log_probs()) out.log_probs = std::move(h.log_probs);
  if (o.return_attention() && !h.attention.empty()) out.attention = torch::stack(h.attention);
  return out;
}

// The attention weights of the decoder's last call at its last step,
// (R, ..., num_enc_steps): attention_weights() is (R, ..., steps,
// num_enc_steps).
torch::Tensor step_attention(const AttentionDecoder* decoder, int64_t rows) {
  const auto w = decoder->attention_weights();
  TORCH_CHECK(w.defined() && w.dim() >= 3 && w.size(0) == rows,
              fmt::format("{}: return_attention: the decoder's attention_weights() must be "
                          "(batch={}, ..., steps, num_enc_steps), got {}",
                          kFn, rows, detail::shape_of(w)));
  return w.select(-2, -1);
}

struct Source {
  int64_t index;          // in the call
  std::vector<Hyp> live;  // its rows, in batch order
  std::vector<GenerationHypothesis> finished;
  bool done = false;
};

// Decodes the sources `indices` of `sources` as one batch into their
// results (Note [Generation]); generate has checked the sources and options.
void decode_batch(Encoder& encoder, Decoder& decoder,
                  const std::vector<std::vector<int64_t>>& sources,
                  const std::vector<int64_t>& indices, const GenerationOptions& o,
                  const AttentionDecoder* attention_decoder, const torch::Device& device,
                  at::Generator& generator, std::vector<GenerationResult>& results) {
  const auto long_options = torch::TensorOptions(device).dtype(torch::kLong);

  // The batch: sources padded (or cut) to one length.
  const auto B = static_cast<int64_t>(indices.size());
  int64_t longest = 0;
  for (const auto i : indices)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(sources[i].size()));
  const int64_t S = o.source_length() > 0 ? o.source_length() : longest;
  std::vector<int64_t> tokens(B * S, o.pad_id()), valid(B);
  for (int64_t b = 0; b < B; ++b) {
    const auto& s = sources[static_cast<size_t>(indices[b])];
    valid[b] = std::min<int64_t>(static_cast<int64_t>(s.size()), S);
    std::copy_n(s.begin(), valid[b], tokens.begin() + b * S);
  }
  const auto enc_X = torch::tensor(tokens, long_options).view({B, S});
  const auto enc_valid_lens = torch::tensor(valid, long_options);
  auto state = decoder.init_state(encoder.forward(enc_X, enc_valid_lens), enc_valid_lens);

  const int64_t k = o.beam_size();
  const double alpha = o.length_penalty();
  const bool sampling = o.sampling_topk() != 1;

  std::vector<Source> live_sources(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    live_sources[b].index = indices[b];
    live_sources[b].live.resize(1);  // beam search starts from one hypothesis
  }
  constexpr double kNone = -std::numeric_limits<double>::infinity();

  for (int64_t step = 0; step < o.max_length() && !live_sources.empty(); ++step) {
    // The rows' last tokens.
    std::vector<int64_t> last;
    for (const auto& src : live_sources) {
      for (const auto& h : src.live)
        last.push_back(h.tokens.empty() ? o.start_id() : h.tokens.back());
    }
    const auto R = static_cast<int64_t>(last.size());
    torch::Tensor X;
    if (device.is_cpu()) {  // one ATen call rather than torch::tensor's and a view's
      X = torch::empty({R, 1}, long_options);
      std::copy(last.begin(), last.end(), X.data_ptr<int64_t>());
    } else {
      X = torch::tensor(last, long_options).view({R, 1});
    }
    torch::Tensor Y;
    std::tie(Y, state) = decoder.forward(X, state);
    TORCH_CHECK(Y.dim() == 3 && Y.size(0) == R && Y.size(1) == 1,
                fmt::format("{}: the decoder must return logits (batch={}, 1, vocab_size) for one "
                            "step, got {}",
                            kFn, R, detail::shape_of(Y)));
    const int64_t V = Y.size(2);
    TORCH_CHECK(
        o.end_id() < V && o.start_id() < V,
        fmt::format("{}: start_id {} and end_id {} must be below the decoder's vocab_size {}", kFn,
                    o.start_id(), o.end_id(), V));
    auto logits = Y.select(1, 0);
    if (!Y.device().is_cpu() || Y.scalar_type() != torch::kFloat) {
      logits = logits.to(torch::kCPU, torch::kFloat);
    }
    logits = logits.contiguous();
    if (step < o.min_length()) logits.select(1, o.end_id()).fill_(kNone);
    const auto log_probs = torch::log_softmax(logits, 1).contiguous();
    const float* lp = log_probs.data_ptr<float>();
    const float* lg = logits.data_ptr<float>();
    const auto attention =
        o.return_attention() ? step_attention(attention_decoder, R) : torch::Tensor();
    // Each row's source, to tell a reorder within sources from any other.
    std::vector<int64_t> source_of;

    // Choose each row's token (greedy, sampling) or each source's
    // hypotheses (beam search); `parents` are the rows the next step's rows
    // continue.
    std::vector<int64_t> parents;
    std::vector<Source> next_sources;
    std::vector<int64_t> order;  // a row's tokens, best first (beam search)
    int64_t row0 = 0;
    for (auto& src : live_sources) {
      const auto rows = static_cast<int64_t>(src.live.size());
      const auto attention_of = [&](int64_t r) { return attention[r].clone(); };
      source_of.insert(source_of.end(), static_cast<size_t>(rows), src.index);
      if (k == 1) {
        auto& h = src.live[0];
        const float* row_lp = lp + row0 * V;
        int64_t token = 0;
        if (!sampling) {
          const float* row = lg + row0 * V;
          token = std::max_element(row, row + V) - row;  // the first maximum, as argmax
        } else {
          token = detail::sample_token(logits, log_probs, row0, o, generator);
        }
        h.tokens.push_back(token);
        h.log_probs.push_back(row_lp[token]);
        h.log_prob += row_lp[token];
        if (o.return_attention()) h.attention.push_back(attention_of(row0));
        if (o.callback()) o.callback()(step, src.index, token);
        if (token == o.end_id()) {
          src.finished.push_back(finish(std::move(h), true, alpha, o));
          src.done = true;
        } else {
          parents.push_back(row0);
        }
      } else {
        // Candidates (log P, row, token) in order: larger log P first, then
        // earlier row, then smaller token.
        struct Candidate {
          double log_prob;
          int64_t row, token;
        };
        // Only a row's own 2k best tokens can be among its source's 2k
        // best candidates.
        const int64_t per_row = std::min<int64_t>(V, 2 * k);
        std::vector<Candidate> candidates;
        candidates.reserve(static_cast<size_t>(rows * per_row));
        for (int64_t r = 0; r < rows; ++r) {
          const float* row_lp = lp + (row0 + r) * V;
          detail::best_tokens(row_lp, V, per_row, order);
          for (int64_t i = 0; i < per_row; ++i) {
            const int64_t v = order[static_cast<size_t>(i)];
            if (row_lp[v] == kNone) break;
            candidates.push_back({src.live[r].log_prob + row_lp[v], r, v});
          }
        }
        const auto better = [](const Candidate& a, const Candidate& b) {
          if (a.log_prob != b.log_prob) return a.log_prob > b.log_prob;
          if (a.row != b.row) return a.row < b.row;
          return a.token < b.token;
        };
        const auto take = std::min<size_t>(candidates.size(), static_cast<size_t>(2 * k));
        std::partial_sort(candidates.begin(), candidates.begin() + take, candidates.end(), better);
        std::vector<Hyp> kept;
        for (size_t c = 0; c < take && static_cast<int64_t>(kept.size()) < k; ++c) {
          const auto& cand = candidates[c];
          Hyp h = src.live[cand.row];
          h.tokens.push_back(cand.token);
          const double token_lp = lp[(row0 + cand.row) * V + cand.token];
          h.log_probs.push_back(token_lp);
          h.log_prob = cand.log_prob;
          if (o.return_attention()) h.attention.push_back(attention_of(row0 + cand.row));
          if (cand.token == o.end_id()) {
            if (c < static_cast<size_t>(k))
              src.finished.push_back(finish(std::move(h), true, alpha, o));
          } else {
            kept.push_back(std::move(h));
            parents.push_back(row0 + cand.row);
          }
        }
        src.live = std::move(kept);
        // Done: enough finished hypotheses that no live one can beat.
        if (static_cast<int64_t>(src.finished.size()) >= o.num_hypotheses()) {
          std::vector<double> scores;
          for (const auto& f : src.finished) scores.push_back(f.score);
          std::nth_element(scores.begin(), scores.begin() + (o.num_hypotheses() - 1), scores.end(),
                           std::greater<>());
          const double worst_kept = scores[static_cast<size_t>(o.num_hypotheses() - 1)];
          double best_live = kNone;
          for (const auto& h : src.live) {
            best_live = std::max(best_live, normalized(h.log_prob, o.max_length(), alpha));
          }
          if (best_live <= worst_kept) src.done = true;
        }
        if (src.done || src.live.empty()) {
          // Its rows leave the batch.
          parents.resize(parents.size() - src.live.size());
          src.done = true;
        }
      }
      row0 += rows;
      if (src.done) {
        // Live hypotheses of a done source are worse than its finished
        // ones (or there are none); they are not returned.
        auto& out = results[static_cast<size_t>(src.index)].hypotheses;
        out = std::move(src.finished);
      } else {
        next_sources.push_back(std::move(src));
      }
    }
    live_sources = std::move(next_sources);
    if (live_sources.empty() || step + 1 == o.max_length()) break;
    // The next step's rows: the same rows (nothing to do), or fewer, or
    // reordered.
    bool identity = static_cast<int64_t>(parents.size()) == R;
    bool same_sources = identity;
    for (size_t i = 0; same_sources && i < parents.size(); ++i) {
      identity = identity && parents[i] == static_cast<int64_t>(i);
      same_sources = source_of[static_cast<size_t>(parents[i])] == source_of[i];
    }
    if (!identity) state = select_rows(state, torch::tensor(parents, long_options), same_sources);
  }
  // Sources still live at max_length: their live hypotheses finish
  // unfinished.
  for (auto& src : live_sources) {
    for (auto& h : src.live) src.finished.push_back(finish(std::move(h), false, alpha, o));
    results[static_cast<size_t>(src.index)].hypotheses = std::move(src.finished);
  }
}

}  // namespace

std::vector<GenerationResult> generate(Encoder& encoder, Decoder& decoder,
                                       const std::vector<std::vector<int64_t>>& sources,
                                       const GenerationOptions& o) {
  detail::check_generation_options(kFn, o);
  auto& encoder_module = encoder.as_module();
  auto& decoder_module = decoder.as_module();
  detail::check_generation_inputs(kFn, encoder_module, decoder_module, sources, o);
  const auto* attention_decoder = dynamic_cast<const AttentionDecoder*>(&decoder);
  TORCH_CHECK(!o.return_attention() || attention_decoder != nullptr,
              fmt::format("{}: return_attention needs a d2l::AttentionDecoder, got a decoder "
                          "without attention weights",
                          kFn));
  // No sources (a service's empty batch): no results, the options checked.
  if (sources.empty()) return {};

  const detail::EvalGuard eval({&encoder_module, &decoder_module});
  torch::NoGradGuard no_grad;
  // The weights' bytes read once for the whole call (Note [Packed weights]).
  const detail::PackedWeightsCheckedOnce checked_once;
  // Weights nobody reads are not recorded (Note [Recording attention weights]).
  std::optional<detail::WeightsUnread> unread;
  if (!o.return_attention()) unread.emplace();
  torch::Device device = torch::kCPU;
  for (const auto& p : encoder_module.parameters()) {
    device = p.device();
    break;
  }
  // One sampler for the whole call, so that batching does not change what
  // a seed draws for a source in a given position of the draw order.
  at::Generator generator;
  if (o.sampling_topk() != 1) generator = at::detail::createCPUGenerator(o.seed());

  // The batches: in the sources' order, or, with max_batch_size, longest
  // first, so that a batch holds sources of similar lengths.
  const auto n = static_cast<int64_t>(sources.size());
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const int64_t batch = o.max_batch_size() > 0 ? std::min(o.max_batch_size(), n) : n;
  if (batch < n) {
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return sources[static_cast<size_t>(a)].size() > sources[static_cast<size_t>(b)].size();
    });
  }
  std::vector<GenerationResult> results(static_cast<size_t>(n));
  for (int64_t begin = 0; begin < n; begin += batch) {
    const std::vector<int64_t> indices(order.begin() + begin,
                                       order.begin() + std::min(n, begin + batch));
    decode_batch(encoder, decoder, sources, indices, o, attention_decoder, device, generator,
                 results);
  }
  for (auto& r : results) {
    auto& hyps = r.hypotheses;
    std::stable_sort(hyps.begin(), hyps.end(),
                     [](const auto& a, const auto& b) { return a.score > b.score; });
    if (static_cast<int64_t>(hyps.size()) > o.num_hypotheses()) hyps.resize(o.num_hypotheses());
  }
  return results;
}

std::vector<GenerationResult> generate(EncoderDecoderImpl& net,
                                       const std::vector<std::vector<int64_t>>& sources,
                                       const GenerationOptions& options) {
  return generate(*net.encoder, *net.decoder, sources, options);
}

std::vector<GenerationResult> generate(v1::EncoderDecoderImpl& net,
                                       const std::vector<std::vector<int64_t>>& sources,
                                       const GenerationOptions& options) {
  return generate(*net.encoder, *net.decoder, sources, options);
}

}  // namespace d2l
