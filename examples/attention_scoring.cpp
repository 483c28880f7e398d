// The toy examples of d2l's "Attention Scoring Functions" section, in C++.
//
//   attention_scoring [--out DIR] [--no-preview]
//
// Prints every demonstration of the section and writes the attention-weight
// heatmaps as SVG files into DIR (default: ./heatmaps).

#include <d2l/attention.h>
#include <d2l/viz/heatmap.h>
#include <torch/utils.h>


#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <string>

namespace {

// PyTorch-style nested brackets, four decimals: [[0.4000, 0.6000], ...].
std::string format_tensor(const torch::Tensor& x, int depth = 0) {
  if (x.dim() == 0) return fmt::format("{:.4f}", x.item<double>());
  std::string out = "[";
  for (int64_t i = 0; i < x.size(0); ++i) {
    if (i > 0) out += x.dim() > 1 ? fmt::format(",\n{:{}}", "", depth + 1) : ", ";
    out += format_tensor(x[i], depth + 1);
  }
  return out + "]";
}

void show(const std::string& title, const torch::Tensor& t) {
  fmt::print("{} {}\n{}\n\n", title, fmt::join(t.sizes(), "x"),
             format_tensor(t.detach().to(torch::kCPU, torch::kDouble)));
}

struct Args {
  std::filesystem::path out = "heatmaps";
  bool preview = true;
};

Args parse(int argc, char** argv) {
  Args args;
  CLI::App app("The book's toy attention examples: masked softmax, additive and dot-product "
               "attention, their weights as SVG heatmaps.");
  app.add_option("--out", args.out, "where the SVG heatmaps go")->capture_default_str();
  app.add_flag("!--no-preview", args.preview, "no coloured preview in the terminal");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return args;
}

void draw(const Args& args, const torch::Tensor& weights, const std::string& name) {
  // The book reshapes the (2, 1, 10) weights to one panel of 2 queries x 10 keys.
  const auto matrices = weights.reshape({1, 1, 2, 10});
  const auto path = (args.out / (name + ".svg")).string();
  d2l::show_heatmaps(matrices, "Keys", "Queries", path);
  fmt::print("wrote {}\n", path);
  if (args.preview) {
    std::cout << d2l::heatmaps_ansi(matrices,
                                    d2l::HeatmapOptions().xlabel("Keys").ylabel("Queries"))
              << '\n';
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  std::filesystem::create_directories(args.out);
  torch::manual_seed(0);

  fmt::print("== Masked softmax ==\n");
  show("masked_softmax(rand(2, 2, 4), [2, 3]):",
       d2l::masked_softmax(torch::rand({2, 2, 4}), torch::tensor({2, 3})));
  show("masked_softmax(rand(2, 2, 4), [[1, 3], [2, 4]]):",
       d2l::masked_softmax(torch::rand({2, 2, 4}), torch::tensor({{1, 3}, {2, 4}})));

  const auto keys = torch::ones({2, 10, 2});
  const auto values = torch::arange(40, torch::kFloat32).reshape({1, 10, 4}).repeat({2, 1, 1});
  const auto valid_lens = torch::tensor({2, 6});

  fmt::print("== Additive attention ==\n");
  d2l::AdditiveAttention additive(/*key_size=*/2, /*query_size=*/20, /*num_hiddens=*/8,
                                  /*dropout=*/0.1);
  additive->eval();
  std::cout << additive << '\n';
  show("output:", additive(torch::normal(0, 1, {2, 1, 20}), keys, values, valid_lens));
  show("attention_weights:", additive->attention_weights);
  draw(args, additive->attention_weights, "additive_attention");

  fmt::print("\n== Scaled dot-product attention ==\n");
  d2l::DotProductAttention dot(/*dropout=*/0.5);
  dot->eval();
  std::cout << dot << '\n';
  show("output:", dot(torch::normal(0, 1, {2, 1, 2}), keys, values, valid_lens));
  show("attention_weights:", dot->attention_weights);
  draw(args, dot->attention_weights, "dot_product_attention");
  return 0;
}
