#pragma once

// The library's one zip reader, for torch.save's container (PyTorch >= 1.6;
// stored entries) and d2l's fra-eng.zip (stored or deflated): a
// bounds-checked reader of the central directory on zlib's inflate and
// CRC-32, and torch.save's writer (README, "Loading weights trained in
// Python"). Not LibTorch's PyTorchStreamReader: it reads only torch.save's
// layout (one top-level folder and its version record) and words its errors
// as its own.

#include <cstdint>
#include <deque>
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

/// CRC-32 (ISO-HDLC: zlib's crc32), continuing from `crc`.
uint32_t crc32(std::string_view data, uint32_t crc = 0);

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;      // of the first data byte in the archive
  uint64_t size = 0;             // of the data once read (inflated)
  uint64_t compressed_size = 0;  // in the archive; `size` for a stored entry
  uint16_t method = 0;           // 0 stored, 8 deflated
  uint32_t crc = 0;
};

/// The compression methods a ZipReader accepts.
enum class ZipMethods { kStored, kStoredOrDeflated };

/// The entries of a zip archive held in memory. Every offset and length is
/// checked against the bytes before use; zip64 records are understood;
/// encrypted and multi-disk entries are refused, and so are compressed ones
/// unless `methods` allows deflate.
class ZipReader {
 public:
  ZipReader(std::string_view bytes, const Source& source, ZipMethods methods = ZipMethods::kStored);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  /// The entry named `name`, or nullptr.
  const ZipEntry* find(const std::string& name) const;
  /// The entry's data, its CRC-32 checked unless the archive records 0 (not
  /// computed, as torch.save writes it on request): a view into the archive's bytes,
  /// or, for a deflated entry, into the inflated copy that the reader keeps
  /// for as long as it lives (so a reader is not for concurrent use).
  std::string_view read(const ZipEntry& entry) const;

 private:
  void read_central_directory(uint64_t offset, uint64_t size, uint64_t count);
  void check_method(const ZipEntry& e) const;
  uint64_t data_offset(uint64_t local_header, const std::string& name) const;
  std::string_view inflate(const ZipEntry& entry) const;

  std::string_view bytes_;
  const Source& source_;
  ZipMethods methods_;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> index_;  // name -> first entry so named
  mutable std::deque<std::string> inflated_;
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
