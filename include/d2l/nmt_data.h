#pragma once

// The data side of d2l's "Machine Translation and the Dataset" section
// (d2l.torch 0.17): the English-French pairs of fra-eng, their vocabularies,
// padded arrays and a shuffling mini-batch loader. Names, arguments and
// results follow the book; deliberate differences are listed with each
// function and in README ("Machine translation: the book's training API").

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace d2l {

/// The book's `Vocab(tokens, min_freq, reserved_tokens)`: `<unk>` is index 0,
/// then `reserved_tokens`, then every token seen at least `min_freq` times,
/// most frequent first (ties in order of first occurrence, as Python's stable
/// `sorted` over a `Counter`).
class Vocab {
 public:
  Vocab() : Vocab(std::vector<std::vector<std::string>>{}) {}
  explicit Vocab(const std::vector<std::vector<std::string>>& tokens, int64_t min_freq = 0,
                 const std::vector<std::string>& reserved_tokens = {});

  int64_t size() const { return static_cast<int64_t>(idx_to_token_.size()); }
  /// Index of `token`; `unk()` for a token outside the vocabulary.
  int64_t operator[](const std::string& token) const;
  std::vector<int64_t> operator[](const std::vector<std::string>& tokens) const;
  /// Token of `index`; throws c10::Error naming the index and the size when
  /// it is outside [0, size()).
  const std::string& to_tokens(int64_t index) const;
  std::vector<std::string> to_tokens(const std::vector<int64_t>& indices) const;
  static constexpr int64_t unk() { return 0; }
  /// (token, count) of every distinct token, most frequent first.
  const std::vector<std::pair<std::string, int64_t>>& token_freqs() const { return token_freqs_; }
  const std::vector<std::string>& idx_to_token() const { return idx_to_token_; }

 private:
  std::vector<std::string> idx_to_token_;
  std::unordered_map<std::string, int64_t> token_to_idx_;
  std::vector<std::pair<std::string, int64_t>> token_freqs_;
};

/// The book's `read_data_nmt`, from a path instead of a download: `path` is
/// d2l's `fra-eng.zip`, its `fra.txt`, or a directory holding either (a
/// directory `fra-eng/` inside it is looked into too). Returns the text of
/// `fra.txt`. Throws c10::Error naming the path (and the line, where there is
/// one) when the file is missing, empty, not UTF-8, or has a non-empty line
/// without a tab (the book skips such lines silently).
std::string read_data_nmt(const std::string& path);

/// The book's `preprocess_nmt`: U+202F and U+00A0 become spaces, letters are
/// lower-cased, and a space is put before `,.!?` not preceded by one.
/// Lower-casing covers ASCII, Latin-1 and Latin Extended-A (all that French
/// and English need), not the whole of Unicode as Python's `str.lower`.
std::string preprocess_nmt(const std::string& text);

/// The book's `tokenize_nmt(text, num_examples)`: lines split on the tab into
/// source and target, each split on single spaces. As in the book, reading
/// stops once the line index exceeds `num_examples` (0: all lines), so
/// `num_examples = 600` gives 601 pairs. Empty lines are skipped; a non-empty
/// line without exactly one tab throws c10::Error naming the line.
std::pair<std::vector<std::vector<std::string>>, std::vector<std::vector<std::string>>>
tokenize_nmt(const std::string& text, int64_t num_examples = 0);

/// The book's `truncate_pad(line, num_steps, padding_token)`.
std::vector<int64_t> truncate_pad(const std::vector<int64_t>& line, int64_t num_steps,
                                  int64_t padding_token);

/// The book's `build_array_nmt(lines, vocab, num_steps)`: each line's ids plus
/// `<eos>`, truncated or padded with `<pad>`; returns (array (N, num_steps)
/// int64, valid_len (N) int32: the count of non-`<pad>` ids).
std::pair<torch::Tensor, torch::Tensor> build_array_nmt(
    const std::vector<std::vector<std::string>>& lines, const Vocab& vocab, int64_t num_steps);

/// The book's `load_array(data_arrays, batch_size, is_train)`: mini-batches of
/// rows of tensors that share their first size. With `is_train`, every
/// `epoch()` is a fresh permutation (each example exactly once, the last
/// batch possibly smaller), drawn from a generator seeded with `seed`.
class ArrayLoader {
 public:
  ArrayLoader(std::vector<torch::Tensor> arrays, int64_t batch_size, bool is_train = true,
              uint64_t seed = 0);
  /// The batches of one pass; each batch holds one tensor per array.
  std::vector<std::vector<torch::Tensor>> epoch();
  int64_t num_examples() const { return num_examples_; }
  int64_t batch_size() const { return batch_size_; }
  const std::vector<torch::Tensor>& arrays() const { return arrays_; }

 private:
  std::vector<torch::Tensor> arrays_;
  int64_t batch_size_, num_examples_;
  bool is_train_;
  uint64_t seed_, epochs_ = 0;
};

/// What `load_data_nmt` returns: the book's `(data_iter, src_vocab, tgt_vocab)`.
/// Each batch of `data_iter` is (X, X_valid_len, Y, Y_valid_len).
struct NmtData {
  ArrayLoader data_iter;
  Vocab src_vocab, tgt_vocab;
};

/// The book's `load_data_nmt(batch_size, num_steps, num_examples=600)`, from
/// `path` (see `read_data_nmt`): both vocabularies with `min_freq = 2` and
/// reserved tokens `<pad>`, `<bos>`, `<eos>`; a shuffling loader seeded with `seed`.
NmtData load_data_nmt(const std::string& path, int64_t batch_size, int64_t num_steps,
                      int64_t num_examples = 600, uint64_t seed = 0);

}  // namespace d2l
