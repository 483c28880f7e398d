#pragma once

// Header-only reader of the golden fixtures written by
// tests/fixtures/generate_fixtures.py (format described in tests/fixtures/README.md):
//
//   # comment
//   scalar <name> <value>
//   tensor <name> <float32|float64|int64> <ndim> <d0> ... <dn-1>
//   <all values in row-major order, separated by single spaces>
//
// Floating values are C99 hex floats (Python's float.hex()), read back exactly
// by std::strtod; int64 values are decimal. Any malformed or missing entry is a
// std::runtime_error naming the file, the line and the entry.

#include <torch/torch.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef D2L_FIXTURE_DIR
#error "D2L_FIXTURE_DIR must be defined (tests/CMakeLists.txt sets it)"
#endif

namespace d2l::testing {

class Fixture {
 public:
  Fixture() = default;
  explicit Fixture(std::string path) : path_(std::move(path)) {}

  /// The file this fixture was read from.
  const std::string& path() const { return path_; }

  /// The tensor stored under `name`; throws std::runtime_error if there is none.
  torch::Tensor tensor(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      throw std::runtime_error("fixture " + path_ + ": no tensor named '" + name + "'");
    }
    return it->second;
  }

  /// The scalar stored under `name`; throws std::runtime_error if there is none.
  double scalar(const std::string& name) const {
    const auto it = scalars_.find(name);
    if (it == scalars_.end()) {
      throw std::runtime_error("fixture " + path_ + ": no scalar named '" + name + "'");
    }
    return it->second;
  }

  bool has_tensor(const std::string& name) const { return tensors_.count(name) != 0; }
  bool has_scalar(const std::string& name) const { return scalars_.count(name) != 0; }

  /// Names of all tensors, sorted.
  std::vector<std::string> tensor_names() const {
    std::vector<std::string> names;
    for (const auto& entry : tensors_) names.push_back(entry.first);
    return names;
  }

  // Used by the parser.
  void add_tensor(const std::string& name, torch::Tensor t) { tensors_[name] = std::move(t); }
  void add_scalar(const std::string& name, double v) { scalars_[name] = v; }

 private:
  std::string path_;
  std::map<std::string, torch::Tensor> tensors_;
  std::map<std::string, double> scalars_;
};

namespace fixture_detail {

[[noreturn]] inline void fail(const std::string& path, std::size_t line, const std::string& what) {
  throw std::runtime_error("fixture " + path + ":" + std::to_string(line) + ": " + what);
}

inline std::vector<std::string> split_spaces(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string word;
  while (in >> word) out.push_back(word);
  return out;
}

inline double parse_double(const std::string& token, const std::string& path, std::size_t line,
                           const std::string& entry) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(token.c_str(), &end);
  if (token.empty() || end != token.c_str() + token.size() || errno == ERANGE) {
    fail(path, line, "entry '" + entry + "': bad floating-point value '" + token + "'");
  }
  return v;
}

inline int64_t parse_int(const std::string& token, const std::string& path, std::size_t line,
                         const std::string& entry) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(token.c_str(), &end, 10);
  if (token.empty() || end != token.c_str() + token.size() || errno == ERANGE) {
    fail(path, line, "entry '" + entry + "': bad integer '" + token + "'");
  }
  return static_cast<int64_t>(v);
}

template <typename T, typename Parse>
void fill(torch::Tensor& t, const std::vector<std::string>& tokens, Parse parse) {
  T* data = t.data_ptr<T>();
  for (std::size_t i = 0; i < tokens.size(); ++i) data[i] = static_cast<T>(parse(tokens[i]));
}

}  // namespace fixture_detail

