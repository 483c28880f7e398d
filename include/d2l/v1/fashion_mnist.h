#pragma once

// d2l 1.0's Fashion-MNIST (section "The Image Classification Dataset"):
// `FashionMNIST(batch_size=64, resize=(28, 28))` with its `train` and `val`
// datasets, `text_labels`, `get_dataloader`, `train_dataloader` and
// `val_dataloader`. The IDX files are read by LibTorch's own
// torch::data::datasets::MNIST once this library has checked them; images
// are resized per batch exactly as the book's torchvision transform
// (`Resize(resize)` on PIL images, then `ToTensor()`) does (docs/data.md).

#include <torch/arg.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>
#include <torch/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace d2l::v1 {

/// What the book's `FashionMNIST` takes from its base class `DataModule`, and
/// what a C++ program needs besides.
struct FashionMNISTOptions {
  /// The folder holding the four IDX files, gzipped
  /// (`{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`, as Debian's
  /// dataset-fashion-mnist and the dataset's authors ship them) or not (as
  /// torchvision's `FashionMNIST/raw/` holds them). Empty: the environment
  /// variable D2L_FASHION_MNIST, else /usr/share/datasets/fashion-mnist.
  TORCH_ARG(std::string, root) = "";
  /// Where gzipped files are decompressed, once, for MNIST to read. Empty:
  /// $XDG_CACHE_HOME/d2l/fashion-mnist, else $HOME/.cache/d2l/fashion-mnist,
  /// else d2l-fashion-mnist in the system's temporary folder.
  TORCH_ARG(std::string, cache_dir) = "";
  /// Keep only the first `train_size` training images (-1: all 60000).
  TORCH_ARG(int64_t, train_size) = -1;
  /// Keep only the first `val_size` validation images (-1: all 10000).
  TORCH_ARG(int64_t, val_size) = -1;
  /// Seed of the generator that shuffles the training loaders.
  TORCH_ARG(uint64_t, seed) = 0;
};

/// One split of Fashion-MNIST with the book's transform: an image is
/// (1, H, W) float32 in [0, 1], resized from 28 x 28 to `resize` = (H, W) as
/// torchvision's `Resize` on a PIL image followed by `ToTensor` (equal to
/// it, value for value); a label is an int64 scalar in 0..9. The images are
/// kept as the file's bytes (N x 28 x 28 uint8) and resized only when a
/// batch is asked for, so that memory does not grow with `resize`.
/// A torch::data batch dataset: `torch::data::make_data_loader` takes it.
class FashionMNISTDataset
    : public torch::data::datasets::BatchDataset<FashionMNISTDataset, torch::data::Example<>> {
 public:
  /// `images`: (N, 1, h, w) uint8 (any h, w); `targets`: (N) int64.
  FashionMNISTDataset(torch::Tensor images, torch::Tensor targets,
                      std::array<int64_t, 2> resize = {28, 28});

  /// The book's `data.train[i]`: {image (1, H, W), label}. Throws c10::Error
  /// naming the index and the size when `index` is outside the dataset.
  torch::data::Example<> get(size_t index) const;
  /// The examples at `indices`, stacked: data (B, 1, H, W), target (B).
  torch::data::Example<> get_batch(c10::ArrayRef<size_t> indices) override;
  /// The same on a const dataset.
  torch::data::Example<> batch(c10::ArrayRef<size_t> indices) const;
  /// The book's `len(data.train)`.
  torch::optional<size_t> size() const override;

  /// The images as stored, before the transform: (N, 1, h, w) uint8.
  const torch::Tensor& images() const { return images_; }
  /// The labels: (N) int64.
  const torch::Tensor& targets() const { return targets_; }
  std::array<int64_t, 2> resize() const { return resize_; }

 private:
  // One axis's resampling (Note [Resizing as the book does] in
  // src/data/fashion_mnist.cpp): output pixel j sums the input pixels from
  // first[j] on, times weights[j] in fixed point. Undefined where the size stays.
  struct Taps {
    torch::Tensor first;    // (to) int64
    torch::Tensor weights;  // (to, taps) int64
  };

  torch::Tensor images_, targets_;
  std::array<int64_t, 2> resize_;
  Taps rows_, columns_;
};

