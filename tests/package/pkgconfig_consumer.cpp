// Built with nothing but `pkg-config --cflags --libs d2l_attention` against an
// installed d2l_attention (tests/debian_package.sh): exits 0 only if the
// book's toy example comes out right and the headers' version is the
// library's.
#include <d2l/attention.h>

#include <iostream>

int main() {
  const auto keys = torch::ones({2, 10, 2});
  const auto values = torch::arange(40, torch::kFloat).reshape({1, 10, 4}).repeat({2, 1, 1});
  d2l::MultiHeadAttention attention(2, 2, 4, 4, 2, 0.0);
  attention->eval();
  const auto out = attention(torch::normal(0, 1, {2, 1, 2}), keys, values, torch::tensor({2, 6}));
  const bool shape_ok = out.sizes() == torch::IntArrayRef({2, 1, 4});
  d2l::DotProductAttention dot(0.5);
  dot->eval();
  const auto pooled = dot(torch::normal(0, 1, {2, 1, 2}), keys, values, torch::tensor({2, 6}));
  const auto expected = torch::tensor({{{2.f, 3.f, 4.f, 5.f}}, {{10.f, 11.f, 12.f, 13.f}}});
  const bool ok = shape_ok && torch::allclose(pooled, expected);
  std::cout << "pkg-config consumer: d2l_attention " << D2L_ATTENTION_VERSION << " on LibTorch "
            << d2l::torch_version() << (ok ? ": ok" : ": WRONG RESULT") << '\n';
  return ok ? 0 : 1;
}
