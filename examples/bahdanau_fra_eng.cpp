// d2l's "Bahdanau Attention" section (d2l.torch 0.17) on the book's data,
// fra-eng, with the book's recipe: embed 32, hidden 32, 2 layers, dropout
// 0.1, batch 64, 10 steps, Adam at 0.005, 250 epochs, the first 600 examples.
// With --model transformer, its "Transformer" section instead: 32 hidden,
// 2 layers, FFN 64, 4 heads, dropout 0.1, batch 64, 10 steps, Adam at 0.005,
// 200 epochs.
//
//   bahdanau_fra_eng [--model bahdanau|transformer] [--data PATH] [--out DIR] [--epochs N]
//                    [--threads N] [--device cpu|cuda] [--dtype float32|bfloat16]
//                    [--no-master-weights]
//                    [--batch-size N] [--num-hiddens N] [--save FILE] [--spawn N | --world-size N
//                    --rank R
//                    (--master ADDR:PORT | --file-store PATH)] [--dist-timeout SECONDS]
//
// PATH is d2l's fra-eng.zip, its fra.txt or a directory holding either
// (`make fra-eng` fetches it); the default is the 651-line sample shipped in
// tests/data/fra-eng-sample, which holds the book's 600 examples. Prints the
// book's lines (loss and tokens/s, four translations with BLEU) and writes
// into DIR (default ./bahdanau_out or ./transformer_out) loss.svg, the
// animator's curve, and the attention heatmaps of the last sentence:
// attention.svg (Bahdanau), or the Transformer's per layer and head,
// encoder_attention.svg, decoder_self_attention.svg and
// decoder_attention.svg (encoder-decoder), with the tokens as tick labels. --save writes the trained
// model (torch::save of its parameters, written whole or not at all).
//
// --dtype bfloat16 trains in bfloat16 (TrainSeq2SeqOptions::dtype): the
// net's weights, activations and gradients, with float32 master weights that
// Adam updates, and translates with those; --no-master-weights lets Adam
// update the bfloat16 weights themselves, and translates in bfloat16.
//
// Data-parallel (with d2l::distributed): `--spawn N` starts N processes on
// this machine over loopback; on several machines start one process per rank
// with the same --world-size and --master (rank 0's address, where rank 0
// listens), or with torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set.
// Each rank trains on its share of every batch; rank 0 alone prints, draws
// and saves. Without --threads each process takes nproc / (local processes)
// threads.

#include <d2l/attention.h>
#include <d2l/viz.h>
#ifdef D2L_HAVE_DISTRIBUTED
#include <d2l/distributed.h>
#endif
#include <torch/serialize.h>
#include <torch/utils.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <array>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"

namespace {

constexpr int64_t kEmbedSize = 32, kNumHiddens = 32, kNumLayers = 2;
constexpr double kDropout = 0.1, kLr = 0.005;
constexpr int64_t kBatchSize = 64, kNumSteps = 10, kNumEpochs = 250, kNumExamples = 600;
// The Transformer section's recipe.
constexpr int64_t kTransformerEpochs = 200, kFfnHiddens = 64, kNumHeads = 4;

struct Args {
  std::string model = "bahdanau";
  std::string data = D2L_FRA_ENG_SAMPLE;
  std::filesystem::path out;
  int64_t epochs = 0;
  int threads = 0;
  torch::Device device = torch::kCPU;
  std::optional<torch::Dtype> dtype;  // unset: float32, as the net is built
  bool master_weights = true;
  std::string save, load, expect;
  int64_t batch_size = kBatchSize, num_hiddens = kNumHiddens;
#ifdef D2L_HAVE_DISTRIBUTED
  d2l::distributed::LaunchOptions launch;
  std::vector<std::string> child_args;  // for --spawn: all but --spawn N
#endif
};

Args parse(int argc, char** argv) {
  Args args;
  std::vector<std::string> rest(argv + 1, argv + argc);
#ifdef D2L_HAVE_DISTRIBUTED
  // The launcher's flags are LaunchOptions'; the children of --spawn get
  // every other flag again.
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == "--spawn") {
      ++i;
    } else {
      args.child_args.push_back(rest[i]);
    }
  }
  try {
    args.launch = d2l::distributed::LaunchOptions::parse(rest);
  } catch (const c10::Error& e) {
    fmt::print(stderr, "{}\nRun with --help for more information.\n", e.what_without_backtrace());
    std::exit(2);
  }
