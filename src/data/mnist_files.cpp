// The checks of the IDX files before torch::data::datasets::MNIST reads them,
// and their decompression from gzip (Note [What MNIST trusts] in
// data/mnist_files.h). Inflate is zlib's, as in serialize/zip.cpp.

#include "data/mnist_files.h"

#include "checks.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <zlib.h>

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace d2l::v1::detail {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImagesMagic = 0x803, kLabelsMagic = 0x801;
constexpr size_t kChunk = size_t{1} << 16;
constexpr const char* kWhereToGetIt =
    "install Debian's dataset-fashion-mnist (make fashion-mnist), or name the folder that holds "
    "the files with FashionMNISTOptions().root(...) or the environment variable D2L_FASHION_MNIST";

uint32_t big_endian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

std::string contents(const IdxFile& spec) {
  return spec.images ? fmt::format("{} images of {} x {} after a 16-byte header", spec.count,
                                   kImageSide, kImageSide)
                     : fmt::format("{} labels after an 8-byte header", spec.count);
}

// `where` follows every byte offset: "" in a plain file, " of the
// decompressed data" in a gzipped one.
void check_header(const char* fn, const std::string& path, const char* where, const IdxFile& spec,
                  const unsigned char* header) {
  const uint32_t magic = big_endian32(header);
  TORCH_CHECK(magic == spec.magic, fn, ": ", path, ": magic number ",
              fmt::format("{:#010x}", magic), " at byte offset 0", where, ", expected ",
              fmt::format("{:#010x}", spec.magic), " (", spec.name, ": IDX ",
              spec.images ? "images" : "labels", " of unsigned bytes, ", spec.images ? 3 : 1,
              spec.images ? " dimensions)" : " dimension)");
  const uint32_t count = big_endian32(header + 4);
  TORCH_CHECK(count == spec.count, fn, ": ", path, ": count ", count, " at byte offset 4", where,
              ", expected ", spec.count, " (", spec.name, ")");
  if (!spec.images) return;
  const std::array<const char*, 2> names = {"rows", "columns"};
  for (int i = 0; i < 2; ++i) {
    const uint32_t side = big_endian32(header + 8 + 4 * i);
    TORCH_CHECK(side == kImageSide, fn, ": ", path, ": ", names[i], " ", side, " at byte offset ",
                8 + 4 * i, where, ", expected ", kImageSide);
  }
}

// `data` holds the bytes from `offset` on.
void check_labels(const char* fn, const std::string& path, const char* where,
                  const unsigned char* data, size_t n, uint64_t offset) {
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(data[i] < kClasses, fn, ": ", path, ": label ", int{data[i]}, " at byte offset ",
                offset + i, where, ", expected 0 to ", kClasses - 1);
  }
}

// A temporary file beside its final name, removed unless renamed to it.
class TempFile {
 public:
  TempFile(const char* fn, const std::string& final_path) : fn_(fn), final_(final_path) {
    std::string name = final_path + ".XXXXXX";
    fd_ = ::mkstemp(name.data());
    TORCH_CHECK(fd_ >= 0, fn, ": cannot create a file beside ", final_path, ": ",
                std::strerror(errno), " (FashionMNISTOptions().cache_dir(...) names another folder)");
    path_ = name;
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  void write(const unsigned char* data, size_t n) {
    while (n > 0) {
      const ssize_t done = ::write(fd_, data, n);
      if (done < 0 && errno == EINTR) continue;
      TORCH_CHECK(done > 0, fn_, ": cannot write ", path_, ": ", std::strerror(errno));
      data += done;
      n -= static_cast<size_t>(done);
    }
  }

  void commit() {
    const int rc = ::close(fd_);
    fd_ = -1;
    TORCH_CHECK(rc == 0, fn_, ": cannot write ", path_, ": ", std::strerror(errno));
    TORCH_CHECK(::rename(path_.c_str(), final_.c_str()) == 0, fn_, ": cannot rename ", path_,
                " to ", final_, ": ", std::strerror(errno));
    path_.clear();
  }

 private:
  const char* fn_;
  std::string final_, path_;
  int fd_ = -1;
};

// zlib's inflate state, ended however the decompression ends.
class Inflater {
 public:
  Inflater(const char* fn, const std::string& path) {
    // 16 + 15: a gzip wrapper around a deflate stream with a 32 KiB window.
    TORCH_CHECK(inflateInit2(&stream_, 16 + MAX_WBITS) == Z_OK, fn, ": ", path,
                ": zlib cannot start inflating (out of memory?)");
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  ~Inflater() { inflateEnd(&stream_); }
  z_stream* operator->() { return &stream_; }
  z_stream* get() { return &stream_; }

 private:
  z_stream stream_{};
};

// What decompress_idx does with each piece of inflated data: checks it at its
// offset in the decompressed file and writes it out.
class IdxSink {
 public:
  IdxSink(const char* fn, const std::string& path, const IdxFile& spec, TempFile& out)
      : fn_(fn), path_(path), spec_(spec), out_(out) {}

