// Weights trained (here: initialised) in Python, used from C++: loads the
// state dict that examples/python_weights.py saved with the book's PyTorch
// MultiHeadAttention, runs the same inputs through d2l::MultiHeadAttention and
// prints what Python printed, then how far apart the two are.
//
//   /usr/bin/python3 examples/python_weights.py DIR
//   load_python_weights DIR                          (make python-weights)

#include <d2l/attention.h>
#include <d2l/state_dict.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <string>

#include "cli.h"

int main(int argc, char** argv) {
  std::filesystem::path dir = "python_weights";
  double tolerance = 1e-5;
  CLI::App app("Loads the state dict of the book's PyTorch MultiHeadAttention saved by "
               "examples/python_weights.py, runs Python's inputs through "
               "d2l::MultiHeadAttention and compares the outputs.");
  app.add_option("dir", dir, "the folder python_weights.py wrote")->capture_default_str();
  app.add_option("--tolerance", tolerance, "largest difference accepted")
      ->capture_default_str()
      ->check(examples::kTolerance);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    // The book's constructor arguments, in the book's order: key_size,
    // query_size, value_size, num_hiddens, num_heads, dropout.
    d2l::MultiHeadAttention net(100, 100, 100, 100, 5, 0.5);
    net->eval();
    // Key for key: W_q.weight, W_k.weight, W_v.weight, W_o.weight.
    d2l::load_state_dict(*net, (dir / "mha_state_dict.pt").string());
    std::map<std::string, torch::Tensor> io;
    for (auto& [name, tensor] : d2l::read_state_dict((dir / "mha_io.pt").string())) {
      io[name] = tensor;
    }
    torch::NoGradGuard no_grad;
    const auto output = net(io.at("queries"), io.at("keys"), io.at("keys"), io.at("valid_lens"));
    const auto weights = net->last_attention_weights();
    fmt::print("C++ (LibTorch {}): loaded {} into d2l::MultiHeadAttention\n", d2l::torch_version(),
               (dir / "mha_state_dict.pt").string());
    fmt::print("output[0, 0, :5]:");
    for (int64_t j = 0; j < 5; ++j) fmt::print(" {:.5f}", output[0][0][j].item<double>());
    fmt::print("\nattention_weights[0]:\n");
    for (int64_t i = 0; i < weights.size(1); ++i) {
      fmt::print(" ");
      for (int64_t j = 0; j < weights.size(2); ++j) fmt::print(" {:.4f}", weights[0][i][j].item<double>());
      fmt::print("\n");
    }
    const double output_diff = (output - io.at("output")).abs().max().item<double>();
    const double weights_diff = (weights - io.at("attention_weights")).abs().max().item<double>();
    fmt::print("largest difference from Python: output {:.3g}, attention weights {:.3g}\n",
               output_diff, weights_diff);
    if (output_diff > tolerance || weights_diff > tolerance) {
      fmt::print(stderr, "load_python_weights: more than --tolerance {} apart\n", tolerance);
      return 1;
    }
  } catch (const c10::Error& e) {
    fmt::print(stderr, "load_python_weights: {}\n", e.what_without_backtrace());
    return 1;
  } catch (const std::out_of_range&) {
    fmt::print(stderr, "load_python_weights: {} lacks a tensor; run examples/python_weights.py\n",
               (dir / "mha_io.pt").string());
    return 1;
  }
  return 0;
}
