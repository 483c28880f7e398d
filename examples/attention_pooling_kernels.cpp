// d2l 1.0's "Attention Pooling by Similarity", in C++ (d2l::v1).
//
//   attention_pooling_kernels [--out DIR] [--seed N]
//
// Draws the section's figures as SVG files into DIR (default:
// ./attention_pooling_out): the four kernels (kernels.svg); the 40 noisy
// training points of y = 2 sin(x) + x, the true function and each kernel's
// Nadaraya–Watson fit (fits.svg), and each kernel's attention weights
// (attention.svg); then the same two for Gaussians of widths 0.1, 0.2, 0.5
// and 1 (fits_sigma.svg, attention_sigma.svg). The data are the book's draws:
// LibTorch's generator seeded with N (default 0) gives the numbers that
// torch.manual_seed(N) gives in Python.

#include <d2l/v1.h>
#include <d2l/viz.h>
#include <torch/torch.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Data {
  torch::Tensor x_train, y_train, x_val, y_val;
};

struct NamedKernel {
  std::string name;
  d2l::v1::Kernel kernel;
};

torch::Tensor f(const torch::Tensor& x) { return 2 * torch::sin(x) + x; }

Data book_data() {
  const int64_t n = 40;
  Data d;
  d.x_train = std::get<0>(torch::sort(torch::rand({n}) * 5));
  d.y_train = f(d.x_train) + torch::randn({n});
  d.x_val = torch::arange(0, 5, 0.1);
  d.y_val = f(d.x_val);
  return d;
}

std::vector<double> to_vector(const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kCPU, torch::kDouble).contiguous().view(-1);
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// The book's figures are one row of four panels (plt.subplots(1, 4)); d2l::viz
// draws one chart per document. Each chart (an <svg> root sized in user
// units) becomes a nested <svg> at its offset in one document.
std::string side_by_side(const std::vector<std::string>& charts, const d2l::PlotOptions& panel) {
  const double width = panel.figsize().first * 72, height = panel.figsize().second * 72;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.2f}\" height=\"{1:.2f}\" "
      "viewBox=\"0 0 {0:.2f} {1:.2f}\">\n",
      width * charts.size(), height);
  for (size_t i = 0; i < charts.size(); ++i) {
    std::string chart = charts[i];
    chart.insert(chart.find("<svg") + 4, fmt::format(" x=\"{:.2f}\" y=\"0\"", width * i));
    out += chart;
  }
  return out + "</svg>\n";
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
  file.close();
  if (!file) throw std::runtime_error("cannot write " + path.string());
  fmt::print("wrote {}\n", path.string());
}

// The panels share their y axis, as the book's sharey=True.
d2l::PlotOptions::Range shared_range(const std::vector<torch::Tensor>& ys) {
  double low = 0, high = 0;
  for (const auto& y : ys) {
    low = std::min(low, y.min().item<double>());
    high = std::max(high, y.max().item<double>());
  }
  const double margin = 0.05 * (high - low);
  return {low - margin, high + margin};
}

// The section's first figure: each kernel on arange(-2.5, 2.5, 0.1).
void draw_kernels(const std::vector<NamedKernel>& kernels, const std::filesystem::path& path) {
  const auto x = torch::arange(-2.5, 2.5, 0.1);
  std::vector<std::string> charts;
  const auto panel = d2l::PlotOptions().figsize({3, 3}).ylim(d2l::PlotOptions::Range(-0.05, 1.05));
  for (const auto& k : kernels) {
    charts.push_back(d2l::plot_svg({{to_vector(x), to_vector(k.kernel(x)), "", "-"}},
                                   d2l::PlotOptions(panel).xlabel(k.name)));
  }
  write_text(path, side_by_side(charts, panel));
}

// The book's plot(...): per kernel, its fit, the truth and the training points
// (attention=False), or its attention weights (attention=True).
void draw_fits(const Data& d, const std::vector<NamedKernel>& kernels,
               const std::filesystem::path& fits_path, const std::filesystem::path& weights_path) {
  std::vector<torch::Tensor> fits, weights;
  for (const auto& k : kernels) {
    auto [y_hat, attention_w] = d2l::v1::nadaraya_watson(d.x_train, d.y_train, d.x_val, k.kernel);
    fmt::print("{:>12}: mean squared error against f {:.4f}\n", k.name,
               (y_hat - d.y_val).pow(2).mean().item<double>());
    fits.push_back(y_hat);
    weights.push_back(attention_w);
  }
  std::vector<torch::Tensor> ys = fits;
  ys.push_back(d.y_train);
  ys.push_back(d.y_val);
  const auto panel = d2l::PlotOptions().figsize({3, 3}).ylim(shared_range(ys));
  std::vector<std::string> charts;
  std::vector<std::string> names;
  for (size_t i = 0; i < kernels.size(); ++i) {
    charts.push_back(d2l::plot_svg({{to_vector(d.x_val), to_vector(fits[i]), "y_hat", "-"},
                                    {to_vector(d.x_val), to_vector(d.y_val), "y", "m--"},
                                    {to_vector(d.x_train), to_vector(d.y_train), "", "o"}},
                                   d2l::PlotOptions(panel).xlabel(kernels[i].name)));
    names.push_back(kernels[i].name);
  }
  write_text(fits_path, side_by_side(charts, panel));
  // One row of panels, one colour scale (the book's shared colorbar).
  d2l::save_heatmaps(torch::stack(weights).unsqueeze(0),
                     d2l::HeatmapOptions()
                         .titles(names)
                         .figsize({3, 3})
                         .xlabel("x_val (queries)")
                         .ylabel("x_train (keys)"),
                     weights_path.string());
  fmt::print("wrote {}\n", weights_path.string());
}

struct Args {
  std::filesystem::path out = "attention_pooling_out";
  uint64_t seed = 0;
};

Args parse(int argc, char** argv) {
  Args args;
  CLI::App app(
      "d2l 1.0's attention pooling by similarity: the kernels, the Nadaraya-Watson fits and "
      "their attention weights as SVG.");
  app.add_option("--out", args.out, "where the SVG pictures go")->capture_default_str();
  app.add_option("--seed", args.seed, "the seed of the data (torch.manual_seed)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return args;
}

void run(const Args& args) {
  std::filesystem::create_directories(args.out);
  torch::manual_seed(args.seed);
  const Data d = book_data();
  const std::vector<NamedKernel> kernels = {{"Gaussian", d2l::v1::gaussian},
                                            {"Boxcar", d2l::v1::boxcar},
                                            {"Constant", d2l::v1::constant},
                                            {"Epanechikov", d2l::v1::epanechikov}};
  draw_kernels(kernels, args.out / "kernels.svg");
  draw_fits(d, kernels, args.out / "fits.svg", args.out / "attention.svg");
  std::vector<NamedKernel> widths;
  for (const double sigma : {0.1, 0.2, 0.5, 1.0}) {
    widths.push_back({fmt::format("Sigma {}", sigma), d2l::v1::gaussian_with_width(sigma)});
  }
  draw_fits(d, widths, args.out / "fits_sigma.svg", args.out / "attention_sigma.svg");
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = parse(argc, argv);
  try {
    run(args);
  } catch (const c10::Error& e) {
    fmt::print(stderr, "attention_pooling_kernels: {}\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "attention_pooling_kernels: {}\n", e.what());
    return 1;
  }
  return 0;
}