/// The book's `torch.utils.data.DataLoader(data, batch_size, shuffle=train)`:
/// batches of `batch_size` (the last one smaller, as with `drop_last=False`),
/// each a torch::data::Example with `data` (B, 1, H, W) float32 and `target`
/// (B) int64. With `shuffle`, every `begin()` (every epoch) draws a fresh
/// permutation from `generator`; without, the examples come in order.
/// `size()` is the number of batches, the book's `len(dataloader)`.
class FashionMNISTLoader {
 public:
  using Batch = torch::data::Example<>;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    Batch& operator*() { return batch_; }
    Batch* operator->() { return &batch_; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return index_ == other.index_; }
    bool operator!=(const Iterator& other) const { return index_ != other.index_; }

   private:
    friend class FashionMNISTLoader;
    Iterator(std::shared_ptr<const FashionMNISTDataset> dataset, int64_t batch_size,
             std::shared_ptr<const std::vector<size_t>> order, int64_t index);
    void load();

    // Shared, so that an iterator outlives its loader: `auto it =
    // data.train_dataloader().begin();` is the book's next(iter(...)).
    std::shared_ptr<const FashionMNISTDataset> dataset_;
    int64_t batch_size_, batches_;
    std::shared_ptr<const std::vector<size_t>> order_;
    int64_t index_;
    Batch batch_;
  };

  /// A loader drawing its permutations from `generator` (a CPU generator;
  /// copies of an at::Generator share its state).
  FashionMNISTLoader(FashionMNISTDataset dataset, int64_t batch_size, bool shuffle,
                     at::Generator generator);
  /// A loader with a generator of its own, seeded with `seed`.
  FashionMNISTLoader(FashionMNISTDataset dataset, int64_t batch_size, bool shuffle,
                     uint64_t seed = 0);

  /// The first batch of a new epoch (a new permutation when shuffling).
  Iterator begin();
  Iterator end() const;
  int64_t size() const;
  int64_t batch_size() const { return batch_size_; }
  bool shuffle() const { return shuffle_; }
  const FashionMNISTDataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const FashionMNISTDataset> dataset_;
  int64_t batch_size_;
  bool shuffle_;
  at::Generator generator_;
};

/// The book's `FashionMNIST(batch_size=64, resize=(28, 28))`:
///
///     d2l::v1::FashionMNIST data(/*batch_size=*/128, /*resize=*/{96, 96});
///     for (auto& batch : data.train_dataloader()) { batch.data; batch.target; }
///
/// Reads the files of `options.root()` through torch::data::datasets::MNIST
/// after checking them: a missing, truncated or corrupt file (bad gzip data,
/// a wrong magic number, count or size, data past the end, a label outside
/// 0..9) is a c10::Error naming the file and the byte offset, raised before
/// anything is allocated from the file's numbers. Memory: 47 MB of uint8
/// images for the training split and 8 MB for the validation split,
/// whatever `resize` is; a batch is resized when the loader reaches it.
class FashionMNIST {
  // First: the constructor checks and resolves them before it loads the
  // datasets.
  int64_t batch_size_;
  std::array<int64_t, 2> resize_;
  FashionMNISTOptions options_;
  std::string root_;
  at::Generator generator_;

 public:
  explicit FashionMNIST(int64_t batch_size = 64, std::array<int64_t, 2> resize = {28, 28},
                        FashionMNISTOptions options = {});

  /// The book's `data.train` and `data.val` (the files' t10k split).
  FashionMNISTDataset train, val;

  /// The book's `text_labels(indices)`: 't-shirt', 'trouser', ... for labels
  /// 0..9 (any integer tensor, flattened). A label outside 0..9 is a
  /// c10::Error naming it.
  std::vector<std::string> text_labels(const torch::Tensor& indices) const;
  std::vector<std::string> text_labels(const std::vector<int64_t>& indices) const;

  /// The book's `get_dataloader(train)`: `train` shuffles (a new permutation
  /// each epoch, from a generator seeded with `options.seed()` and shared by
  /// every training loader of this object and its copies), `val` does not.
  FashionMNISTLoader get_dataloader(bool train) const;
  FashionMNISTLoader train_dataloader() const { return get_dataloader(true); }
  FashionMNISTLoader val_dataloader() const { return get_dataloader(false); }

  int64_t batch_size() const { return batch_size_; }
  std::array<int64_t, 2> resize() const { return resize_; }
  /// The folder the files were read from (`options.root()` or its default).
  const std::string& root() const { return root_; }
  const FashionMNISTOptions& options() const { return options_; }
};

}  // namespace d2l::v1