  void take(const unsigned char* data, size_t n) {
    static constexpr const char* kWhere = " of the decompressed data";
    TORCH_CHECK(n <= spec_.length() - produced_, fn_, ": ", path_, ": decompresses to more than ",
                spec_.length(), " bytes (", contents(spec_), "): data past the end at byte offset ",
                spec_.length(), kWhere);
    const uint64_t header = spec_.header_size();
    size_t used = 0;
    for (; produced_ + used < header && used < n; ++used) header_[produced_ + used] = data[used];
    if (produced_ < header && produced_ + used == header) {
      check_header(fn_, path_, kWhere, spec_, header_.data());
    }
    if (!spec_.images) {
      check_labels(fn_, path_, kWhere, data + used, n - used, produced_ + used);
    }
    out_.write(data, n);
    produced_ += n;
  }

  uint64_t produced() const { return produced_; }

 private:
  const char* fn_;
  const std::string& path_;
  const IdxFile& spec_;
  TempFile& out_;
  std::array<unsigned char, 16> header_{};
  uint64_t produced_ = 0;
};

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ULL;
  return hash;
}

std::string split_name(bool train) { return train ? "train" : "t10k"; }

}  // namespace

uint64_t IdxFile::length() const {
  return header_size() + uint64_t{count} * (images ? kImageSide * kImageSide : 1);
}

IdxFile images_file(bool train) {
  return {train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte", kImagesMagic,
          train ? 60000u : 10000u, true};
}

IdxFile labels_file(bool train) {
  return {train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte", kLabelsMagic,
          train ? 60000u : 10000u, false};
}

// A FIFO in place of a file would block the open until a writer came, and a
// device would be read without end: refused, naming the file.
namespace {
void check_readable(const char* fn, const std::string& path) {
  const auto why = d2l::detail::unreadable_file_reason(path);
  TORCH_CHECK(why.empty(), fn, ": cannot read ", path, ": it ", why);
}
}  // namespace

void check_idx_file(const char* fn, const std::string& path, const IdxFile& spec) {
  check_readable(fn, path);
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, fn, ": cannot open ", path);
  std::error_code error;
  const uint64_t size = fs::file_size(path, error);
  TORCH_CHECK(!error, fn, ": cannot read the size of ", path, ": ", error.message());
  TORCH_CHECK(size >= spec.header_size(), fn, ": ", path, ": ", size, " bytes, shorter than the ",
              spec.header_size(), "-byte IDX header: truncated at byte offset ", size);
  std::array<unsigned char, 16> header{};
  in.read(reinterpret_cast<char*>(header.data()), static_cast<std::streamsize>(spec.header_size()));
  TORCH_CHECK(in, fn, ": cannot read the header of ", path);
  check_header(fn, path, "", spec, header.data());
  TORCH_CHECK(size <= spec.length(), fn, ": ", path, ": ", size, " bytes, expected ",
              spec.length(), " (", contents(spec), "): ", size - spec.length(),
              " bytes past the end of the data at byte offset ", spec.length());
  TORCH_CHECK(size == spec.length(), fn, ": ", path, ": ", size, " bytes, expected ",
              spec.length(), " (", contents(spec), "): truncated at byte offset ", size);
  if (spec.images) return;
  std::vector<unsigned char> labels(spec.count);  // spec's count: the file's was checked
  in.read(reinterpret_cast<char*>(labels.data()), static_cast<std::streamsize>(labels.size()));
  TORCH_CHECK(in, fn, ": cannot read the labels of ", path);
  check_labels(fn, path, "", labels.data(), labels.size(), spec.header_size());
}

