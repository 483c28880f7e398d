// fuzz_attention's NMT-data area: d2l::read_data_nmt on the rest of the
// input written out as fra.txt or as fra-eng.zip (the zip reader inflates
// and checks CRCs of what it is given), then the book's pipeline on what it
// returns: preprocess_nmt, tokenize_nmt, Vocab, build_array_nmt. Also
// preprocess_nmt and tokenize_nmt on the raw bytes, which need not be UTF-8.
//
// The contract: each step either throws c10::Error or returns what its
// header promises: text that is valid UTF-8 when read from a file, arrays of
// ids inside the vocabulary, valid lengths in [1, num_steps].

#include <d2l/nmt_data.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_common.h"

namespace d2l_fuzz {
namespace {

// One directory per process: libFuzzer's workers may run side by side.
std::filesystem::path scratch_dir() {
  static const auto dir = [] {
    auto d = std::filesystem::temp_directory_path() /
             ("d2l_fuzz_nmt_" + std::to_string(static_cast<long>(::getpid())));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void check_pipeline(const std::string& text, int64_t num_examples, int64_t num_steps,
                    int64_t min_freq) {
  const auto [source, target] = d2l::tokenize_nmt(text, num_examples);
  FUZZ_CHECK(source.size() == target.size(), "tokenize_nmt gave unequal sides");
  const d2l::Vocab vocab(source, min_freq, {"<pad>", "<bos>", "<eos>"});
  FUZZ_CHECK(vocab.size() >= 4, "the vocabulary lost its reserved tokens");
  if (source.empty()) return;
  const auto [array, valid_len] = d2l::build_array_nmt(source, vocab, num_steps);
  note("array", array);
  note("valid_len", valid_len);
  FUZZ_CHECK(array.size(0) == static_cast<int64_t>(source.size()) && array.size(1) == num_steps,
             "build_array_nmt gave the wrong shape");
  FUZZ_CHECK(array.min().item<int64_t>() >= 0 && array.max().item<int64_t>() < vocab.size(),
             "build_array_nmt gave an id outside the vocabulary");
  FUZZ_CHECK(valid_len.min().item<int64_t>() >= 1 && valid_len.max().item<int64_t>() <= num_steps,
             "build_array_nmt gave a valid length outside [1, num_steps]");
}

}  // namespace

void fuzz_nmt_data(Bytes& in) {
  const int64_t mode = in.below(3);
  const int64_t num_examples = in.below(8);  // 0: every line
  const int64_t num_steps = 1 + in.below(12);
  const int64_t min_freq = in.below(3);
  const std::string bytes = in.rest();
  current.description = "nmt data, mode " + std::to_string(mode) + ", num_examples " +
                        std::to_string(num_examples) + ", num_steps " + std::to_string(num_steps);
  if (mode == 0) {
    // Raw bytes straight into the text functions.
    check_pipeline(d2l::preprocess_nmt(bytes), num_examples, num_steps, min_freq);
    return;
  }
  const auto path = scratch_dir() / (mode == 1 ? "fra.txt" : "fra-eng.zip");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const std::string text = d2l::read_data_nmt(path.string());
  FUZZ_CHECK(!text.empty(), "read_data_nmt returned empty text");
  check_pipeline(d2l::preprocess_nmt(text), num_examples, num_steps, min_freq);
}

}  // namespace d2l_fuzz
