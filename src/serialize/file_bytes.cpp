// FileBytes (file_bytes.h).

#include "serialize/file_bytes.h"

#include <fstream>
#include <istream>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define D2L_HAVE_MMAP 1
#endif

namespace d2l::serialize {

std::string read_all(std::istream& in, const Source& source) {
  // In blocks: a character at a time (istreambuf_iterator) took 0.4 s for a
  // model of 240 MB.
  std::string bytes;
  std::vector<char> block(std::size_t{1} << 20);
  while (in.read(block.data(), static_cast<std::streamsize>(block.size())) || in.gcount() > 0) {
    bytes.append(block.data(), static_cast<std::size_t>(in.gcount()));
    if (!in) break;
  }
  if (in.bad()) source.fail("read failed");
  return bytes;
}

FileBytes::FileBytes(const Source& source) {
#ifdef D2L_HAVE_MMAP
  const int fd = ::open(source.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      const auto size = static_cast<size_t>(st.st_size);
      int flags = MAP_PRIVATE;
#ifdef MAP_POPULATE
      flags |= MAP_POPULATE;  // the whole file is read: map it in one go
#endif
      void* p = ::mmap(nullptr, size, PROT_READ, flags, fd, 0);
      if (p != MAP_FAILED) {
        mapped_ = p;
        mapped_size_ = size;
        view_ = std::string_view(static_cast<const char*>(p), size);
      }
    }
    ::close(fd);
    if (mapped_ != nullptr) return;
  }
#endif
  std::ifstream in(source.path, std::ios::binary);
  if (!in) source.fail("cannot open the file (missing or unreadable)");
  read_ = read_all(in, source);
  view_ = read_;
}

FileBytes::~FileBytes() {
#ifdef D2L_HAVE_MMAP
  if (mapped_ != nullptr) ::munmap(mapped_, mapped_size_);
#endif
}

}  // namespace d2l::serialize
