// d2l 1.0's FashionMNIST on LibTorch's torch::data::datasets::MNIST: the
// checked files (data/mnist_files.cpp), the book's transform per batch, the
// loaders and the text labels.

#include <d2l/v1/fashion_mnist.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/data/datasets/mnist.h>
#include <torch/nn/functional/upsampling.h>

#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>

#include "checks.h"
#include "data/mnist_files.h"

namespace d2l::v1 {
namespace {

constexpr const char* kFn = "d2l::v1::FashionMNIST";
constexpr const char* kDatasetFn = "d2l::v1::FashionMNISTDataset";
constexpr const char* kLoaderFn = "d2l::v1::FashionMNISTLoader";

constexpr std::array<const char*, detail::kClasses> kTextLabels = {
    "t-shirt", "trouser", "pullover", "dress", "coat",
    "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};

// Note [Resizing as the book does]
// The book's transform is torchvision's Resize((H, W)) on a PIL image, then
// ToTensor. Resize calls PIL's Image.resize((W, H), BILINEAR), which
// resamples in two passes, the rows first, each with a triangle filter
// (widened by the scale when shrinking: PIL always antialiases) whose
// normalised weights it rounds to 22-bit fixed point; each pass sums
// byte x weight in integers and rounds the result to a byte, half up.
// ToTensor then divides the bytes by 255 in float32.
// torch's bilinear interpolation (align_corners=false; antialias=true when
// shrinking, a port of PIL's filter) has the same weights, so they are taken
// from it: interpolating the identity matrix gives every output pixel's
// weights, kept as taps (the first input pixel and the weights from there:
// two when enlarging). They are then applied as PIL applies them, in
// integers, one axis after the other, and the result equals torchvision's
// pixel for pixel (the fixture of
// tests/fixtures/generate_fixtures_v1_fashion_mnist.py, written with PIL).
// Interpolating the float images directly, as torch code often does, differs
// from the book in one pixel in ten by 1/255 at 96 x 96 (no rounding between
// the passes, ties to even); rounding after each pass but with unrounded
// weights, in one pixel in a hundred by up to 2/255.
constexpr int kPrecisionBits = 22;  // PIL's PRECISION_BITS: 32 - 8 - 2
constexpr int64_t kHalf = int64_t{1} << (kPrecisionBits - 1);

// The taps {first (to), weights (to, taps)} of resizing an axis of `from`
// pixels to `to`; undefined when the size stays (PIL skips that pass).
std::pair<torch::Tensor, torch::Tensor> resampling_taps(int64_t from, int64_t to) {
  if (from == to) return {};
  namespace F = torch::nn::functional;
  const auto identity = torch::eye(from, torch::kFloat64).view({1, 1, from, from});
  const auto dense = F::interpolate(identity, F::InterpolateFuncOptions()
                                                  .size(std::vector<int64_t>{from, to})
                                                  .mode(torch::kBilinear)
                                                  .align_corners(false)
                                                  .antialias(to < from))
                         .view({from, to})
                         .t()
                         .mul(static_cast<double>(int64_t{1} << kPrecisionBits))
                         .add(0.5)
                         .floor()
                         .to(torch::kInt64)
                         .contiguous();
  const auto w = dense.accessor<int64_t, 2>();
  std::vector<int64_t> first(static_cast<size_t>(to), 0);
  int64_t taps = 1;
  for (int64_t j = 0; j < to; ++j) {
    int64_t lo = 0, hi = from - 1;
    while (lo < hi && w[j][lo] == 0) ++lo;
    while (hi > lo && w[j][hi] == 0) --hi;
    first[static_cast<size_t>(j)] = lo;
    taps = std::max(taps, hi - lo + 1);
  }
  auto starts = torch::empty({to}, torch::kInt64);
  auto weights = torch::empty({to, taps}, torch::kInt64);
  for (int64_t j = 0; j < to; ++j) {
    const int64_t start = std::min(first[static_cast<size_t>(j)], from - taps);
    starts[j] = start;
    weights[j] = dense[j].narrow(0, start, taps);
  }
  return {starts, weights};
}

uint8_t to_byte(int64_t sum) {
  return static_cast<uint8_t>(std::clamp<int64_t>(sum >> kPrecisionBits, 0, 255));
}

// PIL's pass along the last axis: (lines, from) bytes to (lines, to).
void resample_last_axis(const uint8_t* in, uint8_t* out, int64_t lines, int64_t from, int64_t to,
                        const torch::Tensor& first, const torch::Tensor& weights) {
  const int64_t taps = weights.size(1);
  const int64_t* starts = first.data_ptr<int64_t>();
  const int64_t* w = weights.data_ptr<int64_t>();
  for (int64_t line = 0; line < lines; ++line, in += from, out += to) {
    for (int64_t j = 0; j < to; ++j) {
      int64_t sum = kHalf;
      for (int64_t k = 0; k < taps; ++k) sum += in[starts[j] + k] * w[j * taps + k];
      out[j] = to_byte(sum);
    }
  }
}

// PIL's pass along the middle axis: (planes, from, width) bytes to
// (planes, to, width), a row of sums at a time.
void resample_middle_axis(const uint8_t* in, uint8_t* out, int64_t planes, int64_t from,
                          int64_t to, int64_t width, const torch::Tensor& first,
                          const torch::Tensor& weights) {
  const int64_t taps = weights.size(1);
  const int64_t* starts = first.data_ptr<int64_t>();
  const int64_t* w = weights.data_ptr<int64_t>();
  std::vector<int64_t> sums(static_cast<size_t>(width));
  for (int64_t plane = 0; plane < planes; ++plane, in += from * width) {
    for (int64_t i = 0; i < to; ++i, out += width) {
      std::fill(sums.begin(), sums.end(), kHalf);
      for (int64_t k = 0; k < taps; ++k) {
        const uint8_t* row = in + (starts[i] + k) * width;
        const int64_t weight = w[i * taps + k];
        for (int64_t c = 0; c < width; ++c) sums[static_cast<size_t>(c)] += row[c] * weight;
      }
      for (int64_t c = 0; c < width; ++c) out[c] = to_byte(sums[static_cast<size_t>(c)]);
    }
  }
}

void check_size_option(const char* name, int64_t value, int64_t count) {
  TORCH_CHECK(value >= -1 && value <= count, kFn, ": ", name, " must be -1 (all) or 0 to ", count,
              ", got ", value);
}

FashionMNISTDataset load_split(const std::string& root, const std::string& cache_dir, bool train,
                               int64_t size, std::array<int64_t, 2> resize) {
  const int64_t count = detail::images_file(train).count;
  check_size_option(train ? "train_size" : "val_size", size, count);
  const auto folder = detail::prepare_split(kFn, root, cache_dir, train);
  using torch::data::datasets::MNIST;
  MNIST mnist(folder, train ? MNIST::Mode::kTrain : MNIST::Mode::kTest);
  // MNIST holds the images as float32 / 255: back to the file's bytes, in
  // place (k / 255 * 255 rounds to k), then four times smaller.
  auto images = mnist.images().mul_(255).round_().to(torch::kUInt8);
  auto targets = mnist.targets();
  if (size >= 0 && size < count) {
    images = images.narrow(0, 0, size).clone();
    targets = targets.narrow(0, 0, size).clone();
  }
  return FashionMNISTDataset(std::move(images), std::move(targets), resize);
}

std::string cache_dir_of(const FashionMNISTOptions& options) {
  return options.cache_dir().empty() ? detail::default_cache_dir() : options.cache_dir();
}

int64_t checked_batch_size(const char* fn, int64_t batch_size) {
  TORCH_CHECK(batch_size > 0, fn, ": batch_size must be positive, got ", batch_size);
  return batch_size;
}

std::array<int64_t, 2> checked_resize(const char* fn, std::array<int64_t, 2> resize) {
  TORCH_CHECK(resize[0] > 0 && resize[1] > 0, fn, ": resize must be two positive sizes (H, W), got (",
              resize[0], ", ", resize[1], ")");
  return resize;
}

}  // namespace

FashionMNISTDataset::FashionMNISTDataset(torch::Tensor images, torch::Tensor targets,
                                         std::array<int64_t, 2> resize)
    : images_(std::move(images)), targets_(std::move(targets)),
      resize_(checked_resize(kDatasetFn, resize)) {
  TORCH_CHECK(images_.defined() && images_.dim() == 4 && images_.size(1) == 1 &&
                  images_.size(2) > 0 && images_.size(3) > 0 &&
                  images_.scalar_type() == torch::kUInt8 && images_.device().is_cpu(),
              kDatasetFn, ": images must be (N, 1, H, W) uint8 on the CPU, got ",
              d2l::detail::shape_of(images_), images_.defined() ? " " : "",
              images_.defined() ? std::string(c10::toString(images_.scalar_type())) : "");
  TORCH_CHECK(targets_.defined() && targets_.dim() == 1 &&
                  targets_.scalar_type() == torch::kInt64 && targets_.device().is_cpu() &&
                  targets_.size(0) == images_.size(0),
              kDatasetFn, ": targets must be (N) int64 on the CPU with N = ", images_.size(0),
              " (the images'), got ", d2l::detail::shape_of(targets_), targets_.defined() ? " " : "",
              targets_.defined() ? std::string(c10::toString(targets_.scalar_type())) : "");
  images_ = images_.contiguous();
  targets_ = targets_.contiguous();
  std::tie(rows_.first, rows_.weights) = resampling_taps(images_.size(3), resize_[1]);
  std::tie(columns_.first, columns_.weights) = resampling_taps(images_.size(2), resize_[0]);
}

torch::data::Example<> FashionMNISTDataset::get(size_t index) const {
  auto example = batch({index});
  return {example.data[0], example.target[0]};
}

torch::data::Example<> FashionMNISTDataset::get_batch(c10::ArrayRef<size_t> indices) {
  return batch(indices);
}

torch::data::Example<> FashionMNISTDataset::batch(c10::ArrayRef<size_t> indices) const {
  const auto n = static_cast<size_t>(images_.size(0));
  std::vector<int64_t> rows(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    TORCH_CHECK(indices[i] < n, kDatasetFn, ": index ", indices[i],
                " is out of range for a dataset of ", n, " examples");
    rows[i] = static_cast<int64_t>(indices[i]);
  }
  const auto index = torch::tensor(rows, torch::kInt64);
  auto bytes = images_.index_select(0, index);
  const int64_t b = bytes.size(0), h = images_.size(2), w = images_.size(3);
  // Note [Resizing as the book does]
  if (rows_.first.defined()) {
    auto out = torch::empty({b, 1, h, resize_[1]}, torch::kUInt8);
    resample_last_axis(bytes.data_ptr<uint8_t>(), out.data_ptr<uint8_t>(), b * h, w, resize_[1],
                       rows_.first, rows_.weights);
    bytes = out;
  }
  if (columns_.first.defined()) {
    auto out = torch::empty({b, 1, resize_[0], resize_[1]}, torch::kUInt8);
    resample_middle_axis(bytes.data_ptr<uint8_t>(), out.data_ptr<uint8_t>(), b, h, resize_[0],
                         resize_[1], columns_.first, columns_.weights);
    bytes = out;
  }
  return {bytes.to(torch::kFloat32).div_(255), targets_.index_select(0, index)};
}

torch::optional<size_t> FashionMNISTDataset::size() const {
  return static_cast<size_t>(images_.size(0));
}

FashionMNISTLoader::Iterator::Iterator(std::shared_ptr<const FashionMNISTDataset> dataset,
                                       int64_t batch_size,
                                       std::shared_ptr<const std::vector<size_t>> order,
                                       int64_t index)
    : dataset_(std::move(dataset)), batch_size_(batch_size),
      batches_((static_cast<int64_t>(*dataset_->size()) + batch_size - 1) / batch_size),
      order_(std::move(order)), index_(index) {
  if (index_ < batches_) load();
}

void FashionMNISTLoader::Iterator::load() {
  const auto start = static_cast<size_t>(index_ * batch_size_);
  const auto count = std::min(static_cast<size_t>(batch_size_), order_->size() - start);
  batch_ = dataset_->batch(c10::ArrayRef<size_t>(order_->data() + start, count));
}

FashionMNISTLoader::Iterator& FashionMNISTLoader::Iterator::operator++() {
  ++index_;
  if (index_ < batches_) {
    load();
  } else {
    batch_ = Batch();
  }
  return *this;
}

FashionMNISTLoader::FashionMNISTLoader(FashionMNISTDataset dataset, int64_t batch_size,
                                       bool shuffle, at::Generator generator)
    : dataset_(std::make_shared<const FashionMNISTDataset>(std::move(dataset))),
      batch_size_(checked_batch_size(kLoaderFn, batch_size)),
      shuffle_(shuffle), generator_(std::move(generator)) {
  TORCH_CHECK(generator_.defined() && generator_.device().is_cpu(), kLoaderFn,
              ": generator must be a CPU generator");
}

FashionMNISTLoader::FashionMNISTLoader(FashionMNISTDataset dataset, int64_t batch_size,
                                       bool shuffle, uint64_t seed)
    : FashionMNISTLoader(std::move(dataset), batch_size, shuffle,
                         at::detail::createCPUGenerator(seed)) {}

FashionMNISTLoader::Iterator FashionMNISTLoader::begin() {
  const auto n = static_cast<int64_t>(*dataset_->size());
  auto order = std::make_shared<std::vector<size_t>>(static_cast<size_t>(n));
  if (shuffle_) {
    const auto permutation = torch::randperm(n, generator_, torch::kInt64);
    const auto* p = permutation.data_ptr<int64_t>();
    std::copy(p, p + n, order->begin());
  } else {
    std::iota(order->begin(), order->end(), size_t{0});
  }
  return Iterator(dataset_, batch_size_, std::move(order), 0);
}

FashionMNISTLoader::Iterator FashionMNISTLoader::end() const {
  return Iterator(dataset_, batch_size_, nullptr, size());
}

int64_t FashionMNISTLoader::size() const {
  const auto n = static_cast<int64_t>(*dataset_->size());
  return (n + batch_size_ - 1) / batch_size_;
}

FashionMNIST::FashionMNIST(int64_t batch_size, std::array<int64_t, 2> resize,
                           FashionMNISTOptions options)
    : batch_size_(checked_batch_size(kFn, batch_size)),
      resize_(checked_resize(kFn, resize)),
      options_(std::move(options)),
      root_(options_.root().empty() ? detail::default_root() : options_.root()),
      generator_(at::detail::createCPUGenerator(options_.seed())),
      train(load_split(root_, cache_dir_of(options_), true, options_.train_size(), resize_)),
      val(load_split(root_, cache_dir_of(options_), false, options_.val_size(), resize_)) {}

std::vector<std::string> FashionMNIST::text_labels(const torch::Tensor& indices) const {
  TORCH_CHECK(indices.defined() && (c10::isIntegralType(indices.scalar_type(), false)),
              kFn, ".text_labels: indices must be an integer tensor, got ",
              indices.defined() ? std::string(c10::toString(indices.scalar_type())) : "undefined");
  const auto flat = indices.reshape(-1).to(torch::kCPU, torch::kInt64).contiguous();
  const auto* p = flat.data_ptr<int64_t>();
  return text_labels(std::vector<int64_t>(p, p + flat.numel()));
}

std::vector<std::string> FashionMNIST::text_labels(const std::vector<int64_t>& indices) const {
  std::vector<std::string> labels;
  labels.reserve(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    TORCH_CHECK(indices[i] >= 0 && indices[i] < detail::kClasses, kFn,
                ".text_labels: label ", indices[i], " at position ", i, " is outside 0 to ",
                detail::kClasses - 1);
    labels.emplace_back(kTextLabels[static_cast<size_t>(indices[i])]);
  }
  return labels;
}

FashionMNISTLoader FashionMNIST::get_dataloader(bool train) const {
  return FashionMNISTLoader(train ? this->train : val, batch_size_, train, generator_);
}

}  // namespace d2l::v1
