// d2l 1.0's "Transformers for Vision" section: the book's Vision Transformer
// trained on Fashion-MNIST with the book's recipe: images resized to 96x96,
// patch 16, 512 hidden, MLP 2048, 8 heads, 2 blocks, dropouts 0.1, SGD at
// 0.1, batch 128, 10 epochs; the book's Trainer (one SGD step a batch, the
// Classifier's cross-entropy loss and accuracy).
//
//   vit_fashion_mnist [--data DIR] [--epochs N] [--train-size N] [--val-size N]
//                     [--threads N] [--blas-threads N] [--svg FILE] [--profile]
//                     [--checkpoint FILE]
//                     [--img-size N --patch-size N --num-hiddens N --mlp-num-hiddens N
//                      --num-heads N --num-blks N]
//
// DIR holds Fashion-MNIST's four IDX files, gzipped or not (default: Debian's
// dataset-fashion-mnist, /usr/share/datasets/fashion-mnist). --train-size and
// --val-size take the first N images of each set. Prints a line every 50
// batches and per epoch, then `final val_acc A`; --svg draws the book's
// board (training loss twice an epoch, validation loss and accuracy per
// epoch), rewritten after every epoch. --profile adds where each epoch's
// time went: preparing batches, forward, backward, the SGD step, validation.
// --checkpoint saves the model, the optimizer, the random state and the
// board after every epoch (atomically: a new file, then a rename) and, when
// the file exists at the start, resumes after its last epoch: the run then
// continues with the same shuffles and dropout draws as one uninterrupted
// run. A checkpoint written by another recipe (sizes, subsets, lr) is an
// error; --epochs may grow.
// The size flags are for short runs and tests; the defaults are the book's.
// docs/vit.md has the recipe, the results and the speed.

#include <d2l/backend.h>
#include <d2l/v1.h>
#include <d2l/viz.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>
#include <CLI/CLI.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cli.h"

