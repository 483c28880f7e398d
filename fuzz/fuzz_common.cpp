// fuzz_attention's shared helpers (declared in fuzz_common.h): the report of a
// finding, the makers of inputs and the checks of results.

#include "fuzz_common.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace d2l_fuzz {

Call current;

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::cerr << "\nFUZZ FINDING: " << what << " " << detail << "\nin " << current.description
            << "\n";
  for (const auto& [name, t] : current.tensors) {
    std::cerr << name << ": ";
    if (t.defined()) {
      std::cerr << c10::toString(t.scalar_type()) << " sizes " << t.sizes() << " strides "
                << t.strides() << "\n"
                << t << "\n";
    } else {
      std::cerr << "undefined\n";
    }
  }
  std::abort();
}

namespace {

const std::vector<torch::Dtype> kLengthDtypes = {
    torch::kLong,  torch::kLong,   torch::kInt,  torch::kShort,    torch::kChar, torch::kByte,
    torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kBool};
const std::vector<double> kSpecials = {0.0,  -0.0,  1e30,   -1e30, kInf,  -kInf,
                                       kNaN, 65504, -65504, 3e38,  1e308, 5e-324};

// Normal values in [-4, 4] at one of three scales, with up to three special
// values (huge, infinite, NaN, subnormal) at chosen positions.
torch::Tensor make_values(Bytes& in, torch::IntArrayRef shape, torch::Dtype dtype) {
  const auto generator = at::detail::createCPUGenerator(in.byte());
  const double scale = in.pick<double>({1.0, 0.5, 1e-2});
  auto t = (at::randn(shape, generator, torch::kDouble) * scale).clamp(-4, 4).contiguous();
  const int64_t specials = in.below(4);
  for (int64_t s = 0; s < specials && t.numel() > 0; ++s) {
    const int64_t at = in.u16() % t.numel();
    t.data_ptr<double>()[at] = in.pick(kSpecials);
  }
  if (dtype == torch::kBool) return t > 0;
  if (!at::isFloatingType(dtype)) t = t.nan_to_num(0, 100, -100).round();
  return t.to(dtype);
}

// `t`'s values behind one of several memory layouts: contiguous, transposed,
// permuted, a narrow window with NaN (or 7) around it, expanded from one batch
// entry, or every other element.
Arg lay_out(Bytes& in, const torch::Tensor& t, bool requires_grad) {
  const int64_t rank = t.dim();
  const int64_t layout = rank == 0 ? 0 : in.below(6);
  const int64_t a = rank == 0 ? 0 : in.below(rank), b = rank == 0 ? 0 : in.below(rank);
  const int64_t last = rank - 1;
  std::vector<int64_t> reversed;
  for (int64_t i = rank - 1; i >= 0; --i) reversed.push_back(i);
  torch::Tensor leaf;
  switch (layout) {
    case 1: leaf = t.transpose(a, b).contiguous(); break;
    case 2: leaf = t.permute(reversed).contiguous(); break;
    case 3: {
      auto pad_shape = t.sizes().vec();
      pad_shape[last] = 1;
      const auto pad = torch::full(pad_shape, floating(t) ? kNaN : 7.0, t.options());
      leaf = torch::cat({pad, t, pad}, last);
      break;
    }
    case 4: leaf = t.size(0) > 0 ? t.narrow(0, 0, 1).clone() : t.clone(); break;
    case 5: {
      auto wide = t.sizes().vec();
      wide[last] *= 2;
      leaf = torch::zeros(wide, t.options());
      leaf.slice(last, 0, wide[last], 2).copy_(t);
      break;
    }
    default: leaf = t.clone(); break;
  }
  leaf = leaf.detach();
  if (requires_grad && floating(leaf)) leaf.requires_grad_(true);
  torch::Tensor value;
  switch (layout) {
    case 1: value = leaf.transpose(a, b); break;
    case 2: value = leaf.permute(reversed); break;
    case 3: value = leaf.narrow(last, 1, t.size(last)); break;
    case 4: value = t.size(0) > 0 ? leaf.expand(t.sizes()) : leaf; break;
    case 5: value = leaf.slice(last, 0, leaf.size(last), 2); break;
    default: value = leaf; break;
  }
  return {leaf, value};
}

// One length: small, negative, the int64 extremes, a fraction or a huge or
// non-finite float.
double length_value(Bytes& in, int64_t m) {
  switch (in.below(10)) {
    case 5: return -1.0 - static_cast<double>(in.below(3));
    case 6: return static_cast<double>(std::numeric_limits<int64_t>::max());
    case 7: return static_cast<double>(std::numeric_limits<int64_t>::min());
    case 8: return static_cast<double>(in.below(m + 2)) + 0.5;
    case 9:
      return in.pick<double>({1e20, 9.3e18, 9223372036854775808.0, 9007199254740993.0, kInf, kNaN});
    default: return static_cast<double>(in.below(m + 3));
  }
}

}  // namespace

bool floating(const torch::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

bool tame(const torch::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return true;
  const auto d = t.detach().to(torch::kDouble);
  return d.isfinite().all().item<bool>() && d.abs().max().item<double>() <= 4;
}

bool all_finite(const torch::Tensor& t) {
  return !t.defined() || t.detach().to(torch::kDouble).isfinite().all().item<bool>();
}

// Sizes 0 to 9 mostly; the top six byte values give 11 to 36, so that the
// kernels' blocks are reached too (the flash kernels take 11 queries or more
// in blocks, fewer row by row) without changing what other bytes mean.
std::vector<int64_t> dims(Bytes& in, int64_t rank) {
  std::vector<int64_t> shape;
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t b = in.byte();
    shape.push_back(b < 250 ? b % 10 : 11 + (b - 250) * 5);
  }
  return shape;
}

