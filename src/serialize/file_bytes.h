#pragma once

// A file's bytes for the state-dict reader (state_dict.cpp): the file mapped
// into memory where it is a regular file that mmap takes, else read. A
// base-size Transformer's state dict (238 MB) read into a growing string
// cost a copy, the string's reallocations and a page fault per 4 KiB of
// fresh memory before its tensors were even copied out; mapped, the page
// cache's pages are the bytes.

#include <iosfwd>
#include <string>
#include <string_view>

#include "serialize/zip.h"

namespace d2l::serialize {

class FileBytes {
 public:
  /// The bytes of source.path; fails through `source` (its messages) when
  /// the file cannot be opened or read.
  explicit FileBytes(const Source& source);
  ~FileBytes();
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;

  /// Valid while this object lives.
  std::string_view view() const { return view_; }

 private:
  void* mapped_ = nullptr;
  size_t mapped_size_ = 0;
  std::string read_;  // where the file is read rather than mapped
  std::string_view view_;
};

/// Every byte of `in` (blocks of 1 MiB); fails through `source`.
std::string read_all(std::istream& in, const Source& source);

}  // namespace d2l::serialize