namespace {

struct Args {
  std::string data;  // FashionMNISTOptions' default
  int64_t epochs = 10, train_size = -1, val_size = -1;  // -1: all
  int threads = 2, blas_threads = 0;
  std::string svg, checkpoint;
  bool profile = false;
  int64_t batch_size = 128, img_size = 96, patch_size = 16, num_hiddens = 512,
          mlp_num_hiddens = 2048, num_heads = 8, num_blks = 2;
  double emb_dropout = 0.1, blk_dropout = 0.1, lr = 0.1;
};

Args parse(int argc, char** argv) {
  Args args;
  CLI::App app{"d2l 1.0's Vision Transformer on Fashion-MNIST, the book's recipe"};
  app.add_option("--data", args.data,
                 "folder of Fashion-MNIST's IDX files, .gz or not (default: $D2L_FASHION_MNIST, "
                 "else /usr/share/datasets/fashion-mnist)");
  app.add_option("--epochs", args.epochs, "training epochs (the book's: 10)")
      ->check(examples::kCount);
  app.add_option("--train-size", args.train_size, "the first N training images (default: all)")
      ->check(examples::kCount);
  app.add_option("--val-size", args.val_size, "the first N test images (default: all)")
      ->check(examples::kCount);
  app.add_option("--threads", args.threads, "ATen's threads (default 2)")->check(examples::kCount);
  app.add_option("--blas-threads", args.blas_threads,
                 "OpenBLAS's threads, where LibTorch calls OpenBLAS (default: --threads)")
      ->check(examples::kCount);
  app.add_option("--svg", args.svg, "draw the loss and accuracy here");
  app.add_flag("--profile", args.profile, "print where each epoch's time went");
  app.add_option("--checkpoint", args.checkpoint,
                 "save here after every epoch; resume from here when the file exists");
  app.add_option("--batch-size", args.batch_size, "images a batch (the book's: 128)")
      ->check(examples::kCount);
  app.add_option("--img-size", args.img_size, "resize the images to N x N (the book's: 96)")
      ->check(examples::kCount);
  app.add_option("--patch-size", args.patch_size, "the book's: 16")->check(examples::kCount);
  app.add_option("--num-hiddens", args.num_hiddens, "the book's: 512")->check(examples::kCount);
  app.add_option("--mlp-num-hiddens", args.mlp_num_hiddens, "the book's: 2048")
      ->check(examples::kCount);
  app.add_option("--num-heads", args.num_heads, "the book's: 8")->check(examples::kCount);
  app.add_option("--num-blks", args.num_blks, "the book's: 2")->check(examples::kCount);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  if (args.blas_threads == 0) args.blas_threads = args.threads;
  return args;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Where an epoch's time went (--profile).
struct Phases {
  double batches = 0, forward = 0, backward = 0, step = 0, validation = 0;
  std::string line(double total) const {
    const auto pct = [&](double s) { return 100.0 * s / total; };
    return fmt::format(
        "  time: batches {:.1f} s ({:.0f}%), forward {:.1f} s ({:.0f}%), backward {:.1f} s "
        "({:.0f}%), SGD step {:.1f} s ({:.0f}%), validation {:.1f} s ({:.0f}%)",
        batches, pct(batches), forward, pct(forward), backward, pct(backward), step, pct(step),
        validation, pct(validation));
  }
};

// The book's board: the training loss twice an epoch, the validation loss
// and accuracy once, against the epoch.
struct Board {
  d2l::Series train_loss{{}, {}, "train_loss", "b-"};
  d2l::Series val_loss{{}, {}, "val_loss", "m--"};
  d2l::Series val_acc{{}, {}, "val_acc", "g-."};
  // f(name, series) for each series, by the name a checkpoint stores it under.
  template <typename Self, typename F>
  static void each(Self& board, F f) {
    f("train_loss", board.train_loss);
    f("val_loss", board.val_loss);
    f("val_acc_curve", board.val_acc);
  }
  void save(const std::string& path, int64_t epochs) const {
    d2l::save_plot({train_loss, val_loss, val_acc},
                   d2l::PlotOptions().xlabel("epoch").xlim(std::make_pair(0.0, double(epochs))),
                   path);
  }
};

// The recipe a checkpoint belongs to: everything that shapes the model, the
// data or the optimizer (not --epochs, which a resumed run may raise).
torch::Tensor recipe_of(const Args& a, int64_t train_images, int64_t val_images) {
  return torch::tensor(std::vector<double>{
      double(a.batch_size), double(a.img_size), double(a.patch_size), double(a.num_hiddens),
      double(a.mlp_num_hiddens), double(a.num_heads), double(a.num_blks), a.emb_dropout,
      a.blk_dropout, a.lr, double(train_images), double(val_images)},
      torch::kFloat64);
}
const char* const kRecipeNames =
    "batch_size, img_size, patch_size, num_hiddens, mlp_num_hiddens, num_heads, num_blks, "
    "emb_dropout, blk_dropout, lr, training images, validation images";

torch::Tensor to_tensor(const std::vector<double>& v) {
  return torch::tensor(v, torch::kFloat64);
}
std::vector<double> to_vector(const torch::Tensor& t) {
  const auto c = t.to(torch::kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

torch::Tensor read_tensor(torch::serialize::InputArchive& archive, const std::string& key,
                          const std::string& path) {
  torch::Tensor t;
  TORCH_CHECK(archive.try_read(key, t), "vit_fashion_mnist: checkpoint ", path, " has no '",
              key, "': not a checkpoint of this program");
  return t;
}

// Everything a resumed run needs, written to `path` through a temporary file
// and a rename, so that an interrupted write leaves the previous checkpoint.
void save_checkpoint(const std::string& path, const torch::Tensor& recipe, int64_t epochs_done,
                     double val_acc, const Board& board, d2l::v1::ViT& model,
                     torch::optim::Optimizer& optim) {
  torch::serialize::OutputArchive archive, model_archive, optim_archive;
  model->save(model_archive);
  optim.save(optim_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optim_archive);
  archive.write("recipe", recipe);
  archive.write("epochs_done", torch::tensor(epochs_done));
  archive.write("val_acc", torch::tensor(val_acc, torch::kFloat64));
  archive.write("rng", at::detail::getDefaultCPUGenerator().get_state());
  Board::each(board, [&](const char* name, const d2l::Series& s) {
    archive.write(std::string(name) + ".x", to_tensor(s.x));
    archive.write(std::string(name) + ".y", to_tensor(s.y));
  });
  const std::string tmp = path + ".tmp";
  archive.save_to(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    TORCH_CHECK(false, "vit_fashion_mnist: cannot rename ", tmp, " to ", path);
  }
}

// Restores a checkpoint into the model, the optimizer, the board and the
// default generator; returns the epochs it holds. The loader's shuffles are
// replayed by the caller.
int64_t load_checkpoint(const std::string& path, const torch::Tensor& recipe, double& val_acc,
                        Board& board, d2l::v1::ViT& model, torch::optim::Optimizer& optim) {
  torch::serialize::InputArchive archive, model_archive, optim_archive;
  archive.load_from(path);
  const auto saved = read_tensor(archive, "recipe", path);
  if (!saved.sizes().equals(recipe.sizes()) || !torch::equal(saved, recipe)) {
    TORCH_CHECK(false, "vit_fashion_mnist: checkpoint ", path,
                " was written by another recipe: (", kRecipeNames, ") = ",
                fmt::format("{}", fmt::join(to_vector(saved), ", ")), " there, ",
                fmt::format("{}", fmt::join(to_vector(recipe), ", ")),
                " here; remove the file or run with its recipe");
  }
  TORCH_CHECK(archive.try_read("model", model_archive) &&
                  archive.try_read("optimizer", optim_archive),
              "vit_fashion_mnist: checkpoint ", path, " has no model or optimizer");
  model->load(model_archive);
  optim.load(optim_archive);
  val_acc = read_tensor(archive, "val_acc", path).item<double>();
  Board::each(board, [&](const char* name, d2l::Series& s) {
    s.x = to_vector(read_tensor(archive, std::string(name) + ".x", path));
    s.y = to_vector(read_tensor(archive, std::string(name) + ".y", path));
  });
  at::Generator generator = at::detail::getDefaultCPUGenerator();  // shares the state
  generator.set_state(read_tensor(archive, "rng", path));
  return read_tensor(archive, "epochs_done", path).item<int64_t>();
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
#if defined(__GLIBC__)
  // The MLP's activations, (128 * 37, 2048) floats, are above glibc's largest
  // mmap threshold (32 MiB): each batch would map them afresh and fault in
  // every page (a tenth of the CPU time on 2 cores). Keep such blocks in
  // the heap and the freed memory in the process instead.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  d2l::set_num_threads(args.threads, args.blas_threads);
  torch::manual_seed(0);
  const auto t0 = Clock::now();
  const d2l::v1::FashionMNIST data(args.batch_size, {args.img_size, args.img_size},
                                   d2l::v1::FashionMNISTOptions()
                                       .root(args.data)
                                       .train_size(args.train_size)
                                       .val_size(args.val_size));
  fmt::print("Fashion-MNIST from {}: {} training and {} validation images, resized to {}x{}; "
             "{} threads (BLAS {})\n",
             data.root(), *data.train.size(), *data.val.size(), args.img_size, args.img_size,
             args.threads, args.blas_threads);
  std::fflush(stdout);

  // The book's lines.
  d2l::v1::ViT model(args.img_size, args.patch_size, args.num_hiddens, args.mlp_num_hiddens,
                     args.num_heads, args.num_blks, args.emb_dropout, args.blk_dropout, args.lr);
  auto optim = model->configure_optimizers();  // Trainer.fit, before the first batch

  Board board;
  double val_acc = 0;
  auto train_loader = data.train_dataloader();
  const int64_t num_batches = train_loader.size();
  const auto recipe = recipe_of(args, *data.train.size(), *data.val.size());
  int64_t first_epoch = 0;
  if (!args.checkpoint.empty() && std::ifstream(args.checkpoint).good()) {
    first_epoch = load_checkpoint(args.checkpoint, recipe, val_acc, board, model, optim);
    // The shuffles of the epochs done, drawn again from the loader's own
    // generator, so that the next epoch gets the permutation it would have.
    for (int64_t e = 0; e < first_epoch; ++e) train_loader.begin();
    fmt::print("resumed from {} after epoch {} (val_acc {:.4f})\n", args.checkpoint,
               first_epoch, val_acc);
    std::fflush(stdout);
  }
  for (int64_t epoch = first_epoch; epoch < args.epochs; ++epoch) {
    const auto start = Clock::now();
    Phases phases;
    model->train();
    double half_loss = 0, epoch_loss = 0;
    int64_t half_count = 0, seen = 0, batch = 0;
    auto tick = Clock::now();
    for (auto& example : train_loader) {
      const auto& X = example.data;
      const auto& y = example.target;
      phases.batches += seconds_since(tick);
      tick = Clock::now();
      auto loss = model->loss(model(X), y);
      phases.forward += seconds_since(tick);
      tick = Clock::now();
      optim.zero_grad();
      loss.backward();
      phases.backward += seconds_since(tick);
      tick = Clock::now();
      optim.step();
      phases.step += seconds_since(tick);
      const double l = loss.item<double>();
      half_loss += l * y.size(0);
      epoch_loss += l * y.size(0);
      half_count += y.size(0);
      seen += y.size(0);
      ++batch;
      if (batch % 50 == 0) {
        fmt::print("  epoch {} batch {}/{}: loss {:.4f}, {:.1f} images/s\n", epoch + 1, batch,
                   num_batches, l, seen / seconds_since(start));
        std::fflush(stdout);
      }
      if (batch == num_batches / 2 || batch == num_batches) {
        board.train_loss.x.push_back(epoch + double(batch) / num_batches);
        board.train_loss.y.push_back(half_loss / half_count);
        half_loss = 0;
        half_count = 0;
      }
      tick = Clock::now();
    }
    const double train_seconds = seconds_since(start);
    tick = Clock::now();
    model->eval();
    double val_loss = 0, correct = 0;
    int64_t n = 0;
    {
      torch::NoGradGuard no_grad;
      for (auto& example : data.val_dataloader()) {
        const auto& X = example.data;
        const auto& y = example.target;
        const auto Y_hat = model(X);
        val_loss += model->loss(Y_hat, y).item<double>() * y.size(0);
        correct += model->accuracy(Y_hat, y).item<double>() * y.size(0);
        n += y.size(0);
      }
    }
    phases.validation = seconds_since(tick);
    val_acc = correct / n;
    board.val_loss.x.push_back(epoch + 1);
    board.val_loss.y.push_back(val_loss / n);
    board.val_acc.x.push_back(epoch + 1);
    board.val_acc.y.push_back(val_acc);
    const double total = seconds_since(start);
    fmt::print("epoch {}/{}: train_loss {:.4f}, val_loss {:.4f}, val_acc {:.4f}, {:.1f} s "
               "({:.1f} training images/s)\n",
               epoch + 1, args.epochs, epoch_loss / seen, val_loss / n, val_acc, total,
               seen / train_seconds);
    if (args.profile) fmt::print("{}\n", phases.line(total));
    if (!args.svg.empty()) board.save(args.svg, args.epochs);
    if (!args.checkpoint.empty()) {
      save_checkpoint(args.checkpoint, recipe, epoch + 1, val_acc, board, model, optim);
    }
    std::fflush(stdout);
  }
  fmt::print("final val_acc {:.4f}\n", val_acc);
  fmt::print("{} epochs in {:.1f} s\n", args.epochs - first_epoch, seconds_since(t0));
  if (!args.svg.empty()) fmt::print("wrote {}\n", args.svg);
  return 0;
} catch (const c10::Error& e) {
  fmt::print(stderr, "error: {}\n", e.what_without_backtrace());
  return 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
