// d2l's "Bahdanau Attention" section (d2l.torch 0.17) on the book's data,
// fra-eng, with the book's recipe: embed 32, hidden 32, 2 layers, dropout
// 0.1, batch 64, 10 steps, Adam at 0.005, 250 epochs, the first 600 examples.
//
//   bahdanau_fra_eng [--data PATH] [--out DIR] [--epochs N] [--threads N] [--device cpu|cuda]
//
// PATH is d2l's fra-eng.zip, its fra.txt or a directory holding either
// (`make fra-eng` fetches it); the default is the 651-line sample shipped in
// tests/data/fra-eng-sample, which holds the book's 600 examples. Prints the
// book's lines (loss and tokens/s, four translations with BLEU) and writes
// into DIR (default ./bahdanau_out) loss.svg, the animator's curve, and
// attention.svg, the heatmap of the last sentence.

#include <d2l/attention.h>
#include <d2l/viz.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

// libgomp's threads spin between parallel regions unless told otherwise;
// on a shared machine that costs more than it gains (examples/seq2seq_attention.cpp).
void prefer_passive_openmp_waits(int, char**, char**) {
  setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0);
}
__attribute__((section(".preinit_array"),
               used)) void (*const preinit_openmp)(int, char**,
                                                   char**) = prefer_passive_openmp_waits;

constexpr int64_t kEmbedSize = 32, kNumHiddens = 32, kNumLayers = 2;
constexpr double kDropout = 0.1, kLr = 0.005;
constexpr int64_t kBatchSize = 64, kNumSteps = 10, kNumEpochs = 250, kNumExamples = 600;

struct Args {
  std::string data = D2L_FRA_ENG_SAMPLE;
  std::filesystem::path out = "bahdanau_out";
  int64_t epochs = kNumEpochs;
  int threads = 2;
  torch::Device device = torch::kCPU;
};

[[noreturn]] void usage(const char* argv0) {
  fmt::print(stderr,
             "usage: {} [--data PATH] [--out DIR] [--epochs N] [--threads N] [--device cpu|cuda]\n",
             argv0);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--data") == 0 && has_value) {
      args.data = argv[++i];
    } else if (std::strcmp(argv[i], "--out") == 0 && has_value) {
      args.out = argv[++i];
    } else if (std::strcmp(argv[i], "--epochs") == 0 && has_value) {
      args.epochs = std::atoll(argv[++i]);
      if (args.epochs <= 0) usage(argv[0]);
    } else if (std::strcmp(argv[i], "--threads") == 0 && has_value) {
      args.threads = std::atoi(argv[++i]);
      if (args.threads <= 0) usage(argv[0]);
    } else if (std::strcmp(argv[i], "--device") == 0 && has_value) {
      args.device = torch::Device(argv[++i]);
    } else {
      usage(argv[0]);
    }
  }
  return args;
}

int run(const Args& args) {
  torch::set_num_threads(args.threads);
  torch::manual_seed(0);
  std::filesystem::create_directories(args.out);
  auto data = d2l::load_data_nmt(args.data, kBatchSize, kNumSteps, kNumExamples);
  fmt::print("{}: {} examples, vocabularies of {} and {} tokens; {} threads, device {}\n",
             args.data, data.data_iter.num_examples(), data.src_vocab.size(), data.tgt_vocab.size(),
             torch::get_num_threads(), args.device.str());

  d2l::Seq2SeqEncoder encoder(data.src_vocab.size(), kEmbedSize, kNumHiddens, kNumLayers, kDropout);
  d2l::Seq2SeqAttentionDecoder decoder(
      d2l::Seq2SeqOptions(data.tgt_vocab.size(), kEmbedSize, kNumHiddens, kNumLayers)
          .dropout(kDropout));
  d2l::EncoderDecoder net(encoder, decoder);
  const auto loss_svg = (args.out / "loss.svg").string();
  d2l::train_seq2seq(*net, data.data_iter, kLr, args.epochs, data.tgt_vocab, args.device,
                     d2l::TrainSeq2SeqOptions().svg_path(loss_svg));
  fmt::print("wrote {}\n", loss_svg);

  const std::vector<std::string> engs{"go .", "i lost .", "he's calm .", "i'm home ."};
  const std::vector<std::string> fras{"va !", "j'ai perdu .", "il est calme .",
                                      "je suis chez moi ."};
  std::vector<torch::Tensor> dec_attention_weight_seq;
  for (size_t i = 0; i < engs.size(); ++i) {
    auto [translation, weights] = d2l::predict_seq2seq(
        *net, engs[i], data.src_vocab, data.tgt_vocab, kNumSteps, args.device, true);
    fmt::print("{} => {}, bleu {:.3f}\n", engs[i], translation, d2l::bleu(translation, fras[i], 2));
    dec_attention_weight_seq = std::move(weights);
  }
  // The book's heatmap of the last sentence: one row per decoding step, the
  // source's words and <eos> as columns.
  const auto attention_weights =
      torch::cat(dec_attention_weight_seq, 0).reshape({1, 1, -1, kNumSteps});
  const int64_t keys = 3 + 1;  // "i'm home ." and <eos>
  const auto heatmap = (args.out / "attention.svg").string();
  d2l::show_heatmaps(attention_weights.slice(3, 0, keys).cpu(), "Key positions", "Query positions",
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
