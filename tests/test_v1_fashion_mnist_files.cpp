// The IDX files of FashionMNIST, forged: truncated, a wrong magic number,
// count or size, data past the end, bad labels, bad or truncated gzip data, a
// gzip bomb. Each is a c10::Error naming the file and the byte offset, raised
// before MNIST reads the file (Note [What MNIST trusts] in src/data/mnist_files.h).
// Also the cache: decompressed once, remade when bad, safe for two at once;
// and the whole class on a generated root, which runs without Debian's data.

#include <d2l/v1/fashion_mnist.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "data/mnist_files.h"
#include "fifo_watchdog.h"
#include "test_utils.h"

// A named namespace: the tests compile in unity batches, where every file's
// anonymous namespace is one.
namespace v1_fashion_mnist_files_test {

namespace fs = std::filesystem;
namespace detail = d2l::v1::detail;
using d2l::testing::error_message;
using d2l::testing::FifoWatchdog;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kFn = "d2l::v1::FashionMNIST";

// A fresh folder per test.
fs::path temp_folder() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const auto folder = fs::path(::testing::TempDir()) /
                      ("d2l_fmnist_" + std::to_string(::getpid()) + "_" + info->name());
  fs::remove_all(folder);
  fs::create_directories(folder);
  return folder;
}

std::string write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path.string();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string big_endian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// An IDX file of labels i % 10, or of images whose bytes are i % 256.
std::string idx(const detail::IdxFile& spec, uint32_t count) {
  std::string bytes = big_endian(spec.magic) + big_endian(count);
  const uint64_t body = spec.images ? uint64_t{count} * 784 : count;
  if (spec.images) bytes += big_endian(28) + big_endian(28);
  bytes.reserve(bytes.size() + body);
  for (uint64_t i = 0; i < body; ++i) bytes.push_back(static_cast<char>(spec.images ? i % 256 : i % 10));
  return bytes;
}

