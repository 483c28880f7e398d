// d2l::generate's checks of its options (generate_setup.h).

#include "seq2seq/generate_setup.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cmath>

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

}  // namespace d2l::detail