Arg make_arg(Bytes& in, torch::IntArrayRef shape, torch::Dtype dtype, bool requires_grad) {
  return lay_out(in, make_values(in, shape, dtype), requires_grad);
}

torch::Tensor make_lengths(Bytes& in, int64_t B, int64_t n, int64_t m) {
  const int64_t kind = in.below(8);
  if (kind < 2) return {};
  std::vector<int64_t> shape;
  if (kind < 4)
    shape = {B};
  else if (kind < 6 || kind == 7)
    shape = {B, n};
  else
    shape = dims(in, in.below(3));
  const auto dtype = in.pick(kLengthDtypes);
  int64_t count = 1;
  for (auto s : shape) count *= s;
  std::vector<double> values;
  for (int64_t i = 0; i < count; ++i) values.push_back(length_value(in, m));
  auto lens = torch::tensor(values, torch::kDouble).reshape(shape);
  if (at::isIntegralType(dtype, /*includeBool=*/false)) {
    // Through int64 (saturating) so that narrower types wrap as C++ casts do.
    const auto saturated = lens.nan_to_num(0, 9.2e18, -9.2e18).clamp(-9.2e18, 9.2e18);
    lens = saturated.to(torch::kLong).to(dtype);
  } else {
    lens = lens.to(dtype);
  }
  if (kind == 7) lens = lens.t().contiguous().t();
  return lens;
}

torch::Tensor valid_mask(const torch::Tensor& lens, int64_t B, int64_t n, int64_t m) {
  if (!lens.defined()) return torch::ones({B, n, m}, torch::kBool);
  FUZZ_CHECK((lens.dim() == 1 && lens.size(0) == B) ||
                 (lens.dim() == 2 && lens.size(0) == B && lens.size(1) == n),
             "lengths of a wrong shape were accepted");
  const auto l = lens.to(torch::kDouble).reshape({B, lens.dim() == 1 ? 1 : n, 1});
  return (torch::arange(m, torch::kDouble).view({1, 1, m}) < l).expand({B, n, m});
}

double sum_tolerance(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kDouble: return 1e-9;
    case torch::kFloat: return 1e-4;
    case torch::kHalf: return 1e-2;
    default: return 5e-2;
  }
}

void check_weights(const torch::Tensor& w, const torch::Tensor& valid, bool finite_expected) {
  const auto wd = w.detach().to(torch::kDouble);
  FUZZ_CHECK(wd.sizes() == valid.sizes(), "weights have the wrong shape");
  FUZZ_CHECK(wd.masked_select(valid.logical_not()).eq(0).all().item<bool>(),
             "masked weight is not exactly 0");
  if (!finite_expected) return;
  FUZZ_CHECK(wd.isfinite().all().item<bool>(), "weights not finite for finite scores");
  const auto sums = wd.sum(-1);
  const auto expected = valid.any(-1).to(torch::kDouble);
  FUZZ_CHECK(sums.numel() == 0 ||
                 (sums - expected).abs().max().item<double>() <= sum_tolerance(w.scalar_type()),
             "weights do not sum to 1 (or 0 for rows without valid keys)");
}

void check_backward(const torch::Tensor& out, const std::vector<torch::Tensor>& leaves,
                    bool finite_expected, Bytes& in) {
  if (!out.requires_grad() || !in.flag()) return;
  const auto G = torch::rand(out.sizes(), torch::kDouble).mul(2).sub(1).to(out.scalar_type());
  out.backward(G);
  if (!finite_expected) return;
  for (const auto& leaf : leaves) {
    FUZZ_CHECK(all_finite(leaf.grad()), "gradient not finite for finite inputs");
  }
}

GradMode pick_grad_mode(Bytes& in) {
  const int64_t m = in.below(4);
  return m == 2 ? GradMode::kNoGrad : m == 3 ? GradMode::kInference : GradMode::kEnabled;
}

QKVArgs make_qkv(Bytes& in, bool same_feature_size) {
  auto d = dims(in, 6);  // B, n, m, dq, dk, dv
  const int64_t B = d[0], n = d[1], m = d[2], dq = d[3];
  const int64_t dk = same_feature_size ? dq : d[4], dv = d[5];
  std::vector<int64_t> qs{B, n, dq}, ks{B, m, dk}, vs{B, m, dv};
  auto dtype = in.pick(kDataDtypes);
  auto key_dtype = dtype;
  switch (in.below(16)) {
    case 0: qs[0] += 1; break;
    case 1: vs[1] += 1; break;
    case 2: ks[2] += 1; break;
    case 3: vs.pop_back(); break;
    case 4: key_dtype = in.pick(kDataDtypes); break;
    default: break;
  }
  const bool grad = in.flag();
  QKVArgs args{make_arg(in, qs, dtype, grad), make_arg(in, ks, key_dtype, grad),
               make_arg(in, vs, dtype, grad), make_lengths(in, B, n, m), false};
  args.tame_inputs = tame(args.queries.value) && tame(args.keys.value) && tame(args.values.value);
  note("queries", args.queries.value);
  note("keys", args.keys.value);
  note("values", args.values.value);
  note("valid_lens", args.lens);
  return args;
}

}  // namespace d2l_fuzz
