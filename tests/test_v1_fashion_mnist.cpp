// d2l 1.0's FashionMNIST (section "The Image Classification Dataset") on
// Debian's dataset-fashion-mnist: the book's counts, shapes and labels, the
// pixels against Python's reading of the same files, the book's resize
// (torchvision on PIL) value for value, and the loaders' batching and
// shuffling. The fixture: tests/fixtures/generate_fixtures_v1_fashion_mnist.py.

#include <d2l/v1.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "data/mnist_files.h"
#include "fixture.h"
#include "test_utils.h"

// A named namespace: the tests compile in unity batches, where every file's
// anonymous namespace is one.
namespace v1_fashion_mnist_test {

using d2l::testing::error_message;
using d2l::v1::FashionMNIST;
using d2l::v1::FashionMNISTDataset;
using d2l::v1::FashionMNISTLoader;
using d2l::v1::FashionMNISTOptions;
using ::testing::HasSubstr;

const d2l::testing::Fixture& fixture() {
  static const auto f = d2l::testing::load_fixture_file(D2L_FIXTURE_DIR "/v1_fashion_mnist_uint8.txt");
  return f;
}

// The book's data, or why it is absent (the suite then skips).
std::string missing_data() {
  const auto root = std::filesystem::path(d2l::v1::detail::default_root());
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    if (!std::filesystem::exists(root / name) &&
        !std::filesystem::exists(root / (std::string(name) + ".gz"))) {
      return "no Fashion-MNIST in " + root.string() + " (" + name +
             "): install Debian's dataset-fashion-mnist (make fashion-mnist) or set "
             "D2L_FASHION_MNIST";
    }
  }
  return {};
}

#define SKIP_WITHOUT_DATA()                               \
  do {                                                    \
    if (const auto why = missing_data(); !why.empty()) { \
      GTEST_SKIP() << why;                                \
    }                                                     \
  } while (0)

FashionMNISTOptions test_options() { return FashionMNISTOptions().cache_dir(D2L_TEST_CACHE_DIR); }

// The book's FashionMNIST() with its defaults, loaded once per process.
const FashionMNIST& book_data() {
  static const FashionMNIST data(64, {28, 28}, test_options());
  return data;
}

torch::Tensor as_bytes(const torch::Tensor& images) { return (images * 255).round().to(torch::kInt64); }

