// The library's zip reader (torch.save's container and fra-eng.zip) and
// torch.save's writer. The reader trusts nothing in the archive: every field
// that locates bytes is checked against the bytes held, and counts are
// capped by the bytes that could hold them. Inflate and CRC-32 are zlib's.

#include "serialize/zip.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <limits>

namespace d2l::serialize {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50,
                   kEndOfCentralDir = 0x06054b50, kZip64End = 0x06064b50,
                   kZip64Locator = 0x07064b50;
constexpr uint64_t kLocalHeaderSize = 30, kCentralHeaderSize = 46, kEndSize = 22,
                   kZip64EndSize = 56, kZip64LocatorSize = 20;
constexpr uint64_t kAlignment = 64;
// 1980-01-01 00:00: the earliest DOS date, the same in every file we write.
constexpr uint16_t kDosDate = (1 << 5) | 1;

// zlib's functions take at most 4 GiB - 1 at a time.
constexpr uint64_t kZlibChunk = std::numeric_limits<uInt>::max();
// Deflate's best ratio: 258 bytes from one 2-bit code, about 1032 to 1.
constexpr uint64_t kDeflateMaxRatio = 1032;

uint64_t get(std::string_view b, uint64_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

void append_le(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

void Source::fail(const std::string& what) const { TORCH_CHECK(false, fn, ": ", path, ": ", what); }

uint32_t crc32(std::string_view data, uint32_t crc) {
  uLong value = crc;
  for (uint64_t at = 0; at < data.size(); at += kZlibChunk) {
    const auto n = static_cast<uInt>(std::min<uint64_t>(kZlibChunk, data.size() - at));
    value = ::crc32(value, reinterpret_cast<const Bytef*>(data.data() + at), n);
  }
  return static_cast<uint32_t>(value);
}

ZipReader::ZipReader(std::string_view bytes, const Source& source, ZipMethods methods)
    : bytes_(bytes), source_(source), methods_(methods) {
  const uint64_t n = bytes_.size();
  if (n < kEndSize) {
    source_.fail(fmt::format("not a zip archive: {} bytes is too short (truncated?)", n));
  }
  // The end record is the last 22 bytes plus a comment of up to 65535.
  const uint64_t lowest = n > kEndSize + 0xFFFF ? n - kEndSize - 0xFFFF : 0;
  uint64_t end = n - kEndSize;
  while (get(bytes_, end, 4) != kEndOfCentralDir ||
         end + kEndSize + get(bytes_, end + 20, 2) != n) {
    if (end == lowest) {
      source_.fail("not a zip archive: no end of central directory record (truncated?)");
    }
    --end;
  }
  if (get(bytes_, end + 4, 2) != 0 || get(bytes_, end + 6, 2) != 0) {
    source_.fail("multi-disk zip archives are not supported");
  }
  uint64_t count = get(bytes_, end + 10, 2), size = get(bytes_, end + 12, 4),
           offset = get(bytes_, end + 16, 4);
  if (count == 0xFFFF || size == 0xFFFFFFFF || offset == 0xFFFFFFFF) {
    if (end < kZip64LocatorSize || get(bytes_, end - kZip64LocatorSize, 4) != kZip64Locator) {
      source_.fail("zip64 end of central directory locator is missing");
    }
    const uint64_t at = get(bytes_, end - kZip64LocatorSize + 8, 8);
    if (at > n || n - at < kZip64EndSize || get(bytes_, at, 4) != kZip64End) {
      source_.fail(fmt::format("zip64 end of central directory record at {} is out of bounds", at));
    }
    count = get(bytes_, at + 32, 8);
    size = get(bytes_, at + 40, 8);
    offset = get(bytes_, at + 48, 8);
  }
  if (offset > n || size > n - offset) {
    source_.fail(
        fmt::format("central directory ({} bytes at offset {}) is out of bounds of the "
                    "{}-byte archive (truncated?)",
                    size, offset, n));
  }
  if (count > size / kCentralHeaderSize) {
    source_.fail(fmt::format("central directory of {} bytes cannot hold {} entries", size, count));
  }
  read_central_directory(offset, size, count);
}

void ZipReader::read_central_directory(uint64_t offset, uint64_t size, uint64_t count) {
  const std::string_view cd = bytes_.substr(offset, size);
  uint64_t at = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd.size() - at < kCentralHeaderSize || get(cd, at, 4) != kCentralHeader) {
      source_.fail(
          fmt::format("central directory entry {} at offset {} is malformed", i, offset + at));
    }
    const uint64_t flags = get(cd, at + 8, 2), method = get(cd, at + 10, 2);
    const uint64_t name_len = get(cd, at + 28, 2), extra_len = get(cd, at + 30, 2),
                   comment_len = get(cd, at + 32, 2);
    ZipEntry e;
    e.crc = static_cast<uint32_t>(get(cd, at + 16, 4));
    uint64_t csize = get(cd, at + 20, 4), usize = get(cd, at + 24, 4), local = get(cd, at + 42, 4);
    if (cd.size() - at - kCentralHeaderSize < name_len + extra_len + comment_len) {
      source_.fail(fmt::format("central directory entry {} runs past the directory", i));
    }
    e.name = std::string(cd.substr(at + kCentralHeaderSize, name_len));
    // The zip64 extra field holds, in order, only the sizes and offset whose
    // 32-bit fields are saturated.
    std::string_view extra = cd.substr(at + kCentralHeaderSize + name_len, extra_len);
    while (extra.size() >= 4) {
      const uint64_t id = get(extra, 0, 2), len = get(extra, 2, 2);
      if (len > extra.size() - 4) break;
      if (id == 1) {
        uint64_t pos = 4;
        for (uint64_t* field : {&usize, &csize, &local}) {
          if (*field != 0xFFFFFFFF) continue;
          if (pos + 8 > 4 + len) {
            source_.fail(fmt::format("entry '{}': zip64 extra field is too short", e.name));
          }
          *field = get(extra, pos, 8);
          pos += 8;
        }
      }
      extra = extra.substr(4 + len);
    }
    if (flags & 1) source_.fail(fmt::format("entry '{}' is encrypted", e.name));
    e.method = static_cast<uint16_t>(method);
    e.size = usize;
    e.compressed_size = csize;
    check_method(e);
    e.data_offset = data_offset(local, e.name);
    if (e.data_offset > bytes_.size() || csize > bytes_.size() - e.data_offset) {
      source_.fail(
          fmt::format("entry '{}' ({} bytes at offset {}) is out of bounds of the {}-byte "
                      "archive (truncated?)",
                      e.name, csize, e.data_offset, bytes_.size()));
    }
    index_.emplace(e.name, entries_.size());
    entries_.push_back(std::move(e));
    at += kCentralHeaderSize + name_len + extra_len + comment_len;
  }
}

void ZipReader::check_method(const ZipEntry& e) const {
  if (e.method == 8 && methods_ == ZipMethods::kStoredOrDeflated) {
    if (e.size > kZlibChunk || e.compressed_size > kZlibChunk) {
      source_.fail(fmt::format("entry '{}' is too large to inflate ({} bytes from {}; at most {})",
                               e.name, e.size, e.compressed_size, kZlibChunk));
    }
    if (e.size / kDeflateMaxRatio > e.compressed_size) {
      source_.fail(
          fmt::format("entry '{}' claims {} bytes from {} deflated bytes, more than "
                      "deflate can give (corrupt?)",
                      e.name, e.size, e.compressed_size));
    }
    return;
  }
  if (e.method != 0 && methods_ == ZipMethods::kStoredOrDeflated) {
    source_.fail(
        fmt::format("entry '{}' uses zip compression method {} (only stored and deflated are read)",
                    e.name, e.method));
  }
  if (e.method != 0) {
    source_.fail(
        fmt::format("entry '{}' is compressed (method {}); only stored entries are "
                    "supported, as torch.save writes them",
                    e.name, e.method));
  }
  if (e.compressed_size != e.size) {
    source_.fail(fmt::format("entry '{}' is stored but its sizes differ ({} and {})", e.name,
                             e.compressed_size, e.size));
  }
}

uint64_t ZipReader::data_offset(uint64_t local, const std::string& name) const {
  if (local > bytes_.size() || bytes_.size() - local < kLocalHeaderSize ||
      get(bytes_, local, 4) != kLocalHeader) {
    source_.fail(fmt::format("entry '{}': no local header at offset {}", name, local));
  }
  return local + kLocalHeaderSize + get(bytes_, local + 26, 2) + get(bytes_, local + 28, 2);
}

const ZipEntry* ZipReader::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::string_view ZipReader::inflate(const ZipEntry& entry) const {
  std::string out(entry.size, '\0');
  z_stream zs{};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) {
    source_.fail(fmt::format("entry '{}': zlib could not start inflating", entry.name));
  }
  // Both sizes fit zlib's counters (check_method).
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes_.data() + entry.data_offset));
  zs.avail_in = static_cast<uInt>(entry.compressed_size);
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = ::inflate(&zs, Z_FINISH);
  const std::string why = zs.msg ? fmt::format(" (zlib: {})", zs.msg) : "";
  const uint64_t produced = zs.total_out;
  inflateEnd(&zs);
  if (rc != Z_STREAM_END || produced != entry.size) {
    source_.fail(
        fmt::format("entry '{}' is corrupt: its deflate data does not inflate to its {} bytes{}",
                    entry.name, entry.size, why));
  }
  return inflated_.emplace_back(std::move(out));
}

