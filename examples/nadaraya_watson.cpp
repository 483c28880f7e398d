// d2l's Nadaraya–Watson kernel regression ("Attention Pooling"), in C++.
//
//   nadaraya_watson [--out DIR]
//
// Fits the book's synthetic data y = 2 sin(x) + x^0.8 + noise with the
// non-parametric pooling, then trains the parametric NWKernelRegression, and
// writes the fits, the training loss and the attention weights as SVG files
// into DIR (default: ./nadaraya_watson_out).

#include <d2l/attention.h>
#include <d2l/viz.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <vector>

namespace {

struct Data {
  torch::Tensor x_train, y_train, x_test, y_truth;
};

torch::Tensor f(const torch::Tensor& x) { return 2 * torch::sin(x) + x.pow(0.8); }

Data make_data() {
  const int64_t n_train = 50;
  Data d;
  d.x_train = std::get<0>(torch::sort(torch::rand({n_train}) * 5));
  d.y_train = f(d.x_train) + torch::normal(0.0, 0.5, {n_train});
  d.x_test = torch::arange(0, 5, 0.1);
  d.y_truth = f(d.x_test);
  return d;
}

std::vector<double> to_vector(const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kCPU, torch::kDouble).contiguous().view(-1);
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// Calls write(path) for the file `name` in `dir`, then says where it went.
template <typename Write>
void write_file(const std::filesystem::path& dir, const std::string& name, Write&& write) {
  const auto path = (dir / name).string();
  write(path);
  fmt::print("wrote {}\n", path);
}

// The book's plot_kernel_reg: truth, prediction and the training points.
void plot_kernel_reg(const Data& d, const torch::Tensor& y_hat, const std::string& path) {
  using Range = d2l::PlotOptions::Range;
  d2l::save_plot({{to_vector(d.x_test), to_vector(d.y_truth), "Truth", "-"},
                  {to_vector(d.x_test), to_vector(y_hat), "Pred", "m--"},
                  {to_vector(d.x_train), to_vector(d.y_train), "", "o"}},
                 d2l::PlotOptions().xlabel("x").ylabel("y").xlim(Range(0, 5)).ylim(Range(-1, 5)),
                 path);
}

void show_weights(const torch::Tensor& weights, const std::string& path) {
  d2l::show_heatmaps(weights.detach().unsqueeze(0).unsqueeze(0), "Sorted training inputs",
                     "Sorted testing inputs", path);
}

// Row i of the result holds every training point except the i-th, so that no
// point predicts itself (the book's `X_tile[(1 - torch.eye(n_train)).type(torch.bool)]`).
torch::Tensor leave_one_out(const torch::Tensor& t) {
  const int64_t n = t.size(0);
  return t.repeat({n, 1}).index({(1 - torch::eye(n)).to(torch::kBool)}).reshape({n, -1});
}

// The book's training loop: summed squared error, SGD with lr 0.5, 5 epochs.
std::vector<double> train(d2l::NWKernelRegression& net, const Data& d) {
  const auto keys = leave_one_out(d.x_train), values = leave_one_out(d.y_train);
  torch::optim::SGD trainer(net->parameters(), torch::optim::SGDOptions(0.5));
  namespace F = torch::nn::functional;
  std::vector<double> losses;
  for (int epoch = 1; epoch <= 5; ++epoch) {
    trainer.zero_grad();
    const auto l =
        F::mse_loss(net(d.x_train, keys, values), d.y_train, F::MSELossFuncOptions(torch::kNone));
    l.sum().backward();
    trainer.step();
    losses.push_back(l.sum().item<double>());
    fmt::print("epoch {}, loss {:.6f}\n", epoch, losses.back());
  }
  return losses;
}

std::filesystem::path parse(int argc, char** argv) {
  std::filesystem::path out = "nadaraya_watson_out";
  CLI::App app("The book's Nadaraya-Watson regression: training progress, the fits and the "
               "attention weights as SVG.");
  app.add_option("--out", out, "where the SVG pictures go")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return out;
}

void run(const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  torch::manual_seed(0);
  const Data d = make_data();
  const int64_t n_test = d.x_test.size(0);

  fmt::print("== Non-parametric attention pooling ==\n");
  auto [y_hat, weights] = d2l::functional::nadaraya_watson(d.x_test, d.x_train, d.y_train);
  fmt::print("mean squared error against the truth: {:.4f}\n",
             (y_hat - d.y_truth).pow(2).mean().item<double>());
  write_file(out, "nonparametric_fit.svg", [&](auto& path) { plot_kernel_reg(d, y_hat, path); });
  write_file(out, "nonparametric_weights.svg", [&](auto& path) { show_weights(weights, path); });

  fmt::print("\n== Parametric attention pooling (NWKernelRegression) ==\n");
  d2l::NWKernelRegression net;
  fmt::print("initial w {:.4f}\n", net->w.item<double>());
  const auto losses = train(net, d);
  fmt::print("learned w {:.4f}\n", net->w.item<double>());
  std::vector<double> epochs;
  for (size_t e = 1; e <= losses.size(); ++e) epochs.push_back(static_cast<double>(e));
  write_file(out, "training_loss.svg", [&](auto& path) {
    const auto options =
        d2l::PlotOptions().xlabel("epoch").ylabel("loss").xlim(d2l::PlotOptions::Range(1, 5));
    d2l::save_plot({{epochs, losses, "", "-"}}, options, path);
  });

  // Every test input attends to all training points.
  const auto y_param = net(d.x_test, d.x_train.repeat({n_test, 1}), d.y_train.repeat({n_test, 1}));
  fmt::print("mean squared error against the truth: {:.4f}\n",
             (y_param - d.y_truth).pow(2).mean().item<double>());
  write_file(out, "parametric_fit.svg", [&](auto& path) { plot_kernel_reg(d, y_param, path); });
  write_file(out, "parametric_weights.svg",
             [&](auto& path) { show_weights(net->attention_weights, path); });
}

}  // namespace

int main(int argc, char** argv) {
  const auto out = parse(argc, argv);
  try {
    run(out);
  } catch (const c10::Error& e) {
    fmt::print(stderr, "nadaraya_watson: {}\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "nadaraya_watson: {}\n", e.what());
    return 1;
  }
  return 0;
}