void decompress_idx(const char* fn, const std::string& gz_path, const std::string& out_path,
                    const IdxFile& spec) {
  check_readable(fn, gz_path);
  std::ifstream in(gz_path, std::ios::binary);
  TORCH_CHECK(in, fn, ": cannot open ", gz_path);
  TempFile out(fn, out_path);
  IdxSink sink(fn, gz_path, spec, out);
  Inflater zs(fn, gz_path);
  std::vector<unsigned char> input(kChunk), output(kChunk);
  uint64_t consumed = 0;   // compressed bytes inflate has taken
  bool in_member = true;   // inside a gzip member (a file may hold several)
  bool pending = false;    // inflate may hold output it had no room for
  while (true) {
    if (zs->avail_in == 0 && !pending) {
      in.read(reinterpret_cast<char*>(input.data()), static_cast<std::streamsize>(kChunk));
      const auto got = static_cast<uInt>(in.gcount());
      if (got == 0) break;
      zs->next_in = input.data();
      zs->avail_in = got;
    }
    if (!in_member) {  // more input after a member's end: the next member
      inflateReset(zs.get());
      in_member = true;
    }
    zs->next_out = output.data();
    zs->avail_out = static_cast<uInt>(kChunk);
    const uInt before = zs->avail_in;
    const int rc = inflate(zs.get(), Z_NO_FLUSH);
    TORCH_CHECK(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR, fn, ": ", gz_path,
                ": corrupt gzip data at compressed byte offset ", consumed + (before - zs->avail_in),
                " (zlib: ", zs->msg != nullptr ? zs->msg : zError(rc), ")");
    consumed += before - zs->avail_in;
    sink.take(output.data(), kChunk - zs->avail_out);
    in_member = rc != Z_STREAM_END;
    pending = in_member && zs->avail_out == 0;
  }
  TORCH_CHECK(!in_member, fn, ": ", gz_path, ": the gzip stream is truncated: the file ends at "
              "compressed byte offset ", consumed, " inside it");
  TORCH_CHECK(sink.produced() == spec.length(), fn, ": ", gz_path, ": decompresses to ",
              sink.produced(), " bytes, expected ", spec.length(), " (", contents(spec),
              "): truncated at byte offset ", sink.produced(), " of the decompressed data");
  out.commit();
}

std::string prepare_split(const char* fn, const std::string& root, const std::string& cache_dir,
                          bool train) {
  const std::array<IdxFile, 2> files = {images_file(train), labels_file(train)};
  std::error_code error;
  TORCH_CHECK(fs::is_directory(root, error), fn, ": ", root, " is not a folder: ", kWhereToGetIt);
  if (fs::exists(fs::path(root) / files[0].name, error) &&
      fs::exists(fs::path(root) / files[1].name, error)) {
    for (const auto& file : files) check_idx_file(fn, (fs::path(root) / file.name).string(), file);
    return root;
  }
  // The cache's folder is named by the root and the .gz files' sizes and
  // times: another root, or a changed file, gets a folder of its own.
  std::string identity = fs::absolute(root, error).lexically_normal().string();
  for (const auto& file : files) {
    const auto gz = fs::path(root) / (std::string(file.name) + ".gz");
    TORCH_CHECK(fs::exists(gz, error), fn, ": ", root, " holds neither ", file.name, " nor ",
                file.name, ".gz (the ", split_name(train), " ",
                file.images ? "images" : "labels", " of Fashion-MNIST): ", kWhereToGetIt);
    identity += fmt::format("|{}:{}:{}", file.name, fs::file_size(gz, error),
                            fs::last_write_time(gz, error).time_since_epoch().count());
  }
  const auto folder = fs::path(cache_dir) / fmt::format("{}-{:016x}", split_name(train),
                                                         fnv1a(identity));
  fs::create_directories(folder, error);
  TORCH_CHECK(!error, fn, ": cannot make the cache folder ", folder.string(), ": ",
              error.message(), " (FashionMNISTOptions().cache_dir(...) names another folder)");
  for (const auto& file : files) {
    const auto path = (folder / file.name).string();
    if (fs::exists(path, error)) {
      try {
        check_idx_file(fn, path, file);
        continue;
      } catch (const c10::Error&) {
        // Not what we wrote (changed since): made again below.
      }
    }
    decompress_idx(fn, (fs::path(root) / (std::string(file.name) + ".gz")).string(), path, file);
  }
  return folder.string();
}

std::string default_root() {
  const char* env = std::getenv("D2L_FASHION_MNIST");
  return env != nullptr && *env != '\0' ? env : "/usr/share/datasets/fashion-mnist";
}

std::string default_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') return (fs::path(xdg) / "d2l" / "fashion-mnist").string();
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') {
    return (fs::path(home) / ".cache" / "d2l" / "fashion-mnist").string();
  }
  std::error_code error;
  return (fs::temp_directory_path(error) / "d2l-fashion-mnist").string();
}

}  // namespace d2l::v1::detail
