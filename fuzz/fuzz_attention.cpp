// libFuzzer target: every public function and module of the library, driven
// with arbitrary shapes (empty batches, zero keys), lengths (negative, zero,
// huge, every integer dtype, fractions, bool, wrong shapes), dtypes, strided,
// transposed and expanded inputs, dropout, train and eval, grad modes.
//
// The contract checked: a call either returns or throws c10::Error. When it
// returns, masked positions hold exactly what they must, results are finite
// where the inputs make that possible, and backward gives finite gradients.
// Anything else (another exception, a crash, a sanitizer report, a broken
// invariant) aborts, which libFuzzer reports as a finding.
//
// Input format (fuzz/make_seeds.py writes seeds in it): the bytes are read
// front to back, one byte per choice; past the end every byte reads as 0, so
// every prefix of an input is itself an input.
//
// One file per fuzzed area (fuzz_masking.cpp, fuzz_dot_product.cpp,
// fuzz_additive.cpp, fuzz_modules.cpp, fuzz_seq2seq.cpp, fuzz_loading.cpp,
// fuzz_state_dict.cpp, fuzz_nmt_data.cpp, fuzz_heatmap.cpp, fuzz_plot.cpp), their shared helpers in
// fuzz_common.{h,cpp} (and fuzz_viz.{h,cpp} for the writers); this file is
// the entry point.

#include <d2l/backend.h>

#include <cstddef>
#include <cstdint>

#include "fuzz_common.h"
#include "fuzz_viz.h"

using d2l_fuzz::Bytes;
using d2l_fuzz::Call;
using d2l_fuzz::current;
using d2l_fuzz::fuzz_additive_module;
using d2l_fuzz::fuzz_additive_scores;
using d2l_fuzz::fuzz_dot_product_functional;
using d2l_fuzz::fuzz_dot_product_module;
using d2l_fuzz::fuzz_encoder_decoder;
using d2l_fuzz::fuzz_heatmaps;
using d2l_fuzz::fuzz_loading;
using d2l_fuzz::fuzz_masked_softmax;
using d2l_fuzz::fuzz_multi_head;
using d2l_fuzz::fuzz_nadaraya_watson;
using d2l_fuzz::fuzz_nmt_data;
using d2l_fuzz::fuzz_plot;
using d2l_fuzz::fuzz_seq2seq;
using d2l_fuzz::fuzz_sequence_mask;
using d2l_fuzz::fuzz_state_dict;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  current = Call{};
  const int64_t op = in.below(16);
  // Bit 0: the generic kernels; else bits 1 and 2 pick AVX-512, AVX2,
  // AVX512-BF16 or AMX (the bfloat16 kernel's two levels; the fuzz build
  // models the tiles in software where the CPU has none), falling back to
  // the highest level below it that this CPU runs.
  const uint8_t isa_byte = in.byte();
  constexpr d2l::CpuIsa kPicks[] = {d2l::CpuIsa::kAvx512, d2l::CpuIsa::kAvx2,
                                    d2l::CpuIsa::kAvx512Bf16, d2l::CpuIsa::kAmxBf16};
  auto isa = (isa_byte & 1) != 0 ? d2l::CpuIsa::kDefault : kPicks[(isa_byte >> 1) & 3];
  while (isa != d2l::CpuIsa::kDefault && !d2l::cpu_isa_available(isa)) {
    isa = static_cast<d2l::CpuIsa>(static_cast<int>(isa) - 1);
  }
  d2l::set_cpu_isa(isa);
  try {
    switch (op) {
      case 0: fuzz_sequence_mask(in); break;
      case 1:
      case 2: fuzz_masked_softmax(in); break;
      case 3: fuzz_dot_product_functional(in); break;
      case 4: fuzz_dot_product_module(in); break;
      case 5: fuzz_additive_scores(in); break;
      case 6: fuzz_additive_module(in); break;
      case 7: fuzz_heatmaps(in); break;
      case 8: fuzz_multi_head(in); break;
      case 9: fuzz_nadaraya_watson(in); break;
      case 10: fuzz_seq2seq(in); break;
      case 11: fuzz_encoder_decoder(in); break;
      case 12: fuzz_loading(in); break;
      case 14: fuzz_state_dict(in); break;
      case 15: fuzz_nmt_data(in); break;
      default: fuzz_plot(in); break;
    }
  } catch (const c10::Error&) {
    // The documented way to refuse an input.
  }
  return 0;
}
