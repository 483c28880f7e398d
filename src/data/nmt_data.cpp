#include <d2l/nmt_data.h>

#include "checks.h"
#include "serialize/zip.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/types.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string_view>

namespace d2l {

namespace {

constexpr const char* kRead = "d2l::read_data_nmt";

}  // namespace

Vocab::Vocab(const std::vector<std::vector<std::string>>& tokens, int64_t min_freq,
             const std::vector<std::string>& reserved_tokens) {
  std::unordered_map<std::string, size_t> position;  // token -> index in token_freqs_
  for (const auto& line : tokens) {
    for (const auto& token : line) {
      const auto [it, inserted] = position.emplace(token, token_freqs_.size());
      if (inserted) token_freqs_.emplace_back(token, 0);
      ++token_freqs_[it->second].second;
    }
  }
  std::stable_sort(token_freqs_.begin(), token_freqs_.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  auto add = [this](const std::string& token) {
    if (token_to_idx_.emplace(token, size()).second) idx_to_token_.push_back(token);
  };
  add("<unk>");
  for (const auto& token : reserved_tokens) add(token);
  for (const auto& [token, freq] : token_freqs_) {
    if (freq < min_freq) break;
    add(token);
  }
}

int64_t Vocab::operator[](const std::string& token) const {
  const auto it = token_to_idx_.find(token);
  return it == token_to_idx_.end() ? unk() : it->second;
}

std::vector<int64_t> Vocab::operator[](const std::vector<std::string>& tokens) const {
  std::vector<int64_t> ids;
  ids.reserve(tokens.size());
  for (const auto& token : tokens) ids.push_back((*this)[token]);
  return ids;
}

const std::string& Vocab::to_tokens(int64_t index) const {
  TORCH_CHECK(index >= 0 && index < size(),
              fmt::format("d2l::Vocab::to_tokens: index {} is outside the vocabulary of size {}",
                          index, size()));
  return idx_to_token_[static_cast<size_t>(index)];
}

std::vector<std::string> Vocab::to_tokens(const std::vector<int64_t>& indices) const {
  std::vector<std::string> tokens;
  tokens.reserve(indices.size());
  for (const auto index : indices) tokens.push_back(to_tokens(index));
  return tokens;
}

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  TORCH_CHECK(false, fmt::format("{}: {}: {}", kRead, path, what));
}

// Where fra.txt or fra-eng.zip is, given the file or a directory that holds
// it (directly or in fra-eng/).
std::filesystem::path locate(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path, "no such file or directory");
  if (!fs::is_directory(path, ec)) return path;
  for (const char* candidate : {"fra.txt", "fra-eng/fra.txt", "fra-eng.zip"}) {
    const auto p = fs::path(path) / candidate;
    if (fs::is_regular_file(p, ec)) return p;
  }
  fail(path, "the directory holds neither fra.txt, fra-eng/fra.txt nor fra-eng.zip");
}

// The entry ".../fra.txt" of d2l's fra-eng.zip (stored or deflated), through
// the library's one zip reader.
std::string read_fra_txt(const std::string& bytes, const std::string& path) {
  const serialize::Source source{kRead, path};
  const serialize::ZipReader zip(bytes, source, serialize::ZipMethods::kStoredOrDeflated);
  for (const auto& e : zip.entries()) {
    const auto& n = e.name;
    if (n != "fra.txt" && (n.size() < 8 || n.compare(n.size() - 8, 8, "/fra.txt") != 0)) continue;
    // d2l's fra.txt is 11 MB; a size past 1 GiB is a corrupt or hostile header.
    if (e.size > (uint64_t{1} << 30)) {
      fail(path, fmt::format("fra.txt in the archive claims {} bytes, more than 1 GiB", e.size));
    }
    return std::string(zip.read(e));
  }
  fail(path, "the archive holds no fra.txt");
}

// The 1-based line of the first byte that is not part of valid UTF-8, or 0.
int64_t first_invalid_utf8_line(std::string_view s) {
  int64_t line = 1;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    if (len == 0 || (len == 2 && c < 0xC2) || i + len > s.size()) return line;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return line;
    }
    if (c == '\n') ++line;
    i += len;
  }
  return 0;
}

}  // namespace