std::string gzip(const std::string& data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, data.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

const detail::IdxFile kLabels = detail::labels_file(false);  // t10k: 10000 labels, 10008 bytes
const detail::IdxFile kImages = detail::images_file(false);

std::string check(const std::string& path, const detail::IdxFile& spec) {
  return error_message([&] { detail::check_idx_file(kFn, path, spec); });
}

std::string inflate_to(const fs::path& folder, const std::string& gz_bytes, const detail::IdxFile& spec) {
  const auto gz = write_file(folder / "file.gz", gz_bytes);
  const auto message = error_message([&] { detail::decompress_idx(kFn, gz, (folder / "out").string(), spec); });
  EXPECT_EQ(std::distance(fs::directory_iterator(folder), fs::directory_iterator()), 1)
      << "a failed decompression leaves no file behind";
  EXPECT_THAT(message, StartsWith(std::string(kFn) + ": " + gz + ": "));
  return message;
}

TEST(V1FashionMNISTFiles, HeadersAreChecked) {
  const auto folder = temp_folder();
  auto labels = idx(kLabels, 10000);
  labels[3] = 0x03;  // an images file's magic number
  EXPECT_THAT(check(write_file(folder / "magic", labels), kLabels),
              HasSubstr("magic number 0x00000803 at byte offset 0, expected 0x00000801"));
  // A forged count: refused from the 8-byte header, nothing allocated for it.
  const auto huge = write_file(folder / "huge", big_endian(0x801) + big_endian(0xFFFFFFFF));
  EXPECT_THAT(check(huge, kLabels), HasSubstr(huge + ": count 4294967295 at byte offset 4, expected 10000"));
  auto images = big_endian(0x803) + big_endian(10000) + big_endian(28) + big_endian(29);
  EXPECT_THAT(check(write_file(folder / "columns", images), kImages),
              HasSubstr("columns 29 at byte offset 12, expected 28"));
  EXPECT_THAT(check(write_file(folder / "short", std::string("\x00\x00\x08", 3)), kLabels), HasSubstr("3 bytes, shorter than the 8-byte IDX header: truncated at byte offset 3"));
}

TEST(V1FashionMNISTFiles, LengthsAndLabelsAreChecked) {
  const auto folder = temp_folder();
  const auto images = idx(kImages, 10000);
  const auto truncated = write_file(folder / "truncated", images.substr(0, 116));
  EXPECT_THAT(check(truncated, kImages),
              HasSubstr(truncated + ": 116 bytes, expected 7840016 (10000 images of 28 x 28 after a "
                                    "16-byte header): truncated at byte offset 116"));
  EXPECT_THAT(check(write_file(folder / "long", idx(kLabels, 10000) + "extra"), kLabels),
              HasSubstr("10013 bytes, expected 10008 (10000 labels after an 8-byte header): 5 bytes "
                        "past the end of the data at byte offset 10008"));
  auto labels = idx(kLabels, 10000);
  labels[8 + 1234] = 10;
  EXPECT_THAT(check(write_file(folder / "label", labels), kLabels),
              HasSubstr("label 10 at byte offset 1242, expected 0 to 9"));
  EXPECT_NO_THROW(detail::check_idx_file(kFn, write_file(folder / "good", images), kImages));
  EXPECT_THAT(check((folder / "absent").string(), kLabels), HasSubstr("cannot open"));
}

TEST(V1FashionMNISTFiles, GzipDataIsChecked) {
  const auto folder = temp_folder();
  const auto labels = idx(kLabels, 10000);
  EXPECT_THAT(inflate_to(folder, "not gzip at all", kLabels),
              HasSubstr("corrupt gzip data at compressed byte offset"));
  const auto gz = gzip(labels);
  EXPECT_THAT(inflate_to(folder, gz.substr(0, gz.size() / 2), kLabels),
              HasSubstr(fmt::format("the gzip stream is truncated: the file ends at compressed byte "
                                    "offset {} inside it", gz.size() / 2)));
  auto corrupt = gz;
  corrupt[gz.size() - 6] ^= 0x5a;  // the CRC-32 of the trailer
  EXPECT_THAT(inflate_to(folder, corrupt, kLabels),
              HasSubstr("corrupt gzip data at compressed byte offset"));
  EXPECT_THAT(inflate_to(folder, corrupt, kLabels), HasSubstr("incorrect data check"));
  EXPECT_THAT(inflate_to(folder, gzip(labels.substr(0, 5008)), kLabels),
              HasSubstr("decompresses to 5008 bytes, expected 10008 (10000 labels after an 8-byte "
                        "header): truncated at byte offset 5008 of the decompressed data"));
  auto bad_label = labels;
  bad_label[8 + 7] = 12;
  EXPECT_THAT(inflate_to(folder, gzip(bad_label), kLabels),
              HasSubstr("label 12 at byte offset 15 of the decompressed data, expected 0 to 9"));
  auto magic = labels;
  magic[2] = 0x7f;
  EXPECT_THAT(inflate_to(folder, gzip(magic), kLabels),
              HasSubstr("magic number 0x00007f01 at byte offset 0 of the decompressed data"));
}

TEST(V1FashionMNISTFiles, AGzipBombStopsAtTheExpectedSize) {
  const auto folder = temp_folder();
  // 64 MiB of valid labels (zeros) in about 64 KiB: inflating stops at 10008.
  auto bomb = big_endian(0x801) + big_endian(10000) + std::string(size_t{64} << 20, '\0');
  EXPECT_THAT(inflate_to(folder, gzip(bomb), kLabels),
              HasSubstr("decompresses to more than 10008 bytes (10000 labels after an 8-byte header): "
                        "data past the end at byte offset 10008 of the decompressed data"));
  // A forged count in gzipped images is refused at the header.
  const auto images = big_endian(0x803) + big_endian(0xFFFFFFFF) + big_endian(28) + big_endian(28);
  EXPECT_THAT(inflate_to(folder, gzip(images), kImages),
              HasSubstr("count 4294967295 at byte offset 4 of the decompressed data, expected 10000"));
}

TEST(V1FashionMNISTFiles, GzipMembersFollowingEachOtherAreOneFile) {
  const auto folder = temp_folder();
  const auto labels = idx(kLabels, 10000);
  const auto gz = write_file(folder / "two.gz", gzip(labels.substr(0, 5000)) + gzip(labels.substr(5000)));
  detail::decompress_idx(kFn, gz, (folder / "out").string(), kLabels);
  EXPECT_EQ(read_file(folder / "out"), labels);
}

// A root of gzipped t10k files (and train files if asked).
fs::path gz_root(const fs::path& folder, bool with_train) {
  const auto root = folder / "root";
  fs::create_directories(root);
  for (bool train : {false, true}) {
    if (train && !with_train) continue;
    for (const auto& spec : {detail::images_file(train), detail::labels_file(train)}) {
      write_file(root / (std::string(spec.name) + ".gz"), gzip(idx(spec, spec.count)));
    }
  }
  return root;
}

TEST(V1FashionMNISTFiles, TheCacheIsMadeOnceAndRemadeWhenBad) {
  const auto folder = temp_folder();
  const auto root = gz_root(folder, false), cache = folder / "cache";
  const auto dir = detail::prepare_split(kFn, root.string(), cache.string(), false);
  EXPECT_EQ(fs::path(dir).parent_path(), cache);
  EXPECT_EQ(read_file(fs::path(dir) / kLabels.name), idx(kLabels, 10000));
  EXPECT_EQ(read_file(fs::path(dir) / kImages.name), idx(kImages, 10000));
  const auto written = fs::last_write_time(fs::path(dir) / kImages.name);
  EXPECT_EQ(detail::prepare_split(kFn, root.string(), cache.string(), false), dir);
  EXPECT_EQ(fs::last_write_time(fs::path(dir) / kImages.name), written) << "decompressed again";
  write_file(fs::path(dir) / kLabels.name, "spoilt");
  EXPECT_EQ(detail::prepare_split(kFn, root.string(), cache.string(), false), dir);
  EXPECT_EQ(read_file(fs::path(dir) / kLabels.name), idx(kLabels, 10000));
  // Uncompressed files in the root are read where they are.
  write_file(root / kImages.name, idx(kImages, 10000));
  write_file(root / kLabels.name, idx(kLabels, 10000));
  EXPECT_EQ(detail::prepare_split(kFn, root.string(), cache.string(), false), root.string());
}

TEST(V1FashionMNISTFiles, TwoAtOnceBothGetTheWholeFiles) {
  const auto folder = temp_folder();
  const auto root = gz_root(folder, false), cache = folder / "cache";
  std::vector<std::string> dirs(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < dirs.size(); ++i) {
    threads.emplace_back([&, i] { dirs[i] = detail::prepare_split(kFn, root.string(), cache.string(), false); });
  }
  for (auto& t : threads) t.join();
  for (const auto& dir : dirs) EXPECT_EQ(dir, dirs[0]);
  EXPECT_EQ(read_file(fs::path(dirs[0]) / kImages.name), idx(kImages, 10000));
  EXPECT_EQ(std::distance(fs::directory_iterator(dirs[0]), fs::directory_iterator()), 2)
      << "no temporary file left";
}

TEST(V1FashionMNISTFiles, MissingFilesSayWhereToGetThem) {
  const auto folder = temp_folder();
  const auto message = error_message([&] { detail::prepare_split(kFn, folder.string(), (folder / "c").string(), true); });
  EXPECT_THAT(message, HasSubstr(folder.string() + " holds neither train-images-idx3-ubyte nor "
                                                   "train-images-idx3-ubyte.gz (the train images of Fashion-MNIST)"));
  EXPECT_THAT(message, HasSubstr("install Debian's dataset-fashion-mnist (make fashion-mnist)"));
  EXPECT_THAT(error_message([&] { detail::prepare_split(kFn, (folder / "nowhere").string(), folder.string(), true); }),
              HasSubstr((folder / "nowhere").string() + " is not a folder"));
}

TEST(V1FashionMNISTFiles, TheClassOnAGeneratedRoot) {
  const auto folder = temp_folder();
  const auto root = gz_root(folder, true);
  const d2l::v1::FashionMNIST data(
      1000, {14, 14}, d2l::v1::FashionMNISTOptions().root(root.string()).cache_dir((folder / "cache").string()));
  EXPECT_EQ(*data.train.size(), 60000u);
  EXPECT_EQ(data.root(), root.string());
  const auto first = idx(detail::images_file(true), 1).substr(16);
  const auto image = torch::from_blob(const_cast<char*>(first.data()), {28, 28}, torch::kUInt8);
  EXPECT_TRUE(torch::equal(data.train.images()[0][0], image));
  EXPECT_TRUE(torch::equal(data.val.targets().narrow(0, 0, 12),
                           torch::tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1}, torch::kInt64)));
  EXPECT_EQ(data.train_dataloader().begin()->data.sizes(), (std::vector<int64_t>{1000, 1, 14, 14}));

  // A truncated training file: the class's error names it.
  const auto gz = (root / "train-labels-idx1-ubyte.gz").string();
  write_file(gz, gzip(idx(detail::labels_file(true), 60000).substr(0, 100)));
  EXPECT_THAT(error_message([&] {
                d2l::v1::FashionMNIST(64, {28, 28}, d2l::v1::FashionMNISTOptions().root(root.string()).cache_dir((folder / "cache").string()));
              }),
              StartsWith("d2l::v1::FashionMNIST: " + gz + ": decompresses to 100 bytes, expected 60008"));
}