#endif
  std::string device = "cpu", dtype = "float32";
  bool no_master_weights = false;
  CLI::App app(
      "The book's Bahdanau attention section on fra-eng (its recipe: 250 epochs, 600 examples): "
      "loss, tokens/s, four translations with BLEU, the loss curve and an attention heatmap. "
      "On a machine other programs keep busy, OMP_WAIT_POLICY=passive stops OpenMP's threads "
      "spinning between regions (make bahdanau sets it).");
  app.add_option("--model", args.model,
                 "bahdanau (the book's Bahdanau section) or transformer (its Transformer section)")
      ->check(CLI::IsMember({"bahdanau", "transformer"}))
      ->capture_default_str();
  app.add_option("--data", args.data, "fra-eng.zip, its fra.txt, or a folder holding either")
      ->capture_default_str();
  app.add_option("--out", args.out, "where the pictures go (default: ./<model>_out)");
  app.add_option("--epochs", args.epochs, "training epochs (default: the book's, 250 or 200)")
      ->check(examples::kCount);
  app.add_option("--threads", args.threads,
                 "ATen's threads (OpenBLAS's: 1); default: the cores shared among the local "
                 "processes")
      ->check(examples::kCount);
  app.add_option("--device", device, "cpu or cuda")
      ->check(examples::kDevice)
      ->capture_default_str();
  app.add_option("--dtype", dtype,
                 "the dtype of training: float32, or bfloat16 (with float32 master weights)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  app.add_flag("--no-master-weights", no_master_weights,
               "with --dtype bfloat16: Adam updates the bfloat16 weights themselves");
  app.add_option("--batch-size", args.batch_size, "examples a batch")
      ->check(examples::kCount)
      ->capture_default_str();
  app.add_option("--num-hiddens", args.num_hiddens, "hidden units")
      ->check(examples::kCount)
      ->capture_default_str();
  app.add_option("--save", args.save, "write the trained model here");
  app.add_option("--load", args.load,
                 "translate with the weights of this state dict instead of training (one that "
                 "the book's Python model saved with torch.save(net.state_dict()))");
  app.add_option("--expect", args.expect,
                 "a file of the four translations, one a line (Python's, say): exit 1 unless "
                 "ours are the same");
#ifdef D2L_HAVE_DISTRIBUTED
  app.footer(
      "Data-parallel training (d2l::distributed):\n"
      "  --spawn N                  N processes on this machine\n"
      "  --world-size N --rank R    this process's place in a group of N\n"
      "  --master ADDR:PORT         where rank 0 hosts the store (or --file-store PATH)\n"
      "  --dist-timeout SECONDS     rendezvous and collectives (default 60)\n"
      "  --backend gloo|nccl|auto   --tcp-store auto|libuv|classic\n"
      "torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are read too.");
#endif
  std::reverse(rest.begin(), rest.end());  // CLI11 takes the arguments last first
  try {
    app.parse(rest);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  args.device = torch::Device(device);
  if (dtype == "bfloat16") args.dtype = torch::kBFloat16;
  args.master_weights = !no_master_weights;
  const bool transformer = args.model == "transformer";
  if (args.out.empty()) args.out = args.model + "_out";
  if (args.epochs == 0) args.epochs = transformer ? kTransformerEpochs : kNumEpochs;
  if (args.threads == 0) {
    // A share of the machine per local process (torchrun's LOCAL_WORLD_SIZE).
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    const int processes = local ? std::max(1, std::atoi(local)) : 1;
    args.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / processes);
  }
  return args;
}

// The Bahdanau section's model, or the Transformer section's.
d2l::EncoderDecoder make_net(const Args& args, int64_t src_vocab, int64_t tgt_vocab) {
  const int64_t h = args.num_hiddens;
  if (args.model == "transformer") {
    return d2l::EncoderDecoder{
        d2l::TransformerEncoder(src_vocab, h, h, h, h, {h}, h, kFfnHiddens, kNumHeads, kNumLayers,
                                kDropout),
        d2l::TransformerDecoder(tgt_vocab, h, h, h, h, {h}, h, kFfnHiddens, kNumHeads, kNumLayers,
                                kDropout)};
  }
  return d2l::EncoderDecoder{
      d2l::Seq2SeqEncoder(src_vocab, kEmbedSize, h, kNumLayers, kDropout),
      d2l::Seq2SeqAttentionDecoder(
          d2l::Seq2SeqOptions(tgt_vocab, kEmbedSize, h, kNumLayers).dropout(kDropout))};
}

// The words of a sentence, as predict_seq2seq splits it.
std::vector<std::string> split_words(const std::string& sentence) {
  std::vector<std::string> words;
  std::istringstream in(sentence);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// Whether `translations` are the lines of `path`, token for token; prints each.
bool same_as_expected(const std::vector<std::string>& translations, const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in, "bahdanau_fra_eng: cannot read --expect ", path);
  size_t same = 0;
  for (const auto& ours : translations) {
    std::string theirs;
    std::getline(in, theirs);
    const bool match = split_words(ours) == split_words(theirs);
    same += match ? 1 : 0;
    fmt::print("{} {} (expected: {})\n", match ? "same:" : "DIFFERENT:", ours, theirs);
  }
  fmt::print("{} of {} translations as in {}\n", same, translations.size(), path);
  return same == translations.size();
}