TEST(V1FashionMNIST, TheBooksCountsShapesAndDtypes) {
  SKIP_WITHOUT_DATA();
  const auto& data = book_data();
  // len(data.train), len(data.val)
  EXPECT_EQ(*data.train.size(), 60000u);
  EXPECT_EQ(*data.val.size(), 10000u);
  // data.train[0][0].shape
  const auto example = data.train.get(0);
  EXPECT_EQ(example.data.sizes(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(example.data.scalar_type(), torch::kFloat32);
  EXPECT_EQ(example.target.dim(), 0);
  EXPECT_EQ(example.target.scalar_type(), torch::kInt64);
  EXPECT_GE(example.data.min().item<float>(), 0.0f);
  EXPECT_LE(example.data.max().item<float>(), 1.0f);
  // X, y = next(iter(data.train_dataloader())): (64, 1, 28, 28) float32, (64) int64.
  // The iterator outlives its loader.
  auto it = data.train_dataloader().begin();
  ++it;
  EXPECT_EQ(it->data.sizes(), (std::vector<int64_t>{64, 1, 28, 28}));
  EXPECT_EQ(it->data.scalar_type(), torch::kFloat32);
  EXPECT_EQ(it->target.sizes(), (std::vector<int64_t>{64}));
  EXPECT_EQ(it->target.scalar_type(), torch::kInt64);
  // len(dataloader): drop_last=False keeps the last, smaller batch.
  EXPECT_EQ(data.train_dataloader().size(), 938);
  EXPECT_EQ(data.val_dataloader().size(), 157);
  EXPECT_EQ(data.batch_size(), 64);
  EXPECT_EQ(data.root(), d2l::v1::detail::default_root());
}

TEST(V1FashionMNIST, ResizeThirtyTwoAsTheSection) {
  SKIP_WITHOUT_DATA();
  // data = FashionMNIST(resize=(32, 32)); data.train[0][0].shape
  const FashionMNIST data(64, {32, 32}, test_options());
  EXPECT_EQ(*data.train.size(), 60000u);
  EXPECT_EQ(data.train.get(0).data.sizes(), (std::vector<int64_t>{1, 32, 32}));
  EXPECT_EQ(data.train.images().sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
}

TEST(V1FashionMNIST, PixelsAndLabelsAreTheFiles) {
  SKIP_WITHOUT_DATA();
  const auto& data = book_data();
  for (const auto& [split, dataset] :
       {std::pair<std::string, const FashionMNISTDataset*>{"train", &data.train},
        std::pair<std::string, const FashionMNISTDataset*>{"t10k", &data.val}}) {
    SCOPED_TRACE(split);
    const auto& images = dataset->images();
    EXPECT_EQ(images.scalar_type(), torch::kUInt8);
    EXPECT_EQ(images.size(0), fixture().tensor(split + ".count").item<int64_t>());
    EXPECT_EQ(images.sum(torch::kInt64).item<int64_t>(),
              fixture().tensor(split + ".pixel_sum").item<int64_t>());
    EXPECT_EQ(as_bytes(dataset->get(0).data).sum().item<int64_t>(),
              fixture().tensor(split + ".first_pixel_sum").item<int64_t>());
    EXPECT_TRUE(torch::equal(dataset->targets().narrow(0, 0, 16),
                             fixture().tensor(split + ".first_labels")));
    EXPECT_TRUE(torch::equal(torch::bincount(dataset->targets(), {}, 10),
                             fixture().tensor(split + ".class_counts")));
  }
  EXPECT_TRUE(torch::equal(as_bytes(data.train.get(0).data)[0], fixture().tensor("train.first_image")));
}

TEST(V1FashionMNIST, TextLabelsAreTheBooks) {
  SKIP_WITHOUT_DATA();
  const auto& data = book_data();
  EXPECT_THAT(data.text_labels(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}),
              ::testing::ElementsAre("t-shirt", "trouser", "pullover", "dress", "coat", "sandal",
                                     "shirt", "sneaker", "bag", "ankle boot"));
  // The first training labels are 9 0 0 3 (fixture).
  const auto labels = data.text_labels(data.train.targets().narrow(0, 0, 4));
  EXPECT_THAT(labels, ::testing::ElementsAre("ankle boot", "t-shirt", "t-shirt", "dress"));
  EXPECT_THAT(data.text_labels(torch::tensor({{8, 5}}, torch::kInt32)),
              ::testing::ElementsAre("bag", "sandal"));
  EXPECT_THAT(error_message([&] { data.text_labels(std::vector<int64_t>{3, 10}); }),
              HasSubstr("d2l::v1::FashionMNIST.text_labels: label 10 at position 1 is outside 0 to 9"));
  EXPECT_THAT(error_message([&] { data.text_labels(torch::tensor({1.5})); }),
              HasSubstr("indices must be an integer tensor, got Float"));
}

TEST(V1FashionMNIST, ResizeEqualsTheBooksTransform) {
  SKIP_WITHOUT_DATA();
  const auto& data = book_data();
  const auto images = data.train.images().narrow(0, 0, 3);
  const auto targets = data.train.targets().narrow(0, 0, 3);
  for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{96, 96}, {32, 32}, {20, 14}, {35, 17}}) {
    SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w));
    const auto expected =
        fixture().tensor("resize_" + std::to_string(h) + "x" + std::to_string(w)).to(torch::kFloat32).div(255);
    const FashionMNISTDataset resized(images, targets, {h, w});
    const auto batch = resized.batch({0, 1, 2});
    ASSERT_EQ(batch.data.sizes(), (std::vector<int64_t>{3, 1, h, w}));
    EXPECT_TRUE(torch::equal(batch.data.squeeze(1), expected))
        << "largest difference " << (batch.data.squeeze(1) - expected).abs().max().item<float>() * 255
        << "/255";
    EXPECT_TRUE(torch::equal(resized.get(1).data[0], expected[1]));
  }
}

