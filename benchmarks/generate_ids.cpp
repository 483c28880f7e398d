// The library's side of benchmarks/ct2_table.py: the book's (0.17)
// Transformer of a given size, weights from a state dict the book's Python
// code saved, decodes sources given as token ids with d2l::generate, as one
// process.
//
//   generate_ids --state-dict FILE --vocab-size V --num-hiddens H --num-heads N
//                --ffn-hiddens F --blocks B --input FILE [--beam K] [--batch-size N]
//                [--max-length N] [--threads N]
//
// --input has one source a line, token ids separated by spaces, the <eos>
// included. The ids <pad> 1, <bos> 2, <eos> 3 are those of
// benchmarks/ct2_table.py (d2l's Vocab puts <unk> first). stdout: the best
// hypothesis of each source, one a line, ids without the final <eos>.
// stderr: one JSON line, {"sentences", "tokens" (generated, the <eos>s not
// counted), "load_s" (building the model and reading the weights),
// "decode_s" (d2l::generate over the whole input), "peak_rss_bytes" (the
// process's resident high-water mark, VmHWM; 0 where /proc has none)}.

#include <d2l/attention.h>
#include <d2l/generate.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kPad = 1, kBos = 2, kEos = 3;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// VmHWM of /proc/self/status in bytes (not getrusage's ru_maxrss, which a
// child inherits from its parent across fork and exec), 0 if absent.
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string state_dict, input;
  int64_t vocab = 0, h = 32, heads = 4, ffn = 64, blocks = 2, beam = 1, batch_size = 32;
  int64_t max_length = 10;
  int threads = 1;
  CLI::App app("Decodes token ids with the book's Transformer and d2l::generate");
  app.add_option("--state-dict", state_dict, "the book's Python model, torch.save(state_dict)")
      ->required();
  app.add_option("--vocab-size", vocab, "source and target vocabulary")->required();
  app.add_option("--num-hiddens", h, "num_hiddens");
  app.add_option("--num-heads", heads, "num_heads");
  app.add_option("--ffn-hiddens", ffn, "ffn_num_hiddens");
  app.add_option("--blocks", blocks, "encoder and decoder blocks (each)");
  app.add_option("--input", input, "sources: token ids, one source a line")->required();
  app.add_option("--beam", beam, "beam size (1: greedy)");
  app.add_option("--batch-size", batch_size, "sources decoded together (max_batch_size)");
  app.add_option("--max-length", max_length, "tokens generated at most, <eos> included");
  app.add_option("--threads", threads, "intra-op threads");
  CLI11_PARSE(app, argc, argv);
  d2l::set_num_threads(threads);

  std::vector<std::vector<int64_t>> sources;
  {
    std::ifstream in(input);
    if (!in) {
      fmt::print(stderr, "generate_ids: cannot read --input {}\n", input);
      return 1;
    }
    for (std::string line; std::getline(in, line);) {
      std::istringstream words(line);
      sources.emplace_back();
      for (int64_t id = 0; words >> id;) sources.back().push_back(id);
    }
  }

  const auto load_start = std::chrono::steady_clock::now();
  d2l::EncoderDecoder net{
      d2l::TransformerEncoder(vocab, h, h, h, h, {h}, h, ffn, heads, blocks, 0.0),
      d2l::TransformerDecoder(vocab, h, h, h, h, {h}, h, ffn, heads, blocks, 0.0)};
  d2l::load_state_dict(*net, state_dict);
  net->eval();
  const double load_s = seconds_since(load_start);

  const auto options = d2l::GenerationOptions()
                           .start_id(kBos)
                           .end_id(kEos)
                           .pad_id(kPad)
                           .max_length(max_length)
                           .beam_size(beam)
                           .max_batch_size(batch_size);
  const auto decode_start = std::chrono::steady_clock::now();
  const auto results = d2l::generate(*net, sources, options);
  const double decode_s = seconds_since(decode_start);

  int64_t tokens = 0;
  std::string out;
  for (const auto& r : results) {
    const auto& best = r.hypotheses.front().tokens;
    tokens += static_cast<int64_t>(best.size());
    out += fmt::format("{}\n", fmt::join(best, " "));
  }
  std::fputs(out.c_str(), stdout);
  fmt::print(stderr,
             "{{\"sentences\": {}, \"tokens\": {}, \"load_s\": {:.6f}, \"decode_s\": {:.6f}, "
             "\"peak_rss_bytes\": {}}}\n",
             sources.size(), tokens, load_s, decode_s, peak_rss_bytes());
  // Everything is written: end without the static destructors, where
  // LibTorch deregisters each of its operators (a tenth of a second).
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}