// The tokens of a sentence as the heatmaps' tick labels: the source's words
// and <eos> (keys), and each decoding step's input, <bos> then the tokens
// predicted before it (queries).
struct SentenceTokens {
  std::vector<std::string> source, steps;
};

// The Transformer section's heatmaps of the last sentence, one per layer
// (rows) and head (columns): the encoder's self-attention over the source,
// the decoder's self-attention over the steps so far and its attention over
// the source at each decoding step (each step's
// TransformerDecoder::block_attention_weights(), (num_heads, 1, keys) per
// block, as the book's predict_seq2seq keeps them).
void draw_transformer_attention(d2l::EncoderDecoderImpl& net,
                                const std::vector<std::array<std::vector<torch::Tensor>, 2>>& steps,
                                const SentenceTokens& tokens, const std::filesystem::path& out) {
  std::vector<std::string> titles;
  for (int64_t i = 1; i <= kNumHeads; ++i) titles.push_back(fmt::format("Head {}", i));
  const auto draw = [&](const torch::Tensor& weights, const std::vector<std::string>& keys,
                        const std::vector<std::string>& queries, const char* name) {
    const auto path = (out / name).string();
    d2l::save_heatmaps(weights.cpu(),
                       d2l::HeatmapOptions()
                           .xlabel("Keys")
                           .ylabel("Queries")
                           .titles(titles)
                           .figsize({7.0, 3.5})
                           .xticklabels(keys)
                           .yticklabels(queries),
                       path);
    fmt::print("wrote {}\n", path);
  };
  const auto n_src = static_cast<int64_t>(tokens.source.size());
  auto& encoder = dynamic_cast<d2l::TransformerEncoderImpl&>(*net.encoder);
  const auto enc = torch::cat(encoder.attention_weights(), 0)
                       .reshape({kNumLayers, kNumHeads, -1, kNumSteps})
                       .slice(2, 0, n_src)
                       .slice(3, 0, n_src);
  draw(enc, tokens.source, tokens.source, "encoder_attention.svg");
  // Step t's self-attention sees the t + 1 steps so far: zeros after them.
  const auto n_steps = static_cast<int64_t>(steps.size());
  auto self = torch::zeros({kNumLayers, kNumHeads, n_steps, n_steps});
  auto inter = torch::zeros({kNumLayers, kNumHeads, n_steps, n_src});
  for (int64_t t = 0; t < n_steps; ++t) {
    for (int64_t l = 0; l < kNumLayers; ++l) {
      self.select(0, l).select(1, t).narrow(1, 0, t + 1).copy_(steps[t][0][l].select(1, 0));
      inter.select(0, l).select(1, t).copy_(steps[t][1][l].select(1, 0).narrow(1, 0, n_src));
    }
  }
  draw(self, tokens.steps, tokens.steps, "decoder_self_attention.svg");
  draw(inter, tokens.source, tokens.steps, "decoder_attention.svg");
}