TEST(V1FashionMNIST, TheVisionTransformersDataThroughTheConstructor) {
  SKIP_WITHOUT_DATA();
  // d2l.FashionMNIST(batch_size=128, resize=(img_size, img_size)), img_size 96.
  const FashionMNIST data(128, {96, 96}, test_options().train_size(3).val_size(2));
  EXPECT_EQ(*data.train.size(), 3u);
  EXPECT_EQ(*data.val.size(), 2u);
  const auto expected = fixture().tensor("resize_96x96").to(torch::kFloat32).div(255);
  auto loader = data.val_dataloader();
  EXPECT_EQ(loader.size(), 1);
  for (auto& batch : data.train_dataloader()) {
    EXPECT_EQ(batch.data.sizes(), (std::vector<int64_t>{3, 1, 96, 96}));
    for (int64_t i = 0; i < 3; ++i) {
      // Shuffled: the first three images have labels 9, 0, 0.
      const auto image = batch.data[i][0];
      if (batch.target[i].item<int64_t>() == 9) {
        EXPECT_TRUE(torch::equal(image, expected[0]));
      } else {
        EXPECT_TRUE(torch::equal(image, expected[1]) || torch::equal(image, expected[2]));
      }
    }
  }
}

TEST(V1FashionMNIST, SubsetsKeepTheFirstImages) {
  SKIP_WITHOUT_DATA();
  const auto& full = book_data();
  const FashionMNIST data(16, {28, 28}, test_options().train_size(100).val_size(50));
  EXPECT_EQ(*data.train.size(), 100u);
  EXPECT_TRUE(torch::equal(data.train.images(), full.train.images().narrow(0, 0, 100)));
  EXPECT_TRUE(torch::equal(data.val.targets(), full.val.targets().narrow(0, 0, 50)));
  // The validation loader: in order, batches 16, 16, 16, 2.
  std::vector<int64_t> sizes;
  std::vector<torch::Tensor> targets;
  size_t start = 0;
  for (auto& batch : data.val_dataloader()) {
    std::vector<size_t> rows(static_cast<size_t>(batch.target.size(0)));
    std::iota(rows.begin(), rows.end(), start);
    EXPECT_TRUE(torch::equal(batch.data, data.val.batch(rows).data));
    start += rows.size();
    sizes.push_back(batch.target.size(0));
    targets.push_back(batch.target);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{16, 16, 16, 2}));
  EXPECT_TRUE(torch::equal(torch::cat(targets), data.val.targets()));

  const FashionMNIST none(16, {28, 28}, test_options().train_size(0));
  auto empty = none.train_dataloader();
  EXPECT_EQ(empty.size(), 0);
  EXPECT_TRUE(empty.begin() == empty.end());
  EXPECT_THAT(error_message([] { FashionMNIST(16, {28, 28}, test_options().train_size(60001)); }),
              HasSubstr("d2l::v1::FashionMNIST: train_size must be -1 (all) or 0 to 60000, got 60001"));
  EXPECT_THAT(error_message([] { FashionMNIST(16, {28, 28}, test_options().val_size(-2)); }),
              HasSubstr("val_size must be -1 (all) or 0 to 10000, got -2"));
}

TEST(V1FashionMNIST, TrainingLoadersShareOneSeededGenerator) {
  SKIP_WITHOUT_DATA();
  const auto options = test_options().train_size(200).val_size(10).seed(3);
  const FashionMNIST a(50, {28, 28}, options), b(50, {28, 28}, options);
  auto epoch = [](FashionMNISTLoader loader) {
    std::vector<torch::Tensor> sums;
    for (auto& batch : loader) sums.push_back(batch.data.sum({1, 2, 3}));
    return torch::cat(sums);
  };
  const auto a1 = epoch(a.train_dataloader()), a2 = epoch(a.train_dataloader());
  EXPECT_FALSE(torch::equal(a1, a2));  // each epoch a new permutation
  EXPECT_TRUE(torch::equal(a1, epoch(b.train_dataloader())));
  EXPECT_TRUE(torch::equal(a2, epoch(b.train_dataloader())));
  EXPECT_TRUE(torch::equal(std::get<0>(a1.sort()), std::get<0>(a2.sort())));
  EXPECT_TRUE(torch::equal(epoch(a.val_dataloader()), epoch(b.val_dataloader())));
}

// A dataset whose image i holds i % 256 and whose label is i: batches show
// which examples they hold.
FashionMNISTDataset numbered(int64_t n) {
  const auto ids = torch::arange(n, torch::kInt64);
  const auto images = (ids % 256).to(torch::kUInt8).view({n, 1, 1, 1}).expand({n, 1, 4, 4});
  return FashionMNISTDataset(images, ids, {4, 4});
}

