// d2l's "Bahdanau Attention" section in C++, on a translation task that needs
// attention: the target is the source read backwards, every word mapped to its
// upper-case counterpart ("b a c" -> "C A B"), with 20 to 30 words a sentence.
// The first target word depends on the last source word, which a decoder
// reading one fixed context vector must carry through the whole sentence.
//
//   seq2seq_attention [--out DIR] [--epochs N] [--threads N] [--device cpu|cuda] [--save PATH]
//   seq2seq_attention --translate PATH "w o r d s ..." [--device cpu|cuda]
//
// Trains Seq2SeqEncoder + Seq2SeqAttentionDecoder, then the plain Seq2SeqDecoder
// on the same data, reports the held-out BLEU of both, and writes into DIR
// (default ./seq2seq_out) loss_curves.svg and alignment.svg, the attention
// weights of one held-out sentence. --save writes the attention model;
// --translate loads one and translates a sentence given on the command line.
//
// Runs on 2 threads by default, with OpenMP threads that sleep rather than
// spin while they wait for work (OMP_WAIT_POLICY=passive, unless the
// environment sets it). Where other programs keep the cores busy, --threads 1
// is faster: every parallel region then waits for its second thread to be
// scheduled (on a loaded 2-core machine an epoch took 194 s on 2 threads and
// 27 s on 1).

#include <d2l/attention.h>
#include <d2l/viz.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cli.h"

