// The zip reader of d2l::read_data_nmt (src/nmt_zip.h).

#include "nmt_zip.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <zlib.h>

#include <cstdint>
#include <string_view>

namespace d2l::detail {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  TORCH_CHECK(false, fmt::format("d2l::read_data_nmt: {}: {}", path, what));
}

uint32_t le32(std::string_view b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}
uint16_t le16(std::string_view b, size_t at) {
  return static_cast<uint16_t>(static_cast<unsigned char>(b[at]) |
                               (static_cast<unsigned char>(b[at + 1]) << 8));
}

std::string inflate_raw(std::string_view data, uint64_t size, const std::string& path) {
  // d2l's fra.txt inflates to 11 MB; a size past 1 GiB is a corrupt or hostile header.
  if (size > (uint64_t{1} << 30)) {
    fail(path, fmt::format("fra.txt in the archive claims {} bytes, more than 1 GiB", size));
  }
  std::string out(size, '\0');
  z_stream zs{};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) fail(path, "zlib could not start inflating");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&zs, Z_FINISH);
  const auto produced = zs.total_out;
  inflateEnd(&zs);
  if (rc != Z_STREAM_END || produced != size) {
    fail(path, "fra.txt in the archive is corrupt (deflate data does not inflate to its size)");
  }
  return out;
}

}  // namespace

// The entry ".../fra.txt" of a zip archive, stored or deflated. Every offset
// is checked against the archive's size before it is read.
std::string read_zip_entry(const std::string& bytes, const std::string& path) {
  const std::string_view b(bytes);
  constexpr size_t kEocd = 22;
  if (b.size() < kEocd) fail(path, "not a zip archive (too short)");
  size_t eocd = std::string_view::npos;
  for (size_t at = b.size() - kEocd + 1; at-- > 0 && b.size() - at <= kEocd + 65535;) {
    if (le32(b, at) == 0x06054b50) {
      eocd = at;
      break;
    }
  }
  if (eocd == std::string_view::npos) fail(path, "not a zip archive (no end of central directory)");
  const uint64_t count = le16(b, eocd + 10);
  uint64_t at = le32(b, eocd + 16);
  for (uint64_t i = 0; i < count; ++i) {
    if (at + 46 > b.size() || le32(b, at) != 0x02014b50)
      fail(path, "corrupt zip central directory");
    const uint16_t method = le16(b, at + 10);
    const uint32_t crc = le32(b, at + 16);
    const uint64_t csize = le32(b, at + 20), usize = le32(b, at + 24);
    const uint64_t name_len = le16(b, at + 28), extra_len = le16(b, at + 30),
                   comment_len = le16(b, at + 32);
    const uint64_t local = le32(b, at + 42);
    if (at + 46 + name_len > b.size()) fail(path, "corrupt zip central directory");
    const std::string name(b.substr(at + 46, name_len));
    at += 46 + name_len + extra_len + comment_len;
    if (name != "fra.txt" && (name.size() < 8 || name.compare(name.size() - 8, 8, "/fra.txt") != 0))
      continue;
    if (local + 30 > b.size() || le32(b, local) != 0x04034b50)
      fail(path, "corrupt zip local header");
    const uint64_t data = local + 30 + le16(b, local + 26) + le16(b, local + 28);
    if (data + csize > b.size())
      fail(path, fmt::format("{} runs past the end of the archive", name));
    if (method != 0 && method != 8) {
      fail(path,
           fmt::format("{} uses zip compression method {} (only stored and deflated are read)",
                       name, method));
    }
    std::string text = method == 0 ? std::string(b.substr(data, csize))
                                   : inflate_raw(b.substr(data, csize), usize, path);
    const auto actual =
        ::crc32(0L, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size()));
    if (actual != crc)
      fail(path, fmt::format("{} in the archive is corrupt (CRC-32 mismatch)", name));
    return text;
  }
  fail(path, "the archive holds no fra.txt");
}


}  // namespace d2l::detail
