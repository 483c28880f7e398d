// Exits 0 only if the library it was built against computes the book's toy
// example correctly.
#include <d2l/attention.h>

#include <iostream>

int main() {
  const auto keys = torch::ones({2, 10, 2});
  const auto values = torch::arange(40, torch::kFloat).reshape({1, 10, 4}).repeat({2, 1, 1});
  d2l::DotProductAttention attention(0.5);
  attention->eval();
  const auto out = attention(torch::normal(0, 1, {2, 1, 2}), keys, values, torch::tensor({2, 6}));
  const auto expected = torch::tensor({{{2.f, 3.f, 4.f, 5.f}}, {{10.f, 11.f, 12.f, 13.f}}});
  const bool ok = torch::allclose(out, expected);
  std::cout << "d2l_attention " << D2L_ATTENTION_VERSION << (ok ? ": ok" : ": WRONG RESULT") << '\n';
  return ok ? 0 : 1;
}