TEST(V1FashionMNISTFiles, FifosDirectoriesAndDevicesAreRefusedWithoutBlocking) {
  const auto folder = temp_folder();
  const auto root = gz_root(folder, true);
  const auto gz = root / "train-labels-idx1-ubyte.gz";
  fs::remove(gz);
  d2l::testing::make_fifo(gz.string());
  const auto options =
      d2l::v1::FashionMNISTOptions().root(root.string()).cache_dir((folder / "cache").string());
  FifoWatchdog watchdog(gz.string(), FifoWatchdog::Side::kReader);
  const auto message = error_message([&] { d2l::v1::FashionMNIST(64, {28, 28}, options); });
  EXPECT_FALSE(watchdog.finish()) << "the FIFO's reader blocked";
  EXPECT_THAT(message, StartsWith("d2l::v1::FashionMNIST: cannot read " + gz.string() +
                                  ": it is a FIFO (named pipe)"));
  // The uncompressed files too.
  const auto plain = folder / "plain";
  fs::create_directories(plain);
  write_file(plain / "t10k-images-idx3-ubyte", idx(kImages, 10000));
  const auto labels = plain / "t10k-labels-idx1-ubyte";
  d2l::testing::make_fifo(labels.string());
  FifoWatchdog plain_watchdog(labels.string(), FifoWatchdog::Side::kReader);
  EXPECT_THAT(error_message([&] {
                detail::prepare_split(kFn, plain.string(), (folder / "c").string(), false);
              }),
              HasSubstr(labels.string() + ": it is a FIFO (named pipe)"));
  EXPECT_FALSE(plain_watchdog.finish()) << "the FIFO's reader blocked";
  EXPECT_THAT(check("/dev/zero", kLabels), HasSubstr("/dev/zero: it is a character device"));
  fs::remove(gz);
  fs::create_directory(gz);
  EXPECT_THAT(error_message([&] {
                d2l::v1::FashionMNIST(64, {28, 28}, options);
              }),
              HasSubstr(gz.string() + ": it is a directory"));
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    set(value);
  }
  ~ScopedEnv() { set(had_ ? old_.c_str() : nullptr); }

 private:
  void set(const char* value) {
    if (value != nullptr) {
      ::setenv(name_, value, 1);
    } else {
      ::unsetenv(name_);
    }
  }

  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(V1FashionMNISTFiles, DefaultsFollowTheEnvironment) {
  {
    ScopedEnv data("D2L_FASHION_MNIST", nullptr);
    EXPECT_EQ(detail::default_root(), "/usr/share/datasets/fashion-mnist");
  }
  {
    ScopedEnv data("D2L_FASHION_MNIST", "/data/fmnist");
    EXPECT_EQ(detail::default_root(), "/data/fmnist");
  }
  ScopedEnv home("HOME", "/home/reader");
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/var/cache/reader");
    EXPECT_EQ(detail::default_cache_dir(), "/var/cache/reader/d2l/fashion-mnist");
  }
  ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
  EXPECT_EQ(detail::default_cache_dir(), "/home/reader/.cache/d2l/fashion-mnist");
}

}  // namespace v1_fashion_mnist_files_test