std::vector<std::vector<int64_t>> epochs(FashionMNISTLoader& loader, int count) {
  std::vector<std::vector<int64_t>> orders;
  for (int e = 0; e < count; ++e) {
    std::vector<int64_t> order;
    for (auto& batch : loader) {
      const auto t = batch.target.contiguous();
      EXPECT_TRUE(torch::equal(batch.data.amax({1, 2, 3}), (t % 256).to(torch::kFloat32) / 255));
      order.insert(order.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    }
    orders.push_back(order);
  }
  return orders;
}

TEST(V1FashionMNISTLoader, ShufflesEveryEpochReproducibly) {
  FashionMNISTLoader loader(numbered(300), 32, /*shuffle=*/true, /*seed=*/7);
  EXPECT_EQ(loader.size(), 10);
  const auto orders = epochs(loader, 3);
  std::vector<int64_t> all(300);
  std::iota(all.begin(), all.end(), 0);
  for (const auto& order : orders) {
    auto sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all);  // each example once per epoch
    EXPECT_NE(order, all);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  FashionMNISTLoader again(numbered(300), 32, true, 7), other(numbered(300), 32, true, 8);
  EXPECT_EQ(epochs(again, 3), orders);
  EXPECT_NE(epochs(other, 1)[0], orders[0]);
}

TEST(V1FashionMNISTLoader, WithoutShuffleInOrderAndTheLastBatchSmaller) {
  FashionMNISTLoader loader(numbered(70), 32, /*shuffle=*/false);
  std::vector<int64_t> sizes;
  for (auto& batch : loader) sizes.push_back(batch.target.size(0));
  EXPECT_EQ(sizes, (std::vector<int64_t>{32, 32, 6}));
  std::vector<int64_t> all(70);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(epochs(loader, 2), (std::vector<std::vector<int64_t>>{all, all}));
}

TEST(V1FashionMNISTLoader, TorchDataLoadersTakeTheDataset) {
  auto loader = torch::data::make_data_loader(
      numbered(70), torch::data::samplers::SequentialSampler(70), torch::data::DataLoaderOptions(32));
  std::vector<int64_t> sizes;
  for (auto& batch : *loader) {
    EXPECT_EQ(batch.data.sizes()[1], 1);
    sizes.push_back(batch.target.size(0));
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{32, 32, 6}));
}

TEST(V1FashionMNISTLoader, BadArgumentsNameThemselves) {
  EXPECT_THAT(error_message([] { FashionMNISTLoader(numbered(4), 0, true); }),
              HasSubstr("d2l::v1::FashionMNISTLoader: batch_size must be positive, got 0"));
  EXPECT_THAT(error_message([] { numbered(4).get(4); }),
              HasSubstr("d2l::v1::FashionMNISTDataset: index 4 is out of range for a dataset of 4 examples"));
  EXPECT_THAT(error_message([] { FashionMNISTDataset(torch::zeros({2, 1, 4, 4}), torch::zeros({2}, torch::kInt64)); }),
              HasSubstr("images must be (N, 1, H, W) uint8 on the CPU, got [2, 1, 4, 4] Float"));
  EXPECT_THAT(error_message([] { FashionMNISTDataset(torch::zeros({2, 4, 4}, torch::kUInt8), torch::zeros({2}, torch::kInt64)); }),
              HasSubstr("got [2, 4, 4] Byte"));
  EXPECT_THAT(error_message([] { FashionMNISTDataset(torch::zeros({2, 1, 4, 4}, torch::kUInt8), torch::zeros({3}, torch::kInt64)); }),
              HasSubstr("targets must be (N) int64 on the CPU with N = 2 (the images'), got [3] Long"));
  EXPECT_THAT(error_message([] { FashionMNISTDataset(torch::zeros({1, 1, 4, 4}, torch::kUInt8), torch::zeros({1}, torch::kInt64), {0, 28}); }),
              HasSubstr("d2l::v1::FashionMNISTDataset: resize must be two positive sizes (H, W), got (0, 28)"));
  EXPECT_THAT(error_message([] { FashionMNIST(0); }),
              HasSubstr("d2l::v1::FashionMNIST: batch_size must be positive, got 0"));
  EXPECT_THAT(error_message([] { FashionMNIST(64, {96, -1}); }),
              HasSubstr("d2l::v1::FashionMNIST: resize must be two positive sizes (H, W), got (96, -1)"));
}

}  // namespace v1_fashion_mnist_test
