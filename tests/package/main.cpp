// Exits 0 only if the library it was built against computes the book's toy
// example correctly (and, where the package has d2l::viz, draws a plot).
#include <d2l/attention.h>
#include <d2l/v1.h>
#ifdef D2L_CONSUMER_USES_VIZ
#include <d2l/viz.h>
#endif

#include <iostream>
#include <string>

int parent_answer();  // parent_untyped.cpp, the parent's own library

int main() {
  const auto keys = torch::ones({2, 10, 2});
  const auto values = torch::arange(40, torch::kFloat).reshape({1, 10, 4}).repeat({2, 1, 1});
  d2l::DotProductAttention attention(0.5);
  attention->eval();
  const auto out = attention(torch::normal(0, 1, {2, 1, 2}), keys, values, torch::tensor({2, 6}));
  const auto expected = torch::tensor({{{2.f, 3.f, 4.f, 5.f}}, {{10.f, 11.f, 12.f, 13.f}}});
  // d2l 1.0's edition, from the installed include/d2l/v1/: a lazy layer's
  // width comes from its first input.
  d2l::v1::MultiHeadAttention heads(8, 2, 0.0);
  const bool lazy_ok =
      heads(torch::ones({1, 3, 5}), keys.narrow(0, 0, 1), keys.narrow(0, 0, 1)).sizes() ==
          torch::IntArrayRef({1, 3, 8}) &&
      heads->W_q->weight.sizes() == torch::IntArrayRef({8, 5});
  const bool ok = torch::allclose(out, expected) && lazy_ok;
  // The consumer's LibTorch headers must be those the library was built with.
  const std::string headers = std::to_string(TORCH_VERSION_MAJOR) + "." +
                              std::to_string(TORCH_VERSION_MINOR) + "." +
                              std::to_string(TORCH_VERSION_PATCH);
  const bool same_torch = headers == d2l::torch_version();
#ifdef D2L_CONSUMER_USES_VIZ
  const bool plots = d2l::plot_svg({{{0, 1}, {0, 1}, "y", "-"}}).rfind("<svg ", 0) == 0;
#else
  const bool plots = true;
#endif
  std::cout << "d2l_attention " << D2L_ATTENTION_VERSION << " on LibTorch " << d2l::torch_version()
            << (ok ? ": ok" : ": WRONG RESULT")
            << (same_torch ? "" : ", but this program was compiled with LibTorch " + headers)
            << (plots ? "" : ", but d2l::plot_svg drew no SVG") << '\n';
  const bool parent = parent_answer() == 42;
  return ok && same_torch && plots && parent ? 0 : 1;
}