/// Reads the fixture at `path`; throws std::runtime_error if it cannot be read
/// or is malformed in any way.
inline Fixture load_fixture_file(const std::string& path) {
  using fixture_detail::fail;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("fixture " + path + ": cannot open file");
  Fixture fixture(path);
  std::string line;
  std::size_t lineno = 0;
  std::size_t entries = 0;
  auto claim = [&](const std::string& name) {
    if (fixture.has_tensor(name) || fixture.has_scalar(name)) {
      fail(path, lineno, "duplicate entry '" + name + "'");
    }
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const auto words = fixture_detail::split_spaces(line);
    if (words[0] == "scalar") {
      if (words.size() != 3)
        fail(path, lineno, "expected 'scalar <name> <value>', got '" + line + "'");
      claim(words[1]);
      fixture.add_scalar(words[1], fixture_detail::parse_double(words[2], path, lineno, words[1]));
      ++entries;
    } else if (words[0] == "tensor") {
      if (words.size() < 4) {
        fail(path, lineno, "expected 'tensor <name> <dtype> <ndim> <dims...>', got '" + line + "'");
      }
      const std::string& name = words[1];
      claim(name);
      torch::Dtype dtype;
      if (words[2] == "float32") {
        dtype = torch::kFloat32;
      } else if (words[2] == "float64") {
        dtype = torch::kFloat64;
      } else if (words[2] == "int64") {
        dtype = torch::kInt64;
      } else {
        fail(path, lineno, "entry '" + name + "': unknown dtype '" + words[2] + "'");
      }
      const int64_t ndim = fixture_detail::parse_int(words[3], path, lineno, name);
      if (ndim < 0 || static_cast<std::size_t>(ndim) + 4 != words.size()) {
        fail(path, lineno,
             "entry '" + name + "': ndim " + words[3] + " does not match the " +
                 std::to_string(words.size() - 4) + " sizes given");
      }
      std::vector<int64_t> sizes;
      int64_t numel = 1;
      for (int64_t d = 0; d < ndim; ++d) {
        const int64_t size = fixture_detail::parse_int(words[4 + d], path, lineno, name);
        if (size < 0) fail(path, lineno, "entry '" + name + "': negative size " + words[4 + d]);
        sizes.push_back(size);
        numel *= size;
      }
      std::string values_line;
      if (!std::getline(in, values_line)) {
        fail(path, lineno, "entry '" + name + "': missing the line of values");
      }
      ++lineno;
      if (!values_line.empty() && values_line.back() == '\r') values_line.pop_back();
      const auto tokens = fixture_detail::split_spaces(values_line);
      if (static_cast<int64_t>(tokens.size()) != numel) {
        fail(path, lineno,
             "entry '" + name + "': expected " + std::to_string(numel) + " values, got " +
                 std::to_string(tokens.size()));
      }
      auto t = torch::empty(sizes, torch::TensorOptions().dtype(dtype));
      auto as_double = [&](const std::string& s) {
        return fixture_detail::parse_double(s, path, lineno, name);
      };
      auto as_int = [&](const std::string& s) {
        return fixture_detail::parse_int(s, path, lineno, name);
      };
      if (dtype == torch::kFloat32) {
        // A float32 entry must hold float32 values: catches a float64 tensor
        // written under the wrong dtype.
        auto as_float = [&](const std::string& s) {
          const double v = as_double(s);
          if (static_cast<double>(static_cast<float>(v)) != v) {
            fail(path, lineno,
                 "entry '" + name + "': value '" + s + "' is not exactly representable in float32");
          }
          return v;
        };
        fixture_detail::fill<float>(t, tokens, as_float);
      } else if (dtype == torch::kFloat64) {
        fixture_detail::fill<double>(t, tokens, as_double);
      } else {
        fixture_detail::fill<int64_t>(t, tokens, as_int);
      }
      fixture.add_tensor(name, t);
      ++entries;
    } else {
      fail(path, lineno, "unknown line kind '" + words[0] + "' (expected scalar, tensor or #)");
    }
  }
  if (in.bad()) throw std::runtime_error("fixture " + path + ": read error");
  if (entries == 0) throw std::runtime_error("fixture " + path + ": no entries");
  return fixture;
}

/// Reads D2L_FIXTURE_DIR "/" name ".txt".
inline Fixture load_fixture(const std::string& name) {
  return load_fixture_file(std::string(D2L_FIXTURE_DIR) + "/" + name + ".txt");
}

}  // namespace d2l::testing