std::string read_data_nmt(const std::string& path) {
  const auto file = locate(path);
  const auto shown = file.string();
  if (const auto why = detail::unreadable_file_reason(shown); !why.empty()) {
    fail(shown, fmt::format("cannot be read: it {}", why));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(shown, "cannot be opened");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  if (file.extension() == ".zip") text = read_fra_txt(text, shown);
  if (text.empty()) fail(shown, "the file is empty");
  if (const auto line = first_invalid_utf8_line(text)) {
    fail(shown, fmt::format("line {} is not UTF-8", line));
  }
  int64_t line = 1;
  for (size_t start = 0; start < text.size(); ++line) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view l(text.data() + start, end - start);
    if (!l.empty() && l != "\r" && l.find('\t') == std::string_view::npos) {
      fail(shown, fmt::format("line {} has no tab between source and target: \"{}\"", line,
                              l.substr(0, 60)));
    }
    start = end + 1;
  }
  return text;
}

namespace {

// UTF-8 code point at s[i], its length in `len` (input already checked or
// passed through as is when not valid).
uint32_t decode(const std::string& s, size_t i, size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) {
    return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F);
  };
  if (c >= 0xC2 && c < 0xE0 && i + 1 < s.size()) {
    len = 2;
    return ((c & 0x1Fu) << 6) | cont(1);
  }
  if (c >= 0xE0 && c < 0xF0 && i + 2 < s.size()) {
    len = 3;
    return ((c & 0x0Fu) << 12) | (cont(1) << 6) | cont(2);
  }
  len = 1;
  return c;
}

void encode(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t lower(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;  // Latin-1
  if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
    const bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    if (odd_upper ? (cp % 2 == 1) : (cp % 2 == 0)) return cp + 1;  // Latin Extended-A
  }
  if (cp == 0x178) return 0xFF;  // Ÿ
  return cp;
}

}  // namespace

std::string preprocess_nmt(const std::string& text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  char prev = '\0';
  for (size_t i = 0; i < text.size();) {
    size_t len = 1;
    uint32_t cp = decode(text, i, len);
    if (len == 1 && static_cast<unsigned char>(text[i]) >= 0x80) {
      out += text[i];  // not UTF-8: passed through unchanged
      prev = text[i];
      ++i;
      continue;
    }
    if (cp == 0x202F || cp == 0xA0) cp = ' ';
    cp = lower(cp);
    if (i > 0 && std::strchr(",.!?", static_cast<int>(cp)) != nullptr && cp != 0 && prev != ' ') {
      out += ' ';
    }
    const size_t before = out.size();
    encode(cp, out);
    prev = out[before];
    i += len;
  }
  return out;
}

namespace {

std::vector<std::string> split_spaces(std::string_view s) {
  std::vector<std::string> words;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(' ', start);
    words.emplace_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return words;
    start = end + 1;
  }
}

}  // namespace

std::pair<std::vector<std::vector<std::string>>, std::vector<std::vector<std::string>>>
tokenize_nmt(const std::string& text, int64_t num_examples) {
  TORCH_CHECK(
      num_examples >= 0,
      fmt::format("d2l::tokenize_nmt: num_examples must be >= 0 (0: all), got {}", num_examples));
  std::vector<std::vector<std::string>> source, target;
  int64_t i = 0;
  for (size_t start = 0; start <= text.size(); ++i) {
    if (num_examples > 0 && i > num_examples) break;
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t tab = line.find('\t');
    TORCH_CHECK(tab != std::string_view::npos && line.find('\t', tab + 1) == std::string_view::npos,
                fmt::format("d2l::tokenize_nmt: line {} must hold one tab between source and "
                            "target, got \"{}\"",
                            i + 1, line.substr(0, 60)));
    source.push_back(split_spaces(line.substr(0, tab)));
    target.push_back(split_spaces(line.substr(tab + 1)));
  }
  return {std::move(source), std::move(target)};
}

std::vector<int64_t> truncate_pad(const std::vector<int64_t>& line, int64_t num_steps,
                                  int64_t padding_token) {
  TORCH_CHECK(num_steps >= 0,
              fmt::format("d2l::truncate_pad: num_steps must be >= 0, got {}", num_steps));
  std::vector<int64_t> out(
      line.begin(), line.begin() + std::min<int64_t>(num_steps, static_cast<int64_t>(line.size())));
  out.resize(static_cast<size_t>(num_steps), padding_token);
  return out;
}