namespace {

using Sentence = std::vector<std::string>;
using d2l::Vocab;

// The model of the book's section, wider for 30-word sentences. The checkpoint
// stores parameters only, so --translate rebuilds the model from these.
constexpr int64_t kEmbedSize = 32, kNumHiddens = 64, kNumLayers = 2;
constexpr double kDropout = 0.1, kLearningRate = 0.005;
constexpr int64_t kBatchSize = 64, kNumSteps = 32;
constexpr int kDefaultEpochs = 20, kTrainPairs = 3000, kHeldOutPairs = 200;
constexpr int kMinWords = 20, kMaxWords = 30, kBleuK = 4;
constexpr uint64_t kSeed = 42;

struct Args {
  std::filesystem::path out = "seq2seq_out";
  int epochs = kDefaultEpochs;
  int threads = 2;
  torch::Device device = torch::kCPU;
  std::string save, translate_model, translate_sentence;
};

Args parse(int argc, char** argv) {
  Args args;
  std::string device = "cpu";
  std::vector<std::string> translate;
  CLI::App app(
      "The book's Bahdanau attention against the plain seq2seq decoder on a generated reversal "
      "task: BLEU of both, loss curves, an alignment heatmap. Threads: --threads sizes ATen's "
      "and OpenBLAS's pools (d2l::set_num_threads); on a machine other programs keep busy, "
      "OMP_WAIT_POLICY=passive stops OpenMP's threads spinning between regions (make seq2seq "
      "sets it).");
  app.add_option("--out", args.out, "where the pictures go")->capture_default_str();
  app.add_option("--epochs", args.epochs, "training epochs")
      ->check(examples::kCount)
      ->capture_default_str();
  app.add_option("--threads", args.threads, "ATen's threads (OpenBLAS's: 1)")
      ->check(examples::kCount)
      ->capture_default_str();
  app.add_option("--device", device, "cpu or cuda")
      ->check(examples::kDevice)
      ->capture_default_str();
  app.add_option("--save", args.save, "write the trained attention model here");
  app.add_option("--translate", translate,
                 "translate SENTENCE (space-separated letters) with the model saved at PATH")
      ->expected(2)
      ->type_name("PATH SENTENCE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  args.device = torch::Device(device);
  if (!translate.empty()) {
    args.translate_model = translate[0];
    args.translate_sentence = translate[1];
  }
  return args;
}

// The synthetic language: the source alphabet is a..x; a target sentence is
// the source reversed and upper-cased.
struct Language {
  std::vector<std::string> source_words, target_words;
  Vocab source_vocab, target_vocab;
};

Language make_language() {
  Language lang;
  for (char c = 'a'; c <= 'x'; ++c) {
    lang.source_words.emplace_back(1, c);
    lang.target_words.emplace_back(1, static_cast<char>(c - 'a' + 'A'));
  }
  // Each word once: equal counts keep the order given, so the same alphabet
  // always gives the same indices and a saved model needs no vocabulary file.
  const std::vector<std::string> reserved{"<pad>", "<bos>", "<eos>"};
  lang.source_vocab = Vocab({lang.source_words}, 0, reserved);
  lang.target_vocab = Vocab({lang.target_words}, 0, reserved);
  return lang;
}

Sentence translate_exactly(const Sentence& source) {
  Sentence target;
  for (auto it = source.rbegin(); it != source.rend(); ++it) {
    target.emplace_back(1, static_cast<char>((*it)[0] - 'a' + 'A'));
  }
  return target;
}

std::pair<std::vector<Sentence>, std::vector<Sentence>> make_pairs(const Language& lang, int count,
                                                                   std::mt19937_64& rng) {
  std::uniform_int_distribution<int> length(kMinWords, kMaxWords);
  std::uniform_int_distribution<size_t> word(0, lang.source_words.size() - 1);
  std::vector<Sentence> sources, targets;
  for (int i = 0; i < count; ++i) {
    Sentence source(length(rng));
    for (auto& w : source) w = lang.source_words[word(rng)];
    targets.push_back(translate_exactly(source));
    sources.push_back(std::move(source));
  }
  return {std::move(sources), std::move(targets)};
}

d2l::EncoderDecoder make_model(const Language& lang, bool attention) {
  d2l::Seq2SeqEncoder encoder(lang.source_vocab.size(), kEmbedSize, kNumHiddens, kNumLayers,
                              kDropout);
  const auto options =
      d2l::Seq2SeqOptions(lang.target_vocab.size(), kEmbedSize, kNumHiddens, kNumLayers)
          .dropout(kDropout);
  if (attention) return d2l::EncoderDecoder(encoder, d2l::Seq2SeqAttentionDecoder(options));
  return d2l::EncoderDecoder(encoder, d2l::Seq2SeqDecoder(options));
}

struct Result {
  std::vector<double> losses;
  double train_seconds = 0, mean_bleu = 0, eval_seconds = 0;
};

Result train_and_evaluate(const char* name, d2l::EncoderDecoder& model, const Language& lang,
                          const d2l::ArrayLoader& train,
                          const std::vector<Sentence>& held_out_sources,
                          const std::vector<Sentence>& held_out_targets, const Args& args) {
  fmt::print("== {} ==\n", name);
  Result result;
  const auto start = std::chrono::steady_clock::now();
  // A fresh copy of the loader: both models see the same batches.
  auto loader = train;
  result.losses =
      d2l::train_seq2seq(model, loader, kLearningRate, args.epochs, lang.target_vocab, args.device)
          .losses;
  const auto trained = std::chrono::steady_clock::now();
  result.train_seconds = std::chrono::duration<double>(trained - start).count();

  double total = 0;
  for (size_t i = 0; i < held_out_sources.size(); ++i) {
    const auto source = fmt::format("{}", fmt::join(held_out_sources[i], " "));
    const auto translation = d2l::predict_seq2seq(model, source, lang.source_vocab,
                                                  lang.target_vocab, kNumSteps, args.device)
                                 .first;
    const double score =
        d2l::bleu(translation, fmt::format("{}", fmt::join(held_out_targets[i], " ")), kBleuK);
    total += score;
    if (i < 3) fmt::print("{} => {}, bleu {:.3f}\n", source, translation, score);
  }
  result.mean_bleu = total / static_cast<double>(held_out_sources.size());
  result.eval_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - trained).count();
  fmt::print(
      "{}: held-out mean BLEU-{} {:.3f} over {} sentences; training {:.1f} s, "
      "evaluation {:.1f} s\n\n",
      name, kBleuK, result.mean_bleu, held_out_sources.size(), result.train_seconds,
      result.eval_seconds);
  return result;
}

d2l::Series loss_series(const Result& result, const std::string& label) {
  d2l::Series series;
  for (size_t epoch = 0; epoch < result.losses.size(); ++epoch) {
    series.x.push_back(static_cast<double>(epoch + 1));
    series.y.push_back(result.losses[epoch]);
  }
  series.label = label;
  return series;
}

void draw_alignment(d2l::EncoderDecoder& model, const Language& lang, const Sentence& source,
                    const Args& args) {
  const auto prediction = d2l::predict_seq2seq(model, fmt::format("{}", fmt::join(source, " ")),
                                               lang.source_vocab, lang.target_vocab, kNumSteps,
                                               args.device, /*save_attention_weights=*/true);
  // One row per predicted token (and the <eos> step), one column per source
  // token and its <eos>, as the book's heatmap of one sentence.
  const auto source_len = static_cast<int64_t>(source.size()) + 1;
  const auto weights = torch::cat(prediction.second, 0).slice(1, 0, source_len).cpu();
  const auto path = (args.out / "alignment.svg").string();
  d2l::show_heatmaps(weights.reshape({1, 1, weights.size(0), weights.size(1)}), "Key positions",
                     "Query positions", path, {}, {6.0, 6.0});
  fmt::print("wrote {} (attention of \"{}\")\n", path, fmt::join(source, " "));
}

int translate(const Args& args) {
  const auto lang = make_language();
  auto model = make_model(lang, /*attention=*/true);
  torch::load(model, args.translate_model);
  model->to(args.device);
  const auto source = d2l::tokenize_nmt(args.translate_sentence + "\t").first;
  for (const auto& word : source.at(0)) {
    if (lang.source_vocab[word] == Vocab::unk()) {
      fmt::print(stderr, "note: \"{}\" is not a source word (a..x); it reads as <unk>\n", word);
    }
  }
  fmt::print("{}\n", d2l::predict_seq2seq(model, args.translate_sentence, lang.source_vocab,
                                          lang.target_vocab, kNumSteps, args.device)
                         .first);
  return 0;
}

int run(const Args& args) {
  d2l::set_num_threads(args.threads);  // ATen's pool; OpenBLAS's at 1 thread
  torch::manual_seed(kSeed);
  if (!args.translate_model.empty()) return translate(args);
  std::filesystem::create_directories(args.out);

  const auto lang = make_language();
  // The held-out pairs are later draws of the same generator: with 24^20 or
  // more sentences of each length, none repeats a training one.
  std::mt19937_64 rng(kSeed);
  const auto [train_sources, train_targets] = make_pairs(lang, kTrainPairs, rng);
  const auto [held_out_sources, held_out_targets] = make_pairs(lang, kHeldOutPairs, rng);
  const auto [source_array, source_valid_len] =
      d2l::build_array_nmt(train_sources, lang.source_vocab, kNumSteps);
  const auto [target_array, target_valid_len] =
      d2l::build_array_nmt(train_targets, lang.target_vocab, kNumSteps);
  d2l::ArrayLoader train({source_array, source_valid_len, target_array, target_valid_len},
                         kBatchSize, /*is_train=*/true, kSeed);
  fmt::print(
      "{} training and {} held-out pairs of {}-{} words; vocabularies of {} and {} "
      "tokens; {} threads, device {}\n\n",
      kTrainPairs, kHeldOutPairs, kMinWords, kMaxWords, lang.source_vocab.size(),
      lang.target_vocab.size(), torch::get_num_threads(), args.device.str());

  auto attention = make_model(lang, /*attention=*/true);
  const auto with_attention = train_and_evaluate("Seq2SeqAttentionDecoder", attention, lang, train,
                                                 held_out_sources, held_out_targets, args);
  auto plain = make_model(lang, /*attention=*/false);
  const auto without = train_and_evaluate("Seq2SeqDecoder", plain, lang, train, held_out_sources,
                                          held_out_targets, args);

  fmt::print("held-out BLEU-{}: attention {:.3f}, plain {:.3f} ({} epochs each)\n", kBleuK,
             with_attention.mean_bleu, without.mean_bleu, args.epochs);
  const auto curves = (args.out / "loss_curves.svg").string();
  d2l::save_plot({loss_series(with_attention, "Seq2SeqAttentionDecoder"),
                  loss_series(without, "Seq2SeqDecoder")},
                 d2l::PlotOptions().xlabel("epoch").ylabel("loss").figsize({5.0, 3.0}), curves);
  fmt::print("wrote {}\n", curves);
  if (!args.save.empty()) {
    torch::save(attention, args.save);
    fmt::print("saved the attention model to {}\n", args.save);
  }
  draw_alignment(attention, lang, held_out_sources[0], args);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const c10::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
  }
  return 1;
}