std::string_view ZipReader::read(const ZipEntry& entry) const {
  const std::string_view data =
      entry.method == 8 ? inflate(entry) : bytes_.substr(entry.data_offset, entry.size);
  // torch.save records 0 for every entry when its CRC-32s are switched off
  // (torch.utils.serialization.config.save.compute_crc32 = False, PyTorch
  // 2.5 and later), and torch.load, which checks none, reads such files: a
  // recorded 0 means "not computed" (an entry whose CRC-32 really is 0,
  // empty ones among them, loses nothing).
  if (entry.crc == 0) return data;
  const uint32_t crc = crc32(data);
  if (crc != entry.crc) {
    source_.fail(fmt::format("entry '{}' is corrupt: CRC-32 {:08x}, expected {:08x}", entry.name,
                             crc, entry.crc));
  }
  return data;
}

void ZipWriter::put(std::string_view bytes) {
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out_) source_.fail("write failed");
  offset_ += bytes.size();
}

void ZipWriter::add(const std::string& name, std::string_view data) {
  const uint64_t start = offset_ + kLocalHeaderSize + name.size() + 4;
  const uint64_t padding = (kAlignment - start % kAlignment) % kAlignment;
  if (name.size() > 0xFFFF || start + padding + data.size() >= 0xFFFFFFFF) {
    source_.fail(fmt::format("entry '{}' would pass 4 GiB; zip64 output is not supported", name));
  }
  ZipEntry e;
  e.name = name;
  e.data_offset = start + padding;
  e.size = e.compressed_size = data.size();
  e.crc = crc32(data);
  std::string header;
  append_le(header, kLocalHeader, 4);
  append_le(header, 20, 2);  // version needed: 2.0
  append_le(header, 0, 2);   // flags
  append_le(header, 0, 2);   // method: stored
  append_le(header, 0, 2);   // time
  append_le(header, kDosDate, 2);
  append_le(header, e.crc, 4);
  append_le(header, e.size, 4);
  append_le(header, e.size, 4);
  append_le(header, name.size(), 2);
  append_le(header, 4 + padding, 2);
  header += name;
  header += "FB";
  append_le(header, padding, 2);
  header.append(padding, 'Z');
  written_.emplace_back(e, offset_);
  put(header);
  put(data);
}

