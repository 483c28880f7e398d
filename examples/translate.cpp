// Translates English sentences with a model that bahdanau_fra_eng trained
// and saved (--save), with d2l::generate: batches of sentences, greedy
// decoding or beam search, n-best lists with their scores.
//
//   translate (--checkpoint FILE | --state-dict FILE) [--model bahdanau|transformer] [--data PATH]
//             [--num-hiddens N] [--input FILE] [--beam N] [--nbest N]
//             [--length-penalty A] [--max-length N] [--batch-size N] [--threads N]
//
// --state-dict reads a state dict the book's Python code saved
// (torch.save(net.state_dict()), benchmarks/book_bahdanau.py --save) instead.
// The vocabularies are rebuilt from the training data (--data, as given to
// bahdanau_fra_eng; default the sample it trains on by default), so the
// model, the data and --num-hiddens must be those of the training run.
// Sentences come one a line from --input or stdin, are preprocessed as the
// book preprocesses fra-eng (lower case, a space before punctuation), and
// stream through in batches of --batch-size: memory holds one batch. Each
// hypothesis is printed on a line of its own: the sentence's number (from
// 0), the score, the translation, separated by tabs. With --input, a
// progress line on stderr.

#include <d2l/attention.h>
#include <d2l/generate.h>
#include <torch/serialize.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"

namespace {

// bahdanau_fra_eng's recipes.
constexpr int64_t kEmbedSize = 32, kNumLayers = 2, kFfnHiddens = 64, kNumHeads = 4;
constexpr int64_t kNumSteps = 10, kNumExamples = 600;

d2l::EncoderDecoder make_net(const std::string& model, int64_t h, int64_t src_vocab,
                             int64_t tgt_vocab) {
  if (model == "transformer") {
    return d2l::EncoderDecoder{d2l::TransformerEncoder(src_vocab, h, h, h, h, {h}, h, kFfnHiddens,
                                                       kNumHeads, kNumLayers, 0.1),
                               d2l::TransformerDecoder(tgt_vocab, h, h, h, h, {h}, h, kFfnHiddens,
                                                       kNumHeads, kNumLayers, 0.1)};
  }
  return d2l::EncoderDecoder{
      d2l::Seq2SeqEncoder(src_vocab, kEmbedSize, h, kNumLayers, 0.1),
      d2l::Seq2SeqAttentionDecoder(
          d2l::Seq2SeqOptions(tgt_vocab, kEmbedSize, h, kNumLayers).dropout(0.1))};
}

// The first line of an error's message.
std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }

[[noreturn]] void fail(const std::string& message) {
  fmt::print(stderr, "translate: {}\n", message);
  std::exit(1);
}

