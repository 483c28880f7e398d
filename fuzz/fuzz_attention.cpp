// libFuzzer target: every public function and module of the library, driven
// with arbitrary shapes (empty batches, zero keys), lengths (negative, zero,
// huge, every integer dtype, fractions, bool, wrong shapes), dtypes, strided,
// transposed and expanded inputs, dropout, train and eval, grad modes.
//
// The contract checked: a call either returns or throws c10::Error. When it
// returns, masked positions hold exactly what they must, results are finite
// where the inputs make that possible, and backward gives finite gradients.
// Anything else (another exception, a crash, a sanitizer report, a broken
// invariant) aborts, which libFuzzer reports as a finding.
//
// Input format (fuzz/make_seeds.py writes seeds in it): the bytes are read
// front to back, one byte per choice; past the end every byte reads as 0, so
// every prefix of an input is itself an input.

#include <d2l/attention.h>
#include <d2l/viz/heatmap.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The call under test and its arguments, printed with a finding.
struct Call {
  std::string description;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};
Call current;

void note(const std::string& name, const torch::Tensor& t) { current.tensors.emplace_back(name, t); }

[[noreturn]] void finding(const char* what, const std::string& detail = "") {
  std::cerr << "\nFUZZ FINDING: " << what << " " << detail << "\nin " << current.description << "\n";
  for (const auto& [name, t] : current.tensors) {
    std::cerr << name << ": ";
    if (t.defined()) {
      std::cerr << c10::toString(t.scalar_type()) << " sizes " << t.sizes() << " strides "
                << t.strides() << "\n" << t << "\n";
    } else {
      std::cerr << "undefined\n";
    }
  }
  std::abort();
}

