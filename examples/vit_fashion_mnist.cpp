// d2l 1.0's "Transformers for Vision" section: the book's Vision Transformer
// trained on Fashion-MNIST with the book's recipe: images resized to 96x96,
// patch 16, 512 hidden, MLP 2048, 8 heads, 2 blocks, dropouts 0.1, SGD at
// 0.1, batch 128, 10 epochs; the book's Trainer (one SGD step a batch, the
// Classifier's cross-entropy loss and accuracy).
//
//   vit_fashion_mnist [--data DIR] [--epochs N] [--train-size N] [--val-size N]
//                     [--threads N] [--blas-threads N] [--svg FILE] [--profile]
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
// The size flags are for short runs and tests; the defaults are the book's.
// docs/vit.md has the recipe, the results and the speed.

#include <d2l/backend.h>
#include <d2l/v1.h>
#include <d2l/viz.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <utility>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli.h"

namespace {

struct Args {
  std::string data;  // FashionMNISTOptions' default
  int64_t epochs = 10, train_size = -1, val_size = -1;  // -1: all
  int threads = 2, blas_threads = 0;
  std::string svg;
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
  void save(const std::string& path, int64_t epochs) const {
    d2l::save_plot({train_loss, val_loss, val_acc},
                   d2l::PlotOptions().xlabel("epoch").xlim(std::make_pair(0.0, double(epochs))),
                   path);
  }
};

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
  for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
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
    std::fflush(stdout);
  }
  fmt::print("final val_acc {:.4f}\n", val_acc);
  fmt::print("{} epochs in {:.1f} s\n", args.epochs, seconds_since(t0));
  if (!args.svg.empty()) fmt::print("wrote {}\n", args.svg);
  return 0;
} catch (const c10::Error& e) {
  fmt::print(stderr, "error: {}\n", e.what_without_backtrace());
  return 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