void ZipWriter::finish() {
  const uint64_t cd_offset = offset_;
  for (const auto& [e, local] : written_) {
    std::string h;
    append_le(h, kCentralHeader, 4);
    append_le(h, 20, 2);  // made by: 2.0, MS-DOS attributes
    append_le(h, 20, 2);
    append_le(h, 0, 2);
    append_le(h, 0, 2);
    append_le(h, 0, 2);
    append_le(h, kDosDate, 2);
    append_le(h, e.crc, 4);
    append_le(h, e.size, 4);
    append_le(h, e.size, 4);
    append_le(h, e.name.size(), 2);
    append_le(h, 0, 2);  // extra
    append_le(h, 0, 2);  // comment
    append_le(h, 0, 2);  // disk
    append_le(h, 0, 2);  // internal attributes
    append_le(h, 0, 4);  // external attributes
    append_le(h, local, 4);
    h += e.name;
    put(h);
  }
  const uint64_t cd_size = offset_ - cd_offset;
  if (written_.size() >= 0xFFFF || offset_ >= 0xFFFFFFFF) {
    source_.fail("too many entries or bytes for a zip archive without zip64");
  }
  std::string end;
  append_le(end, kEndOfCentralDir, 4);
  append_le(end, 0, 4);
  append_le(end, written_.size(), 2);
  append_le(end, written_.size(), 2);
  append_le(end, cd_size, 4);
  append_le(end, cd_offset, 4);
  append_le(end, 0, 2);
  put(end);
  out_.flush();
  if (!out_) source_.fail("write failed");
}

}  // namespace d2l::serialize
