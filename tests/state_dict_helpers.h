#pragma once

// Helpers of the state-dict tests (test_state_dict*.cpp): fixture paths and
// files as bytes.

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#ifndef D2L_FIXTURE_DIR
#error "D2L_FIXTURE_DIR must be defined (tests/CMakeLists.txt sets it)"
#endif

namespace d2l::testing {

inline std::string fixture_path(const std::string& file) {
  return std::string(D2L_FIXTURE_DIR) + "/" + file;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace d2l::testing