std::pair<torch::Tensor, torch::Tensor> build_array_nmt(
    const std::vector<std::vector<std::string>>& lines, const Vocab& vocab, int64_t num_steps) {
  TORCH_CHECK(num_steps > 0,
              fmt::format("d2l::build_array_nmt: num_steps must be positive, got {}", num_steps));
  const int64_t pad = vocab["<pad>"], eos = vocab["<eos>"];
  TORCH_CHECK(pad != Vocab::unk() && eos != Vocab::unk(),
              "d2l::build_array_nmt: the vocabulary must hold the reserved tokens <pad> and "
              "<eos>, got a vocabulary without ",
              pad == Vocab::unk() ? "<pad>" : "<eos>");
  std::vector<int64_t> ids;
  ids.reserve(lines.size() * static_cast<size_t>(num_steps));
  for (const auto& line : lines) {
    auto row = vocab[line];
    row.push_back(eos);
    const auto padded = truncate_pad(row, num_steps, pad);
    ids.insert(ids.end(), padded.begin(), padded.end());
  }
  auto array =
      torch::tensor(ids, torch::kLong).reshape({static_cast<int64_t>(lines.size()), num_steps});
  auto valid_len = (array != pad).to(torch::kInt).sum(1).to(torch::kInt);
  return {array, valid_len};
}

ArrayLoader::ArrayLoader(std::vector<torch::Tensor> arrays, int64_t batch_size, bool is_train,
                         uint64_t seed)
    : arrays_(std::move(arrays)),
      batch_size_(batch_size),
      num_examples_(0),
      is_train_(is_train),
      seed_(seed) {
  TORCH_CHECK(batch_size > 0,
              fmt::format("d2l::ArrayLoader: batch_size must be positive, got {}", batch_size));
  TORCH_CHECK(!arrays_.empty(), "d2l::ArrayLoader: arrays must hold at least one tensor, got none");
  for (size_t i = 0; i < arrays_.size(); ++i) {
    TORCH_CHECK(arrays_[i].defined() && arrays_[i].dim() >= 1,
                fmt::format("d2l::ArrayLoader: arrays[{}] must be a tensor of rank >= 1", i));
    TORCH_CHECK(arrays_[i].size(0) == arrays_[0].size(0),
                fmt::format("d2l::ArrayLoader: every array must have {} rows (as arrays[0]), got "
                            "{} in arrays[{}]",
                            arrays_[0].size(0), arrays_[i].size(0), i));
  }
  num_examples_ = arrays_[0].size(0);
}

std::vector<std::vector<torch::Tensor>> ArrayLoader::epoch() {
  std::vector<int64_t> order(static_cast<size_t>(num_examples_));
  std::iota(order.begin(), order.end(), 0);
  if (is_train_) {
    // One generator per epoch, seeded from (seed, epoch): the same loader gives
    // the same batches whatever else draws random numbers.
    std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                      static_cast<uint32_t>(epochs_)};
    std::mt19937_64 rng(seq);
    std::shuffle(order.begin(), order.end(), rng);
  }
  ++epochs_;
  std::vector<std::vector<torch::Tensor>> batches;
  for (int64_t first = 0; first < num_examples_; first += batch_size_) {
    const auto last = std::min(num_examples_, first + batch_size_);
    const auto index = torch::tensor(
        std::vector<int64_t>(order.begin() + first, order.begin() + last), torch::kLong);
    std::vector<torch::Tensor> batch;
    for (const auto& a : arrays_) batch.push_back(a.index_select(0, index));
    batches.push_back(std::move(batch));
  }
  return batches;
}

NmtData load_data_nmt(const std::string& path, int64_t batch_size, int64_t num_steps,
                      int64_t num_examples, uint64_t seed) {
  const auto text = preprocess_nmt(read_data_nmt(path));
  const auto [source, target] = tokenize_nmt(text, num_examples);
  const std::vector<std::string> reserved{"<pad>", "<bos>", "<eos>"};
  Vocab src_vocab(source, 2, reserved), tgt_vocab(target, 2, reserved);
  auto [src_array, src_valid_len] = build_array_nmt(source, src_vocab, num_steps);
  auto [tgt_array, tgt_valid_len] = build_array_nmt(target, tgt_vocab, num_steps);
  ArrayLoader data_iter({src_array, src_valid_len, tgt_array, tgt_valid_len}, batch_size,
                        /*is_train=*/true, seed);
  return NmtData{std::move(data_iter), std::move(src_vocab), std::move(tgt_vocab)};
}

}  // namespace d2l