#define FUZZ_CHECK(cond, what) \
  do {                         \
    if (!(cond)) finding(what, "(" #cond ")"); \
  } while (false)

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  int64_t below(int64_t n) { return byte() % n; }
  bool flag() { return (byte() & 1) != 0; }
  int64_t u16() {
    const int64_t lo = byte();
    return lo | (int64_t{byte()} << 8);
  }
  template <typename T>
  T pick(const std::vector<T>& options) {
    return options[static_cast<size_t>(below(static_cast<int64_t>(options.size())))];
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

const std::vector<torch::Dtype> kDataDtypes = {torch::kFloat, torch::kFloat,    torch::kDouble,
                                               torch::kHalf,  torch::kBFloat16, torch::kLong,
                                               torch::kInt,   torch::kBool};
const std::vector<torch::Dtype> kLengthDtypes = {
    torch::kLong,  torch::kLong,   torch::kInt,  torch::kShort,    torch::kChar, torch::kByte,
    torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kBool};
const std::vector<double> kSpecials = {0.0,  -0.0,   1e30,  -1e30, kInf,  -kInf,
                                       kNaN, 65504, -65504, 3e38,  1e308, 5e-324};
const std::vector<double> kDropouts = {0.0, 0.0, 0.1, 0.5, 0.9, 1.0, -0.1, 1.5, kNaN};
const std::vector<d2l::Impl> kImpls = {d2l::Impl::kAuto, d2l::Impl::kComposite, d2l::Impl::kFused};

bool floating(const torch::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

// Finite, and small enough (|x| <= 4) that no sum of products of a few of
// them overflows even float16: the inputs for which results must be finite.
bool tame(const torch::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return true;
  const auto d = t.detach().to(torch::kDouble);
  return d.isfinite().all().item<bool>() && d.abs().max().item<double>() <= 4;
}

bool all_finite(const torch::Tensor& t) {
  return !t.defined() || t.detach().to(torch::kDouble).isfinite().all().item<bool>();
}

std::vector<int64_t> dims(Bytes& in, int64_t rank) {
  std::vector<int64_t> shape;
  for (int64_t i = 0; i < rank; ++i) shape.push_back(in.below(10));
  return shape;
}

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

struct Arg {
  torch::Tensor leaf;   // owns the storage; gets the gradient
  torch::Tensor value;  // what the library sees: a view of leaf
};

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

Arg make_arg(Bytes& in, torch::IntArrayRef shape, torch::Dtype dtype, bool requires_grad) {
  return lay_out(in, make_values(in, shape, dtype), requires_grad);
}

// One length: small, negative, the int64 extremes, a fraction or a huge or
// non-finite float.
double length_value(Bytes& in, int64_t m) {
  switch (in.below(10)) {
    case 5: return -1.0 - static_cast<double>(in.below(3));
    case 6: return static_cast<double>(std::numeric_limits<int64_t>::max());
    case 7: return static_cast<double>(std::numeric_limits<int64_t>::min());
    case 8: return static_cast<double>(in.below(m + 2)) + 0.5;
    case 9: return in.pick<double>({1e20, 9.3e18, 9223372036854775808.0, 9007199254740993.0, kInf, kNaN});
    default: return static_cast<double>(in.below(m + 3));
  }
}

// Lengths for (B, n, m) scores: undefined, (B), (B, n), a wrong shape, or a
// strided (B, n); any dtype.
torch::Tensor make_lengths(Bytes& in, int64_t B, int64_t n, int64_t m) {
  const int64_t kind = in.below(8);
  if (kind < 2) return {};
  std::vector<int64_t> shape;
  if (kind < 4) shape = {B};
  else if (kind < 6 || kind == 7) shape = {B, n};
  else shape = dims(in, in.below(3));
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

// Valid positions of (B, n, m) scores for lengths that the library accepted.
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

// Attention weights (B, n, m): exactly 0 where masked; finite with rows
// summing to 1 (or 0 without a valid key) when `finite_expected`.
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

// Runs backward through `out` with a tame upstream gradient and checks that
// every leaf's gradient is finite when `finite_expected`.
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

enum class GradMode { kEnabled, kNoGrad, kInference };

// Grad mode for the call under test (backward runs outside it).
struct GradModeScope {
  explicit GradModeScope(GradMode mode) {
    if (mode == GradMode::kNoGrad) no_grad.emplace();
    if (mode == GradMode::kInference) inference.emplace();
  }
  std::optional<torch::NoGradGuard> no_grad;
  std::optional<c10::InferenceMode> inference;
};

GradMode pick_grad_mode(Bytes& in) {
  const int64_t m = in.below(4);
  return m == 2 ? GradMode::kNoGrad : m == 3 ? GradMode::kInference : GradMode::kEnabled;
}

void fuzz_sequence_mask(Bytes& in) {
  const auto shape = dims(in, in.below(5));
  const auto dtype = in.pick(kDataDtypes);
  const auto X = make_arg(in, shape, dtype, in.flag());
  const int64_t N = shape.empty() ? 0 : shape[0], L = shape.size() < 2 ? 0 : shape[1];
  const auto lens = make_lengths(in, N, 1, L);
  const double value = in.pick<double>({0.0, -1.0, 1e6, -1e6, 1e30, kInf, -kInf, kNaN, 65504, 7e4});
  current.description = "sequence_mask value=" + std::to_string(value);
  note("X", X.value);
  note("valid_len", lens);
  const auto out = d2l::sequence_mask(X.value, lens, value);
  note("out", out);
  FUZZ_CHECK(out.sizes() == X.value.sizes() && out.scalar_type() == dtype,
             "sequence_mask changed the shape or dtype");
  if (!floating(out) || out.numel() == 0) return;
  std::vector<int64_t> view(out.dim(), 1);
  view[0] = N;
  view[1] = L;
  const auto keep = valid_mask(lens.reshape({N}), N, 1, L).reshape(view).expand(out.sizes());
  const auto od = out.detach().to(torch::kDouble), xd = X.value.detach().to(torch::kDouble);
  const auto nan_fill = std::isnan(value) ? keep.logical_not() : torch::zeros_like(keep);
  FUZZ_CHECK(torch::equal(od.isnan(), xd.isnan().logical_and(keep).logical_or(nan_fill)),
             "sequence_mask put NaN where it does not belong");
  const auto filled = torch::scalar_tensor(value, torch::kDouble).to(dtype).to(torch::kDouble);
  const auto expected = torch::where(keep, xd, filled.expand(out.sizes()));
  FUZZ_CHECK(torch::equal(od.nan_to_num(0, kInf, -kInf), expected.nan_to_num(0, kInf, -kInf)),
             "sequence_mask values differ from X and value");
  check_backward(out, {X.leaf}, true, in);
}

void fuzz_masked_softmax(Bytes& in) {
  const int64_t variant = in.below(3);
  const int64_t rank = in.below(4) == 0 ? in.below(5) : 3;
  auto shape = dims(in, rank);
  const auto dtype = in.pick(kDataDtypes);
  const auto X = make_arg(in, shape, dtype, in.flag());
  const int64_t B = rank > 0 ? shape[0] : 0, n = rank > 1 ? shape[1] : 0, m = rank > 2 ? shape[2] : 0;
  const auto lens = make_lengths(in, B, n, m);
  const auto grad_mode = pick_grad_mode(in);
  current.description = "masked_softmax variant=" + std::to_string(variant) +
                        " grad_mode=" + std::to_string(static_cast<int>(grad_mode));
  note("X", X.value);
  note("valid_lens", lens);
  torch::Tensor y;
  {
    GradModeScope scope(grad_mode);
    y = variant == 0   ? d2l::masked_softmax(X.value, lens)
        : variant == 1 ? d2l::composite::masked_softmax(X.value, lens)
                       : d2l::fused::masked_softmax(X.value, lens);
  }
  note("y", y);
  FUZZ_CHECK(y.sizes() == X.value.sizes() && y.scalar_type() == dtype,
             "masked_softmax changed the shape or dtype");
  bool valid_finite;
  if (lens.defined()) {
    FUZZ_CHECK(y.dim() == 3, "masked_softmax accepted lengths for scores that are not 3-D");
    const auto valid = valid_mask(lens, B, n, m);
    valid_finite = X.value.detach().to(torch::kDouble).masked_select(valid).isfinite().all().item<bool>();
    check_weights(y, valid, valid_finite);
  } else {
    valid_finite = all_finite(X.value);
    if (y.dim() >= 1 && y.numel() > 0) {
      const auto flat = y.reshape({-1, y.size(-1)});
      check_weights(flat.unsqueeze(0), torch::ones({1, flat.size(0), flat.size(1)}, torch::kBool),
                    valid_finite);
    }
  }
  check_backward(y, {X.leaf}, valid_finite, in);
}

struct QKVArgs {
  Arg queries, keys, values;
  torch::Tensor lens;
  bool tame_inputs;
};

// Queries (B, n, dq), keys (B, m, dk), values (B, m, dv): mostly consistent,
// sometimes with one dimension, rank or dtype wrong.
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

void fuzz_dot_product_functional(Bytes& in) {
  auto a = make_qkv(in, in.below(8) != 0);
  const double dropout = in.pick(kDropouts);
  const bool training = in.flag();
  const auto impl = in.pick(kImpls);
  const auto grad_mode = pick_grad_mode(in);
  current.description = "dot_product_attention dropout=" + std::to_string(dropout) +
                        " training=" + std::to_string(training) +
                        " impl=" + std::to_string(static_cast<int>(impl)) +
                        " grad_mode=" + std::to_string(static_cast<int>(grad_mode));
  torch::Tensor out, weights;
  {
    GradModeScope scope(grad_mode);
    std::tie(out, weights) = d2l::functional::dot_product_attention(
        a.queries.value, a.keys.value, a.values.value, a.lens, dropout, training, impl);
  }
  note("out", out);
  note("weights", weights);
  const int64_t B = a.queries.value.size(0), n = a.queries.value.size(1), m = a.keys.value.size(1);
  FUZZ_CHECK(out.sizes() == torch::IntArrayRef({B, n, a.values.value.size(2)}),
             "dot_product_attention output has the wrong shape");
  check_weights(weights, valid_mask(a.lens, B, n, m), a.tame_inputs);
  if (a.tame_inputs) FUZZ_CHECK(all_finite(out), "output not finite for finite inputs");
  check_backward(out, {a.queries.leaf, a.keys.leaf, a.values.leaf}, a.tame_inputs, in);
}

void fuzz_dot_product_module(Bytes& in) {
  auto a = make_qkv(in, in.below(8) != 0);
  const auto options = d2l::DotProductAttentionOptions()
                           .dropout(in.pick(kDropouts))
                           .impl(in.pick(kImpls))
                           .record_attention_weights(in.flag());
  d2l::DotProductAttention attention(options);
  attention->train(in.flag());
  const auto grad_mode = pick_grad_mode(in);
  std::ostringstream description;
  description << *attention << " impl=" << static_cast<int>(options.impl())
              << " record=" << options.record_attention_weights()
              << " training=" << attention->is_training()
              << " grad_mode=" << static_cast<int>(grad_mode);
  current.description = description.str();
  for (const auto& p : attention->named_parameters()) note(p.key(), p.value());
  torch::Tensor out;
  {
    GradModeScope scope(grad_mode);
    out = attention(a.queries.value, a.keys.value, a.values.value, a.lens);
  }
  note("out", out);
  note("attention_weights", attention->attention_weights);
  const int64_t B = a.queries.value.size(0), n = a.queries.value.size(1), m = a.keys.value.size(1);
  if (options.record_attention_weights()) {
    check_weights(attention->attention_weights, valid_mask(a.lens, B, n, m), a.tame_inputs);
  } else {
    FUZZ_CHECK(!attention->attention_weights.defined(), "weights recorded while turned off");
  }
  if (a.tame_inputs) FUZZ_CHECK(all_finite(out), "output not finite for finite inputs");
  check_backward(out, {a.queries.leaf, a.keys.leaf, a.values.leaf}, a.tame_inputs, in);
}

void fuzz_additive_scores(Bytes& in) {
  auto d = dims(in, 4);  // B, n, m, h
  std::vector<int64_t> qs{d[0], d[1], d[3]}, ks{d[0], d[2], d[3]}, ws{1, d[3]};
  switch (in.below(12)) {
    case 0: ks[2] += 1; break;
    case 1: ws[0] = 2; break;
    case 2: ws.pop_back(); break;
    case 3: ks[0] += 1; break;
    default: break;
  }
  const auto dtype = in.pick(kDataDtypes);
  const bool grad = in.flag();
  const auto q = make_arg(in, qs, dtype, grad), k = make_arg(in, ks, dtype, grad);
  const auto w = make_arg(in, ws, in.below(8) == 0 ? in.pick(kDataDtypes) : dtype, grad);
  const auto impl = in.pick(kImpls);
  const auto grad_mode = pick_grad_mode(in);
  current.description = "additive_scores impl=" + std::to_string(static_cast<int>(impl)) +
                        " grad_mode=" + std::to_string(static_cast<int>(grad_mode));
  note("projected_queries", q.value);
  note("projected_keys", k.value);
  note("w_v", w.value);
  torch::Tensor scores;
  {
    GradModeScope scope(grad_mode);
    scores = d2l::functional::additive_scores(q.value, k.value, w.value, impl);
  }
  FUZZ_CHECK(scores.sizes() == torch::IntArrayRef({d[0], d[1], d[2]}),
             "additive_scores has the wrong shape");
  const bool tame_inputs = tame(q.value) && tame(k.value) && tame(w.value);
  if (tame_inputs) {
    FUZZ_CHECK(all_finite(scores), "additive scores not finite for finite inputs");
    const double bound = w.value.detach().to(torch::kDouble).abs().sum().item<double>();
    FUZZ_CHECK(scores.numel() == 0 ||
                   scores.detach().to(torch::kDouble).abs().max().item<double>() <=
                       bound * (1 + sum_tolerance(dtype)) + sum_tolerance(dtype),
               "additive score beyond sum |w_v|");
  }
  check_backward(scores, {q.leaf, k.leaf, w.leaf}, tame_inputs, in);
}

void fuzz_additive_module(Bytes& in) {
  auto a = make_qkv(in, false);
  int64_t key_size = a.keys.value.dim() == 3 ? a.keys.value.size(2) : 1;
  int64_t query_size = a.queries.value.size(2);
  if (in.below(8) == 0) key_size = in.below(10);
  if (in.below(8) == 0) query_size = in.below(10);
  const auto options = d2l::AdditiveAttentionOptions(key_size, query_size, in.below(10))
                           .dropout(in.pick(kDropouts))
                           .impl(in.pick(kImpls))
                           .record_attention_weights(in.flag());
  d2l::AdditiveAttention attention(options);
  const auto module_dtype = in.below(4) == 0 ? in.pick(kDataDtypes) : a.queries.value.scalar_type();
  if (at::isFloatingType(module_dtype)) attention->to(module_dtype);
  attention->train(in.flag());
  const auto grad_mode = pick_grad_mode(in);
  std::ostringstream description;
  description << *attention << " impl=" << static_cast<int>(options.impl())
              << " record=" << options.record_attention_weights()
              << " training=" << attention->is_training()
              << " grad_mode=" << static_cast<int>(grad_mode);
  current.description = description.str();
  for (const auto& p : attention->named_parameters()) note(p.key(), p.value());
  torch::Tensor out;
  {
    GradModeScope scope(grad_mode);
    out = attention(a.queries.value, a.keys.value, a.values.value, a.lens);
  }
  note("out", out);
  note("attention_weights", attention->attention_weights);
  const int64_t B = a.queries.value.size(0), n = a.queries.value.size(1), m = a.keys.value.size(1);
  if (options.record_attention_weights()) {
    check_weights(attention->attention_weights, valid_mask(a.lens, B, n, m), a.tame_inputs);
  } else {
    FUZZ_CHECK(!attention->attention_weights.defined(), "weights recorded while turned off");
  }
  if (a.tame_inputs) FUZZ_CHECK(all_finite(out), "output not finite for finite inputs");
  auto leaves = attention->parameters();
  leaves.insert(leaves.end(), {a.queries.leaf, a.keys.leaf, a.values.leaf});
  check_backward(out, leaves, a.tame_inputs, in);
}

std::string some_text(Bytes& in) {
  std::string text;
  for (int64_t i = 0, n = in.below(12); i < n; ++i) {
    text.push_back(static_cast<char>(in.pick<uint8_t>({'a', 'Z', '<', '&', '"', ' ', 0xC3, 0xA9, 0xE2, 0x80, 0xFF, 0})));
  }
  return text;
}

void fuzz_heatmaps(Bytes& in) {
  const int64_t rank = in.below(6) == 0 ? in.below(6) : 4;
  std::vector<int64_t> shape;
  for (int64_t i = 0; i < rank; ++i) shape.push_back(in.below(5));
  const auto matrices = make_arg(in, shape, in.pick(kDataDtypes), false).value;
  const std::vector<double> sizes = {2.5, 0.0, -1.0, 1e-300, 1e300, kInf, kNaN, 0.01};
  std::vector<std::string> titles;
  for (int64_t i = 0, n = in.below(4); i < n; ++i) titles.push_back(some_text(in));
  const auto options = d2l::HeatmapOptions()
                           .xlabel(some_text(in))
                           .ylabel(some_text(in))
                           .titles(titles)
                           .figsize({in.pick(sizes), in.pick(sizes)})
                           .cmap(in.pick<std::string>({"Reds", "Blues", "Greens", "Greys", "viridis", "jet", ""}));
  current.description = "heatmaps cmap=" + options.cmap() +
                        " figsize=" + std::to_string(options.figsize().first) + "," +
                        std::to_string(options.figsize().second);
  note("matrices", matrices);
  const auto text = in.flag() ? d2l::heatmaps_svg(matrices, options)
                              : d2l::heatmaps_ansi(matrices, options);
  FUZZ_CHECK(!text.empty(), "a heatmap rendered as nothing");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  current = Call{};
  const int64_t op = in.below(8);
  // Bit 0: the generic kernels; else bit 1 picks AVX2 or AVX-512, falling
  // back to what this CPU runs.
  const uint8_t isa_byte = in.byte();
  auto isa = (isa_byte & 1) != 0 ? d2l::CpuIsa::kDefault
             : (isa_byte & 2) != 0 ? d2l::CpuIsa::kAvx2
                                  : d2l::CpuIsa::kAvx512;
  if (!d2l::cpu_isa_available(isa)) isa = d2l::CpuIsa::kAvx2;
  if (!d2l::cpu_isa_available(isa)) isa = d2l::CpuIsa::kDefault;
  d2l::set_cpu_isa(isa);
  try {
    switch (op) {
      case 0: fuzz_sequence_mask(in); break;
      case 1: case 2: fuzz_masked_softmax(in); break;
      case 3: fuzz_dot_product_functional(in); break;
      case 4: fuzz_dot_product_module(in); break;
      case 5: fuzz_additive_scores(in); break;
      case 6: fuzz_additive_module(in); break;
      default: fuzz_heatmaps(in); break;
    }
  } catch (const c10::Error&) {
    // The documented way to refuse an input.
  }
  return 0;
}