int run(const Args& args) {
#ifdef D2L_HAVE_DISTRIBUTED
  if (args.launch.spawn() > 0) {
    const auto result = d2l::distributed::spawn_local(
        "", args.child_args,
        d2l::distributed::SpawnOptions()
            .world_size(args.launch.spawn())
            .tcp_store(args.launch.tcp_store())  // the store this process hosts
            .grace(args.launch.timeout() + std::chrono::seconds(10)));
    for (size_t r = 0; r < result.exit_codes.size(); ++r) {
      if (result.exit_codes[r] != 0) {
        fmt::print(stderr, "rank {} exited with status {}\n", r, result.exit_codes[r]);
      }
    }
    for (auto r : result.killed_ranks) fmt::print(stderr, "rank {} was killed\n", r);
    return result.exit_code;
  }
  d2l::distributed::GroupPtr group;
  if (args.launch.distributed()) {
    group = d2l::distributed::init_process_group(args.launch, args.device);
  }
  const bool leader = args.launch.rank() == 0;
#else
  const bool leader = true;
#endif
  // OpenBLAS runs its own thread pool, sized from OPENBLAS_NUM_THREADS or
  // else every core, whatever torch::set_num_threads says. This model's
  // matrix products are small: on 2 cores at 2 threads, a 2-thread pool ran
  // at about 1,500-2,000 examples/s, a 1-thread pool at 4,500-5,000 (ATen's
  // own threads do the parallel work), and processes sharing a machine would
  // each run a pool over all of it. d2l::set_num_threads sizes ATen's pool
  // and gives OpenBLAS's 1 thread.
  d2l::set_num_threads(args.threads);
  torch::manual_seed(0);
  if (leader) std::filesystem::create_directories(args.out);
  auto data = d2l::load_data_nmt(args.data, args.batch_size, kNumSteps, kNumExamples);
  if (leader) {
    fmt::print("{}: {} examples, vocabularies of {} and {} tokens; {} threads, device {}{}\n",
               args.data, data.data_iter.num_examples(), data.src_vocab.size(),
               data.tgt_vocab.size(), torch::get_num_threads(), args.device.str(),
               !args.dtype           ? ""
               : args.master_weights ? ", bfloat16 with float32 master weights"
                                     : ", bfloat16 weights");
  }

  auto net = make_net(args, data.src_vocab.size(), data.tgt_vocab.size());
  if (!args.load.empty()) {
    // Key for key, the book's names: encoder.blks.block0.attention.W_q.weight, ...
    d2l::load_state_dict(*net, args.load);
    if (leader) fmt::print("loaded {} (no training)\n", args.load);
  } else {
    const auto loss_svg = (args.out / "loss.svg").string();
    const auto train_options = d2l::TrainSeq2SeqOptions()
                                   .on_epoch(d2l::save_loss_curve(loss_svg))
                                   .dtype(args.dtype)
                                   .master_weights(args.master_weights);
    d2l::TrainSeq2SeqResult trained;
#ifdef D2L_HAVE_DISTRIBUTED
    if (group) {
      trained = d2l::distributed::train_seq2seq(net, data.data_iter, kLr, args.epochs,
                                                data.tgt_vocab, args.device, group, train_options);
    } else
#endif
    {
      trained = d2l::train_seq2seq(net, data.data_iter, kLr, args.epochs, data.tgt_vocab,
                                   args.device, train_options);
    }
    if (!leader) return 0;
    // Every epoch sees every example once: the median epoch's rate.
    auto seconds = trained.epoch_seconds;
    std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
    fmt::print("{:.1f} examples/sec (median of {} epochs; {:.1f} in the last)\n",
               static_cast<double>(data.data_iter.num_examples()) / seconds[seconds.size() / 2],
               seconds.size(), trained.examples_per_sec);
    fmt::print("wrote {}\n", loss_svg);
  }
  if (!leader) return 0;
  if (!args.save.empty()) {
#ifdef D2L_HAVE_DISTRIBUTED
    d2l::distributed::save_checkpoint(*net, args.save);
#else
    torch::save(net, args.save);
#endif
    fmt::print("wrote {}\n", args.save);
  }

  const std::vector<std::string> engs{"go .", "i lost .", "he's calm .", "i'm home ."};
  const std::vector<std::string> fras{"va !", "j'ai perdu .", "il est calme .",
                                      "je suis chez moi ."};
  std::vector<std::string> translations;
  std::vector<torch::Tensor> dec_attention_weight_seq;
  std::vector<std::array<std::vector<torch::Tensor>, 2>> dec_blocks;
  SentenceTokens tokens;
  auto* transformer = dynamic_cast<d2l::TransformerDecoderImpl*>(net->decoder.get());
  for (size_t i = 0; i < engs.size(); ++i) {
    dec_blocks.clear();
    tokens = {split_words(engs[i]), {"<bos>"}};
    tokens.source.push_back("<eos>");
    auto [translation, weights] = d2l::predict_seq2seq(
        net, engs[i], data.src_vocab, data.tgt_vocab, kNumSteps, args.device, true,
        [&](int64_t, int64_t token) {
          if (transformer != nullptr) dec_blocks.push_back(transformer->block_attention_weights());
          tokens.steps.push_back(data.tgt_vocab.to_tokens(token));
        });
    fmt::print("{} => {}, bleu {:.3f}\n", engs[i], translation, d2l::bleu(translation, fras[i], 2));
    translations.push_back(translation);
    dec_attention_weight_seq = std::move(weights);
  }
  if (!args.expect.empty() && !same_as_expected(translations, args.expect)) return 1;
  tokens.steps.pop_back();  // the last step's output is no step's input
  if (transformer != nullptr) {
    draw_transformer_attention(*net, dec_blocks, tokens, args.out);
    return 0;
  }
  // The book's heatmap of the last sentence: one row per decoding step, the
  // source's words and <eos> as columns.
  const auto keys = static_cast<int64_t>(tokens.source.size());
  const auto attention_weights =
      torch::cat(dec_attention_weight_seq, 0).reshape({1, 1, -1, kNumSteps});
  const auto heatmap = (args.out / "attention.svg").string();
  d2l::save_heatmaps(attention_weights.slice(3, 0, keys).cpu(),
                     d2l::HeatmapOptions()
                         .xlabel("Keys")
                         .ylabel("Queries")
                         .xticklabels(tokens.source)
                         .yticklabels(tokens.steps),
                     heatmap);
  fmt::print("wrote {}\n", heatmap);
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
