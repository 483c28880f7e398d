// d2l::generate's checks of its options and inputs (generate_setup.h).

#include "seq2seq/generate_setup.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace d2l::detail {

void check_generation_options(const char* kFn, const GenerationOptions& o) {
  TORCH_CHECK(o.max_length() > 0,
              fmt::format("{}: max_length must be positive, got {}", kFn, o.max_length()));
  TORCH_CHECK(o.min_length() >= 0 && o.min_length() <= o.max_length(),
              fmt::format("{}: min_length must be in [0, max_length={}], got {}", kFn,
                          o.max_length(), o.min_length()));
  TORCH_CHECK(
      o.beam_size() >= 1 && o.beam_size() <= kMaxBeamSize,
      fmt::format("{}: beam_size must be in [1, {}], got {}", kFn, kMaxBeamSize, o.beam_size()));
  TORCH_CHECK(o.num_hypotheses() >= 1 && o.num_hypotheses() <= o.beam_size(),
              fmt::format("{}: num_hypotheses must be in [1, beam_size={}], got {}", kFn,
                          o.beam_size(), o.num_hypotheses()));
  TORCH_CHECK(std::isfinite(o.length_penalty()) && o.length_penalty() >= 0,
              fmt::format("{}: length_penalty must be finite and not negative, got {}", kFn,
                          o.length_penalty()));
  TORCH_CHECK(o.sampling_topk() >= 0,
              fmt::format("{}: sampling_topk must be 0 (every token) or positive, got {}", kFn,
                          o.sampling_topk()));
  TORCH_CHECK(o.sampling_topp() > 0 && o.sampling_topp() <= 1,
              fmt::format("{}: sampling_topp must be in (0, 1], got {}", kFn, o.sampling_topp()));
  TORCH_CHECK(std::isfinite(o.temperature()) && o.temperature() > 0,
              fmt::format("{}: temperature must be positive, got {}", kFn, o.temperature()));
  const bool sampling = o.sampling_topk() != 1;
  TORCH_CHECK(!sampling || o.beam_size() == 1,
              fmt::format("{}: sampling (sampling_topk={}) needs beam_size 1, got {}", kFn,
                          o.sampling_topk(), o.beam_size()));
  TORCH_CHECK(!o.callback() || o.beam_size() == 1,
              fmt::format("{}: callback is called by greedy decoding and sampling only, got "
                          "beam_size {}",
                          kFn, o.beam_size()));
  TORCH_CHECK(o.start_id() >= 0 && o.end_id() >= 0 && o.pad_id() >= 0,
              fmt::format("{}: start_id, end_id and pad_id must be set (the target's <bos> and "
                          "<eos>, the source's <pad>), got {}, {} and {}",
                          kFn, o.start_id(), o.end_id(), o.pad_id()));
  TORCH_CHECK(o.source_length() >= 0,
              fmt::format("{}: source_length must be 0 (the longest source) or positive, got {}",
                          kFn, o.source_length()));
  TORCH_CHECK(o.max_batch_size() >= 0,
              fmt::format("{}: max_batch_size must be 0 (one batch) or positive, got {}", kFn,
                          o.max_batch_size()));
}

namespace {

// The number of rows of `weight` of the first parameter named `name` (an
// embedding's vocabulary), or -1.
int64_t rows_of(const torch::nn::Module& m, const std::string& name) {
  for (const auto& p : m.named_parameters()) {
    if (p.key() == name && p.value().dim() == 2) return p.value().size(0);
  }
  return -1;
}

}  // namespace

void check_generation_inputs(const char* kFn, const torch::nn::Module& encoder,
                             const torch::nn::Module& decoder,
                             const std::vector<std::vector<int64_t>>& sources,
                             const GenerationOptions& o) {
  const int64_t source_vocab = rows_of(encoder, "embedding.weight");
  const int64_t target_vocab = rows_of(decoder, "embedding.weight");
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    TORCH_CHECK(!s.empty(), fmt::format("{}: sources[{}] is empty: a source holds at least its "
                                        "<eos>",
                                        kFn, i));
    for (size_t t = 0; t < s.size(); ++t) {
      TORCH_CHECK(s[t] >= 0 && (source_vocab < 0 || s[t] < source_vocab),
                  fmt::format("{}: sources[{}][{}] is {}, outside the encoder's vocabulary [0, {})",
                              kFn, i, t, s[t], source_vocab));
    }
  }
  if (source_vocab >= 0) {
    TORCH_CHECK(o.pad_id() < source_vocab,
                fmt::format("{}: pad_id {} is outside the encoder's vocabulary [0, {})", kFn,
                            o.pad_id(), source_vocab));
  }
  if (target_vocab >= 0) {
    TORCH_CHECK(o.start_id() < target_vocab && o.end_id() < target_vocab,
                fmt::format("{}: start_id {} and end_id {} must be in the decoder's vocabulary "
                            "[0, {})",
                            kFn, o.start_id(), o.end_id(), target_vocab));
  }
}

}  // namespace d2l::detail