std::vector<int64_t> source_ids(const std::string& sentence, const d2l::Vocab& vocab) {
  std::vector<std::string> words;
  std::istringstream in(d2l::preprocess_nmt(sentence));
  for (std::string word; in >> word;) words.push_back(word);
  auto ids = vocab[words];
  ids.push_back(vocab["<eos>"]);
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  std::string checkpoint, state_dict, model = "bahdanau", data = D2L_FRA_ENG_SAMPLE, input;
  int64_t num_hiddens = 32, beam = 1, nbest = 1, max_length = kNumSteps, batch_size = 64;
  int threads = 1;
  double length_penalty = 0;
  CLI::App app("Translates English sentences with a model bahdanau_fra_eng saved (d2l::generate)");
  auto* from_checkpoint =
      app.add_option("--checkpoint", checkpoint, "the model bahdanau_fra_eng --save wrote");
  auto* from_state_dict = app.add_option("--state-dict", state_dict,
                                         "a state dict the book's Python code saved (torch.save)");
  from_checkpoint->excludes(from_state_dict);
  from_state_dict->excludes(from_checkpoint);
  app.add_option("--model", model, "the model it trained")
      ->check(CLI::IsMember({"bahdanau", "transformer"}));
  app.add_option("--data", data, "the data it trained on (the vocabularies are rebuilt from it)");
  app.add_option("--num-hiddens", num_hiddens, "its --num-hiddens")->check(examples::kCount);
  app.add_option("--input", input, "sentences, one a line (default: stdin)");
  app.add_option("--beam", beam, "beam size (1: greedy decoding)")->check(examples::kCount);
  app.add_option("--nbest", nbest, "hypotheses printed per sentence (at most --beam)")
      ->check(examples::kCount);
  app.add_option("--length-penalty", length_penalty, "the book's alpha: scores log P / L^alpha")
      ->check(CLI::Range(0.0, 10.0));
  app.add_option("--max-length", max_length, "tokens generated at most, <eos> included")
      ->check(examples::kCount);
  app.add_option("--batch-size", batch_size, "sentences decoded together")->check(examples::kCount);
  app.add_option("--threads", threads, "intra-op threads")->check(examples::kCount);
  CLI11_PARSE(app, argc, argv);
  if (checkpoint.empty() && state_dict.empty()) fail("give --checkpoint or --state-dict");
  if (nbest > beam) fail(fmt::format("--nbest {} is more than --beam {}", nbest, beam));
  d2l::set_num_threads(threads);

  std::ifstream file;
  if (!input.empty()) {
    file.open(input);
    if (!file) fail(fmt::format("cannot read --input {}", input));
  }
  std::istream& in = input.empty() ? std::cin : file;
  int64_t total = 0;
  if (!input.empty()) {
    for (std::string line; std::getline(file, line);) ++total;
    file.clear();
    file.seekg(0);
  }

  d2l::NmtData vocabularies = [&] {
    try {
      return d2l::load_data_nmt(data, 1, kNumSteps, kNumExamples);
    } catch (const c10::Error& e) {
      fail(fmt::format("cannot build the vocabularies from --data {}: {}", data,
                       first_line(e.what_without_backtrace())));
    }
  }();
  const auto& src_vocab = vocabularies.src_vocab;
  const auto& tgt_vocab = vocabularies.tgt_vocab;
  auto net = make_net(model, num_hiddens, src_vocab.size(), tgt_vocab.size());
  const auto* flag = checkpoint.empty() ? "--state-dict" : "--checkpoint";
  const auto& path = checkpoint.empty() ? state_dict : checkpoint;
  {
    std::ifstream probe(path);
    if (!probe) fail(fmt::format("cannot read {} {}", flag, path));
  }
  try {
    if (checkpoint.empty()) {
      d2l::load_state_dict(*net, state_dict);
    } else {
      torch::load(net, checkpoint);
    }
  } catch (const c10::Error& e) {
    fail(
        fmt::format("{} {} is not a {} model of --num-hiddens {} over the vocabularies of --data "
                    "{} ({} and {} tokens): {}",
                    flag, path, model, num_hiddens, data, src_vocab.size(), tgt_vocab.size(),
                    first_line(e.what_without_backtrace())));
  }
  net->eval();

  auto options = d2l::GenerationOptions()
                     .start_id(tgt_vocab["<bos>"])
                     .end_id(tgt_vocab["<eos>"])
                     .pad_id(src_vocab["<pad>"])
                     .max_length(max_length)
                     .source_length(kNumSteps)
                     .beam_size(beam)
                     .num_hypotheses(nbest)
                     .length_penalty(length_penalty);
  int64_t done = 0;
  std::vector<std::vector<int64_t>> batch;
  const auto flush = [&] {
    if (batch.empty()) return;
    std::vector<d2l::GenerationResult> results;
    try {
      results = d2l::generate(*net, batch, options);
    } catch (const c10::Error& e) {
      fail(first_line(e.what_without_backtrace()));
    }
    for (size_t i = 0; i < results.size(); ++i) {
      for (const auto& h : results[i].hypotheses) {
        std::string text;
        for (const auto& token : tgt_vocab.to_tokens(h.tokens))
          text += (text.empty() ? "" : " ") + token;
        fmt::print("{}\t{:.4f}\t{}\n", done + static_cast<int64_t>(i), h.score, text);
      }
    }
    done += static_cast<int64_t>(batch.size());
    batch.clear();
    std::fflush(stdout);
    if (total > 0) {
      fmt::print(stderr, "\rtranslated {} of {} sentences", done, total);
      if (done == total) fmt::print(stderr, "\n");
    }
  };
  for (std::string line; std::getline(in, line);) {
    batch.push_back(source_ids(line, src_vocab));
    if (static_cast<int64_t>(batch.size()) == batch_size) flush();
  }
  flush();
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return 0;  // the sanitizers' leak and race reports run at exit
#else
  // Everything is written: end without the static destructors, where
  // LibTorch deregisters each of its operators (a tenth of a second).
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
#endif
}
