// A program that links d2l::train and nothing else of the library: it trains
// the book's Bahdanau model a few epochs on the shipped fra-eng sample and
// exits 0 only if the loss fell, prediction and BLEU ran, and d2l::viz was
// not loaded with it (so that a link dependency of d2l::train on the
// plotting library cannot come back unnoticed). libxml2 is no sign: Debian's
// LibTorch loads it through its own dependencies.
#include <d2l/attention.h>
#include <d2l/train.h>

#include <link.h>

#include <iostream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> loaded_libraries() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name && *info->dlpi_name)
          static_cast<std::vector<std::string>*>(out)->push_back(info->dlpi_name);
        return 0;
      },
      &names);
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " <fra-eng folder (fra.txt)>\n";
    return 2;
  }
  bool ok = true;
  bool found_attention = false;
  for (const auto& name : loaded_libraries()) {
    if (name.find("d2l_viz") != std::string::npos) {
      std::cerr << "train_only: " << name << " was loaded; d2l::train must not need it\n";
      ok = false;
    }
    if (name.find("d2l_attention") != std::string::npos) found_attention = true;
  }
#ifdef D2L_LINK_CLOSURE
  // The main build's list of the d2l targets this program links, directly or
  // through others (tests/CMakeLists.txt).
  const std::string closure = D2L_LINK_CLOSURE;
  std::cout << "train_only: links " << closure << '\n';
  if (closure.find("viz") != std::string::npos) {
    std::cerr << "train_only: d2l::viz is in the link closure; d2l::train must not need it\n";
    ok = false;
  }
#endif
  torch::manual_seed(0);
  auto data = d2l::load_data_nmt(argv[1], 16, 8, 160);
  d2l::Seq2SeqEncoder encoder(data.src_vocab.size(), 16, 16, 1, 0.0);
  d2l::EncoderDecoder net(
      encoder, d2l::Seq2SeqAttentionDecoder(d2l::Seq2SeqOptions(data.tgt_vocab.size(), 16, 16, 1)));
  int64_t epochs_seen = 0;
  const auto result =
      d2l::train_seq2seq(net, data.data_iter, 0.01, 6, data.tgt_vocab, torch::kCPU,
                         d2l::TrainSeq2SeqOptions().on_step(nullptr).on_epoch(
                             [&](const d2l::EpochStats& e) { epochs_seen = e.epoch; }));
  const auto translation =
      d2l::predict_seq2seq(net, "go .", data.src_vocab, data.tgt_vocab, 8, torch::kCPU).first;
  const double score = d2l::bleu(translation, "va !", 1);
  std::cout << "train_only: loss " << result.losses.front() << " -> " << result.losses.back()
            << " in " << epochs_seen << " epochs; 'go .' => '" << translation << "' (bleu " << score
            << ")" << (found_attention ? "" : "; d2l_attention linked statically") << '\n';
  if (!(result.losses.back() < 0.9 * result.losses.front()) || epochs_seen != 6 ||
      !(score >= 0 && score <= 1)) {
    std::cerr << "train_only: the loss did not fall by a tenth in 6 epochs\n";
    ok = false;
  }
  return ok ? 0 : 1;
}
