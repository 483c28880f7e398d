// The book's multi-head attention ("Multi-Head Attention", d2l 0.17): five
// heads over 100 hidden units on the book's toy batch, the output's shape as
// the book prints it, and the attention weights of every head as heatmaps.
//
//   multi_head_attention [--out DIR]

#include <d2l/attention.h>
#include <d2l/viz/heatmap.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::filesystem::path out = "multi_head_out";
  CLI::App app("The book's multi-head attention: 5 heads over 100 hidden units, the output's "
               "shape, and each head's attention weights as SVG heatmaps.");
  app.add_option("--out", out, "where the SVG heatmaps go")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::filesystem::create_directories(out);
  torch::manual_seed(0);

  // The book's cell: num_hiddens 100, 5 heads, dropout 0.5, in eval mode.
  const int64_t num_hiddens = 100, num_heads = 5;
  d2l::MultiHeadAttention attention(num_hiddens, num_hiddens, num_hiddens, num_hiddens, num_heads,
                                    0.5);
  attention->eval();
  std::cout << attention << '\n';
  const int64_t batch_size = 2, num_queries = 4, num_kvpairs = 6;
  const auto valid_lens = torch::tensor({3, 2});
  const auto X = torch::ones({batch_size, num_queries, num_hiddens});
  const auto Y = torch::ones({batch_size, num_kvpairs, num_hiddens});
  const auto output = attention(X, Y, Y, valid_lens);
  fmt::print("attention(X, Y, Y, valid_lens).shape: ({})\n", fmt::join(output.sizes(), ", "));

  // With the book's all-ones inputs every head weighs the valid keys alike;
  // random queries and keys show the heads differing.
  const auto queries = torch::randn({batch_size, num_queries, num_hiddens});
  const auto keys = torch::randn({batch_size, num_kvpairs, num_hiddens});
  attention(queries, keys, keys, valid_lens);
  // (B * heads, n, m) as the book keeps it; a row of panels per example.
  const auto weights =
      attention->last_attention_weights().reshape({batch_size, num_heads, num_queries, num_kvpairs});
  std::vector<std::string> titles;
  for (int64_t h = 1; h <= num_heads; ++h) titles.push_back(fmt::format("Head {}", h));
  const auto path = (out / "heads.svg").string();
  d2l::show_heatmaps(weights, "Keys", "Queries", path, titles);
  fmt::print("wrote {} (rows: the two examples, valid lengths 3 and 2; columns: the heads)\n",
             path);
  return 0;
}
