#pragma once

// The zip container of torch.save's format (PyTorch >= 1.6): a bounds-checked
// reader of the central directory and a writer, stored entries only (README,
// "Loading weights trained in Python").

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace d2l::serialize {

/// Where bytes came from, for error messages: the public function's name and
/// the file's path (or "<stream>").
struct Source {
  std::string fn;
  std::string path;
  /// Throws c10::Error "<fn>: <path>: <what>".
  [[noreturn]] void fail(const std::string& what) const;
};

/// CRC-32 (ISO-HDLC, zlib's), continuing from `crc`.
uint32_t crc32(std::string_view data, uint32_t crc = 0);

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;  // of the first data byte in the archive
  uint64_t size = 0;
  uint32_t crc = 0;
};

/// The entries of a zip archive held in memory. Every offset and length is
/// checked against the bytes before use; zip64 records are understood;
/// compressed, encrypted and multi-disk entries are refused.
class ZipReader {
 public:
  ZipReader(std::string_view bytes, const Source& source);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  /// The entry named `name`, or nullptr.
  const ZipEntry* find(const std::string& name) const;
  /// The entry's data, its CRC-32 checked.
  std::string_view read(const ZipEntry& entry) const;

 private:
  void read_central_directory(uint64_t offset, uint64_t size, uint64_t count);
  uint64_t data_offset(uint64_t local_header, const std::string& name) const;

  std::string_view bytes_;
  const Source& source_;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> index_;  // name -> first entry so named
};

/// Writes stored entries as torch.save does: each entry's data starts at a
/// multiple of 64 bytes (padding in the local header's extra field, id "FB"),
/// fixed timestamps, so the same entries give the same bytes.
class ZipWriter {
 public:
  ZipWriter(std::ostream& out, const Source& source) : out_(out), source_(source) {}
  void add(const std::string& name, std::string_view data);
  /// Writes the central directory; call once, after the last add.
  void finish();

 private:
  void put(std::string_view bytes);

  std::ostream& out_;
  const Source& source_;
  uint64_t offset_ = 0;
  std::vector<std::pair<ZipEntry, uint64_t>> written_;  // entry, local header offset
};

}  // namespace d2l::serialize
