#pragma once

// The IDX files that torch::data::datasets::MNIST reads, checked before it
// reads them, and decompressed from gzip into a cache when that is how they
// come.
//
// Note [What MNIST trusts]
// LibTorch's MNIST (torch/csrc/api/src/data/datasets/mnist.cpp) takes the
// uncompressed files train-images-idx3-ubyte, ... from a folder, checks the
// header's magic number, count (60000 or 10000) and 28 x 28 with TORCH_CHECK,
// reads the header with AT_ASSERT (an internal assert on a short file), then
// reads the body without looking whether it got it: a truncated file leaves
// the rest of the images as whatever the allocator held, and data past the
// end is ignored. Labels are not checked (a 200 becomes a class). So before
// MNIST opens a file, check_idx_file has checked all of that, naming the
// file and the byte offset; a gzipped file is checked while it is inflated,
// and inflating stops at the size the header must give (no size read from a
// file is ever used to allocate).

#include <cstdint>
#include <string>

namespace d2l::v1::detail {

/// One of the four files: its name as MNIST opens it, what its header must
/// say and, from that, its exact length.
struct IdxFile {
  const char* name;
  uint32_t magic;   // 0x803 (images, 3 dimensions) or 0x801 (labels, 1 dimension)
  uint32_t count;   // 60000 (train) or 10000 (t10k)
  bool images;

  uint64_t header_size() const { return images ? 16 : 8; }
  uint64_t length() const;
};

constexpr int64_t kImageSide = 28;
constexpr int64_t kClasses = 10;

/// The images and the labels file of a split.
IdxFile images_file(bool train);
IdxFile labels_file(bool train);

/// Throws c10::Error (starting with `fn`, naming `path`) unless the file at
/// `path` is `spec` exactly: header, length, every label in 0..9.
void check_idx_file(const char* fn, const std::string& path, const IdxFile& spec);

/// Inflates the gzip file `gz_path` into `out_path`, checking the data as it
/// comes (header, labels) and stopping past `spec.length()` bytes: a c10::Error
/// names `gz_path` and the compressed or decompressed byte offset. Writes a
/// temporary file beside `out_path` and renames it, so that a reader, or
/// another process decompressing the same file, sees either no file or the
/// whole of it.
void decompress_idx(const char* fn, const std::string& gz_path, const std::string& out_path,
                    const IdxFile& spec);

/// The folder for MNIST to read the split from: `root` itself when it holds
/// both uncompressed files, else a folder of `cache_dir` (one per root and
/// the .gz files' sizes and times) where the .gz files are decompressed once
/// and checked on every later use (a bad cached file is decompressed again).
std::string prepare_split(const char* fn, const std::string& root, const std::string& cache_dir,
                          bool train);

/// D2L_FASHION_MNIST, else /usr/share/datasets/fashion-mnist.
std::string default_root();
/// $XDG_CACHE_HOME/d2l/fashion-mnist, else $HOME/.cache/d2l/fashion-mnist,
/// else d2l-fashion-mnist in the temporary folder.
std::string default_cache_dir();

}  // namespace d2l::v1::detail
