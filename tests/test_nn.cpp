// d2l::nn::MultiheadAttention against LibTorch's torch::nn::MultiheadAttention
// (outputs, weights and every gradient on the same weights), against Python's
// torch.nn.MultiheadAttention where LibTorch's C++ differs from it (fixtures
// from tests/fixtures/generate_fixtures_nn.py), state dicts and archives
// across the three, and its errors.

#include <d2l/nn.h>
#include <d2l/state_dict.h>
#include <torch/version.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "nn_helpers.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using d2l::testing::nn::backward;
using d2l::testing::nn::copy_parameters;
using d2l::testing::nn::fixture_grads;
using d2l::testing::nn::fixture_mask;
using d2l::testing::nn::load_fixture_parameters;
using d2l::testing::nn::max_grad_error;
using d2l::testing::nn::randomize;
using ::testing::HasSubstr;

constexpr double kNnTol = 1e-5;
constexpr int64_t kNnL = 3, kNnS = 5, kNnN = 2, kNnE = 8, kNnHeads = 2;
const double kNegInf = -std::numeric_limits<double>::infinity();

// The masks of the parity grid: what ours gets, and what LibTorch's C++ gets
// for the same meaning (it adds a boolean attn_mask, so it gets the float form).
struct NnMasks {
  torch::Tensor kpm, attn, torch_attn;
  bool causal = false;
};

torch::Tensor nn_padding() {
  auto kpm = torch::zeros({kNnN, kNnS}, torch::kBool);
  kpm.index_put_({0, torch::indexing::Slice(3)}, true);
  kpm.index_put_({1, 4}, true);
  return kpm;
}

torch::Tensor nn_attn_bool() {
  auto attn = torch::zeros({kNnL, kNnS}, torch::kBool);
  attn.index_put_({0, 1}, true);
  attn.index_put_({1, 0}, true);
  attn.index_put_({2, 2}, true);
  attn.index_put_({2, 4}, true);
  return attn;
}

torch::Tensor as_additive(const torch::Tensor& mask) {
  return torch::zeros(mask.sizes()).masked_fill(mask, kNegInf);
}

NnMasks nn_masks(const std::string& kind) {
  NnMasks m;
  const auto finite = torch::randn({kNnL, kNnS});
  if (kind == "kpm_bool") m.kpm = nn_padding();
  if (kind == "attn_bool") m.attn = nn_attn_bool(), m.torch_attn = as_additive(m.attn);
  if (kind == "attn_float") m.attn = m.torch_attn = finite;
  if (kind == "attn_neginf") m.attn = m.torch_attn = as_additive(nn_attn_bool());
  if (kind == "kpm_attn_float") {
    m.kpm = nn_padding();
    m.attn = m.torch_attn = finite.masked_fill(nn_attn_bool(), kNegInf);
  }
  if (kind == "causal" || kind == "causal_kpm") {
    m.causal = true;
    m.torch_attn = torch::full({kNnL, kNnS}, kNegInf).triu(kNnS - kNnL + 1);
    if (kind == "causal_kpm") m.kpm = nn_padding();
  }
  return m;
}

struct NnVariant {
  std::string name;
  int64_t kvdim = kNnE;
  bool bias = true, add_bias_kv = false, add_zero_attn = false, self_attention = false;
  bool batch_first = false;
};

struct NnCall {
  bool need_weights, average;
};

struct NnErrors {
  double output = 0, weights = 0, grads = 0;
};

NnErrors compare_with_libtorch(const NnVariant& v, const std::string& mask_kind, NnCall call,
                               uint64_t seed) {
  torch::manual_seed(seed);
  const auto opts = d2l::nn::MultiheadAttentionOptions(kNnE, kNnHeads)
                        .bias(v.bias)
                        .add_bias_kv(v.add_bias_kv)
                        .add_zero_attn(v.add_zero_attn)
                        .kdim(v.kvdim)
                        .vdim(v.kvdim)
                        .batch_first(v.batch_first);
  d2l::nn::MultiheadAttention ours(opts);
  torch::nn::MultiheadAttention ref(torch::nn::MultiheadAttentionOptions(kNnE, kNnHeads)
                                        .bias(v.bias)
                                        .add_bias_kv(v.add_bias_kv)
                                        .add_zero_attn(v.add_zero_attn)
                                        .kdim(v.kvdim)
                                        .vdim(v.kvdim));
  randomize(*ours, seed);
  copy_parameters(*ours, *ref);
  ours->eval();
  ref->eval();
  const int64_t S = v.self_attention ? kNnL : kNnS;
  const auto q0 = torch::randn({kNnL, kNnN, kNnE});
  const auto k0 = v.self_attention ? q0 : torch::randn({S, kNnN, v.kvdim});
  const auto v0 = v.self_attention ? q0 : torch::randn({S, kNnN, v.kvdim});
  auto masks = nn_masks(mask_kind);
  if (v.self_attention && masks.torch_attn.defined()) {
    masks.torch_attn = masks.torch_attn.narrow(1, kNnS - kNnL, kNnL);
    if (masks.attn.defined()) masks.attn = masks.attn.narrow(1, kNnS - kNnL, kNnL);
  }
  if (v.self_attention && masks.kpm.defined()) masks.kpm = masks.kpm.narrow(1, 0, kNnL);
  const auto leaves = [&] {
    auto q = q0.clone().requires_grad_();
    if (v.self_attention) return std::vector<torch::Tensor>{q, q, q};
    return std::vector<torch::Tensor>{q, k0.clone().requires_grad_(), v0.clone().requires_grad_()};
  };
  auto mine = leaves(), theirs = leaves();
  const auto layout = [&](const torch::Tensor& t) { return v.batch_first ? t.transpose(0, 1) : t; };
  auto [out, weights] = ours(layout(mine[0]), layout(mine[1]), layout(mine[2]), masks.kpm,
                             call.need_weights, masks.attn, call.average, masks.causal);
  auto [ref_out, ref_weights] = ref(theirs[0], theirs[1], theirs[2], masks.kpm, call.need_weights,
                                    masks.torch_attn, call.average);
  out = layout(out);
  EXPECT_EQ(out.sizes(), ref_out.sizes());
  EXPECT_EQ(weights.defined(), ref_weights.defined());
  NnErrors e;
  e.output = max_rel_error(out, ref_out);
  if (weights.defined() && ref_weights.defined()) {
    EXPECT_EQ(weights.sizes(), ref_weights.sizes());
    e.weights = max_rel_error(weights, ref_weights);
  }
  const auto G = torch::randn(ref_out.sizes());
  const size_t distinct = v.self_attention ? 1 : 3;
  const auto a = backward(*ours, out, G, {mine.begin(), mine.begin() + distinct});
  const auto b = backward(*ref, ref_out, G, {theirs.begin(), theirs.begin() + distinct});
  e.grads = max_grad_error(a, b);
  return e;
}

TEST(NnMultiheadAttention, EqualsLibTorchOnEveryMaskAndOption) {
  const std::vector<NnVariant> variants = {
      {"plain"},
      {"no_bias", kNnE, false},
      {"add_bias_kv", kNnE, true, true},
      {"add_zero_attn", kNnE, true, false, true},
      {"bias_kv_zero_attn", kNnE, true, true, true},
      {"kdim_vdim_6", 6},
      {"self_attention", kNnE, true, false, false, true},
      {"batch_first", kNnE, true, false, false, false, true},
  };
  const std::vector<std::string> kinds = {"none",       "kpm_bool",    "attn_bool",
                                          "attn_float", "attn_neginf", "kpm_attn_float",
                                          "causal",     "causal_kpm"};
  const std::vector<NnCall> calls = {{true, true}, {true, false}, {false, true}};
  NnErrors worst;
  uint64_t seed = 100;
  for (const auto& v : variants) {
    for (const auto& kind : kinds) {
      for (const auto call : calls) {
        const auto e = compare_with_libtorch(v, kind, call, ++seed);
        const auto where = fmt::format("{} mask {} need_weights {} average {}", v.name, kind,
                                       call.need_weights, call.average);
        EXPECT_LT(e.output, kNnTol) << where;
        EXPECT_LT(e.weights, kNnTol) << where;
        EXPECT_LT(e.grads, kNnTol) << where;
        worst.output = std::max(worst.output, e.output);
        worst.weights = std::max(worst.weights, e.weights);
        worst.grads = std::max(worst.grads, e.grads);
      }
    }
  }
  RecordProperty("max_errors", fmt::format("output {:.3g} weights {:.3g} grads {:.3g}",
                                           worst.output, worst.weights, worst.grads));
  std::cout << fmt::format(
      "[ nn parity vs LibTorch ] {} cases: output {:.3g}, weights {:.3g}, "
      "gradients {:.3g}\n",
      variants.size() * kinds.size() * calls.size(), worst.output, worst.weights, worst.grads);
}

// Python's torch.nn.MultiheadAttention, where LibTorch's C++ differs or lacks
// the case (tests/fixtures/generate_fixtures_nn.py).
void expect_python_mha(const std::string& name) {
  SCOPED_TRACE(name);
  const auto f = d2l::testing::load_fixture(name + "_float32");
  const auto flag = [&](const char* s) { return f.scalar(s) != 0; };
  const auto E = static_cast<int64_t>(f.scalar("embed_dim"));
  d2l::nn::MultiheadAttention ours(
      d2l::nn::MultiheadAttentionOptions(E, static_cast<int64_t>(f.scalar("num_heads")))
          .kdim(static_cast<int64_t>(f.scalar("kdim")))
          .vdim(static_cast<int64_t>(f.scalar("vdim")))
          .bias(flag("bias"))
          .add_bias_kv(flag("add_bias_kv"))
          .add_zero_attn(flag("add_zero_attn"))
          .batch_first(flag("batch_first")));
  ours->eval();
  load_fixture_parameters(f, *ours);
  const bool self = flag("self_attention");
  std::vector<std::string> names =
      self ? std::vector<std::string>{"query"} : std::vector<std::string>{"query", "key", "value"};
  std::vector<torch::Tensor> inputs;
  for (const auto& n : names) inputs.push_back(f.tensor(n).clone().requires_grad_());
  const auto& q = inputs[0];
  const auto& k = self ? q : inputs[1];
  const auto& v = self ? q : inputs[2];
  // Python needs attn_mask beside is_causal; ours takes either, and both.
  const auto attn = fixture_mask(f, "attn_mask");
  auto [out, weights] = ours(q, k, v, fixture_mask(f, "key_padding_mask"), flag("need_weights"),
                             attn, flag("average_attn_weights"), flag("is_causal"));
  EXPECT_LT(max_rel_error(out, f.tensor("output")), kNnTol);
  EXPECT_EQ(weights.defined(), f.has_tensor("weights"));
  if (weights.defined()) EXPECT_LT(max_rel_error(weights, f.tensor("weights")), kNnTol);
  const auto grads = backward(*ours, out, f.tensor("G"), inputs);
  const double grad_error = max_grad_error(grads, fixture_grads(f, *ours, names));
  EXPECT_LT(grad_error, kNnTol);
  if (flag("is_causal")) {
    auto [causal_only, unused] = ours(q, k, v, torch::Tensor(), false, torch::Tensor(), true, true);
    EXPECT_LT(max_rel_error(causal_only, f.tensor("output")), kNnTol) << "is_causal alone";
  }
  std::cout << fmt::format("[ nn parity vs Python ] {}: output {:.3g}, gradients {:.3g}\n", name,
                           max_rel_error(out, f.tensor("output")), grad_error);
}

TEST(NnMultiheadAttention, EqualsPythonWhereLibTorchDiffers) {
  for (const auto* name :
       {"nn_mha_bool_attn", "nn_mha_attn3d_bool", "nn_mha_attn3d_float", "nn_mha_kdim_vdim",
        "nn_mha_bias_kv_batch_first", "nn_mha_float_kpm", "nn_mha_causal"}) {
    expect_python_mha(name);
  }
}

TEST(NnMultiheadAttention, BooleanAttnMaskMasksWhereLibTorchAddsIt) {
  // pytorch#80494: LibTorch's C++ adds a boolean attn_mask to the scores (1
  // where masked), so it changes the result without masking.
  torch::manual_seed(5);
  d2l::nn::MultiheadAttention ours(kNnE, kNnHeads);
  ours->eval();
  const auto q = torch::randn({kNnL, kNnN, kNnE}), k = torch::randn({kNnS, kNnN, kNnE});
  const auto mask = nn_attn_bool();
  auto [out_bool, w_bool] = ours(q, k, k, torch::Tensor(), true, mask);
  auto [out_float, w_float] = ours(q, k, k, torch::Tensor(), true, as_additive(mask));
  EXPECT_LT(max_rel_error(out_bool, out_float), 1e-6);
  EXPECT_TRUE(torch::all(w_bool.masked_select(mask.expand_as(w_bool)) == 0).item<bool>());
}

// What docs/nn.md says LibTorch's C++ module does where it differs from
// Python; when a LibTorch changes one of these, the page must change too.
TEST(NnMultiheadAttention, LibTorchCppDiffersAsDocumented) {
  torch::manual_seed(4);
  torch::nn::MultiheadAttention ref(kNnE, kNnHeads);
  ref->eval();
  const auto q = torch::randn({kNnL, kNnN, kNnE}), k = torch::randn({kNnS, kNnN, kNnE});
  const auto mask = nn_attn_bool();
  // A boolean attn_mask is added (as 0/1), so no weight is zeroed.
  const auto weights = std::get<1>(ref(q, k, k, torch::Tensor(), true, mask));
  EXPECT_TRUE(torch::all(weights.masked_select(mask.expand_as(weights)) > 0).item<bool>());
  EXPECT_FALSE(torch::allclose(
      weights, std::get<1>(ref(q, k, k, torch::Tensor(), true, as_additive(mask)))));
  // A float key_padding_mask is not added: 1.13's masked_fill misreads it
  // (nothing is masked), 2.x's refuses it.
  const auto padding = as_additive(nn_padding());
#if TORCH_VERSION_MAJOR < 2
  EXPECT_TRUE(torch::equal(std::get<0>(ref(q, k, k, padding)), std::get<0>(ref(q, k, k))));
#else
  EXPECT_THROW(ref(q, k, k, padding), c10::Error);
#endif
  // A per-head (N * heads, L, S) attn_mask and kdim != vdim throw.
  EXPECT_THROW(ref(q, k, k, torch::Tensor(), true,
                   torch::zeros({kNnN * kNnHeads, kNnL, kNnS}, torch::kBool)),
               c10::Error);
  torch::nn::MultiheadAttention kv(
      torch::nn::MultiheadAttentionOptions(kNnE, kNnHeads).kdim(6).vdim(4));
  EXPECT_THROW(kv(q, torch::randn({kNnS, kNnN, 6}), torch::randn({kNnS, kNnN, 4})), c10::Error);
  // Self-attention found by value: a key and value equal to the query get no gradient.
  const auto x = torch::randn({kNnL, kNnN, kNnE});
  const auto a = x.clone().requires_grad_(), b = x.clone().requires_grad_(),
             c = x.clone().requires_grad_();
  std::get<0>(ref(a, b, c)).sum().backward();
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined() || c.grad().defined());
}

TEST(NnMultiheadAttention, KeyEqualToQueryInValueGetsItsGradient) {
  // LibTorch detects self-attention with torch::equal: a key and value equal
  // to the query in value, but other tensors, get no gradient there.
  torch::manual_seed(6);
  d2l::nn::MultiheadAttention ours(kNnE, kNnHeads);
  const auto x = torch::randn({kNnL, kNnN, kNnE});
  const auto q = x.clone().requires_grad_(), k = x.clone().requires_grad_(),
             v = x.clone().requires_grad_();
  std::get<0>(ours(q, k, v)).sum().backward();
  const auto shared = x.clone().requires_grad_();
  std::get<0>(ours(shared, shared, shared)).sum().backward();
  ASSERT_TRUE(k.grad().defined() && v.grad().defined());
  EXPECT_GT(k.grad().abs().sum().item<double>(), 0);
  EXPECT_LT(max_rel_error(q.grad() + k.grad() + v.grad(), shared.grad()), 1e-5);
}

TEST(NnMultiheadAttention, RowsThatSeeNoKeyGiveZerosNotNaN) {
  torch::manual_seed(7);
  d2l::nn::MultiheadAttention ours(kNnE, kNnHeads);
  const auto q = torch::randn({kNnL, kNnN, kNnE}, torch::requires_grad());
  const auto k = torch::randn({kNnS, kNnN, kNnE}, torch::requires_grad());
  auto attn = torch::zeros({kNnL, kNnS});
  attn[1].fill_(kNegInf);
  for (const auto& mask : {attn, attn + 0.5 * (attn == 0).to(torch::kFloat)}) {
    auto [out, w] = ours(q, k, k, torch::Tensor(), true, mask);
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
    EXPECT_TRUE(torch::all(w.select(1, 1) == 0).item<bool>());
    out.sum().backward();
    EXPECT_TRUE(torch::isfinite(q.grad()).all().item<bool>());
    EXPECT_TRUE(torch::isfinite(ours->in_proj_weight.grad()).all().item<bool>());
  }
}

TEST(NnMultiheadAttention, LearnedFloatMaskGetsItsGradientWhateverItsValues) {
  // A float mask that requires grad is data (a learned bias): all 0 (or 0
  // and -inf) it is not read as a boolean mask, which would get no gradient.
  // Softmax does not see a constant added to a row, so the gradient at 0 is
  // the gradient at 0.25, which takes the additive path in any case.
  torch::manual_seed(9);
  d2l::nn::MultiheadAttention ours(kNnE, kNnHeads);
  const auto q = torch::randn({kNnL, kNnN, kNnE}), k = torch::randn({kNnS, kNnN, kNnE});
  const auto grad_at = [&](double value) {
    auto mask = torch::full({kNnL, kNnS}, value, torch::requires_grad());
    EXPECT_EQ(ours->explain_path(q, k, k, torch::Tensor(), true, mask).path, "additive_mask");
    std::get<0>(ours(q, k, k, torch::Tensor(), true, mask)).pow(2).sum().backward();
    return mask.grad();
  };
  const auto at_zero = grad_at(0.0), shifted = grad_at(0.25);
  ASSERT_TRUE(at_zero.defined());
  EXPECT_GT(shifted.abs().max().item<double>(), 1e-3);
  EXPECT_LT(max_rel_error(at_zero, shifted), 1e-5);
  // Without autograd recording, the same mask is a boolean mask again.
  torch::NoGradGuard no_grad;
  const auto zeros = torch::zeros({kNnL, kNnS}, torch::requires_grad());
  EXPECT_EQ(ours->explain_path(q, k, k, torch::Tensor(), true, zeros).path, "small_heads");
}

TEST(NnMultiheadAttention, PathsOfTheMasks) {
  torch::manual_seed(8);
  d2l::nn::MultiheadAttention ours(kNnE, kNnHeads);
  const auto q = torch::randn({kNnL, kNnN, kNnE}), k = torch::randn({kNnS, kNnN, kNnE});
  EXPECT_EQ(ours->explain_path(q, k, k).path, "small_heads");
  // A 0/-inf float mask is a boolean mask: lengths where its rows are
  // prefixes (the kernels), else the library's exact boolean-mask path.
  const auto prefix = torch::full({kNnL, kNnS}, kNegInf).triu(kNnS - kNnL + 1);
  EXPECT_EQ(ours->explain_path(q, k, k, torch::Tensor(), true, prefix).path, "small_heads");
  EXPECT_EQ(ours->explain_path(q, k, k, torch::Tensor(), true, as_additive(nn_attn_bool())).path,
            ours->explain_path(q, k, k, torch::Tensor(), true, nn_attn_bool()).path);
  EXPECT_EQ(ours->explain_path(q, k, k, as_additive(nn_padding())).path, "small_heads");
  const auto p = ours->explain_path(q, k, k, torch::Tensor(), true, torch::randn({kNnL, kNnS}));
  EXPECT_EQ(p.path, "additive_mask");
  EXPECT_EQ(p.op, "d2l::nn::MultiheadAttention");
  const auto big = torch::randn({128, 2, kNnE});
  EXPECT_EQ(
      ours->explain_path(big, big, big, torch::Tensor(), false, torch::Tensor(), true, true).path,
      "flash");
  d2l::nn::MultiheadAttention with_rows(
      d2l::nn::MultiheadAttentionOptions(kNnE, kNnHeads).add_zero_attn(true));
  EXPECT_EQ(with_rows->explain_path(q, k, k).path, "additive_mask");
}

TEST(NnMultiheadAttention, ParameterNamesAndDefaults) {
  const auto names = [](const torch::nn::Module& m) {
    std::vector<std::string> keys;
    for (const auto& p : m.named_parameters()) keys.push_back(p.key());
    return keys;
  };
  for (const auto& o : {d2l::nn::MultiheadAttentionOptions(8, 2),
                        d2l::nn::MultiheadAttentionOptions(8, 2).kdim(3).vdim(5).add_bias_kv(true),
                        d2l::nn::MultiheadAttentionOptions(8, 4).bias(false).add_zero_attn(true)}) {
    d2l::nn::MultiheadAttention ours(o);
    torch::nn::MultiheadAttention ref(torch::nn::MultiheadAttentionOptions(8, o.num_heads())
                                          .kdim(o.kdim())
                                          .vdim(o.vdim())
                                          .bias(o.bias())
                                          .add_bias_kv(o.add_bias_kv())
                                          .add_zero_attn(o.add_zero_attn()));
    EXPECT_EQ(names(*ours), names(*ref));
    for (const auto& p : ref->named_parameters()) {
      EXPECT_EQ(ours->named_parameters()[p.key()].sizes(), p.value().sizes()) << p.key();
    }
    EXPECT_EQ(ours->head_dim, ref->head_dim);
    EXPECT_EQ(ours->_qkv_same_embed_dim, ref->_qkv_same_embed_dim);
  }
  d2l::nn::MultiheadAttention ours(8, 2);
  EXPECT_TRUE(torch::all(ours->in_proj_bias == 0).item<bool>());
  EXPECT_EQ(d2l::testing::printed(*ours),
            "d2l::nn::MultiheadAttention(embed_dim=8, num_heads=2, dropout=0, bias=true, "
            "add_bias_kv=false, add_zero_attn=false, kdim=8, vdim=8, batch_first=false)");
  const auto copy = std::dynamic_pointer_cast<d2l::nn::MultiheadAttentionImpl>(ours->clone());
  ASSERT_TRUE(copy);
  EXPECT_TRUE(torch::equal(copy->in_proj_weight, ours->in_proj_weight));
}

TEST(NnMultiheadAttention, WorksInAnyModuleWithDefaults) {
  torch::manual_seed(9);
  d2l::nn::MultiheadAttention ours(kNnE, kNnHeads);
  ours->eval();
  torch::nn::AnyModule any(ours);
  const auto x = torch::randn({kNnL, kNnN, kNnE});
  const auto [out, weights] = any.forward<std::tuple<torch::Tensor, torch::Tensor>>(x, x, x);
  const auto [direct, direct_weights] = ours(x, x, x);
  EXPECT_TRUE(torch::equal(out, direct));
  EXPECT_TRUE(torch::equal(weights, direct_weights));
}

TEST(NnMultiheadAttention, FunctionalFormIsTheModule) {
  torch::manual_seed(10);
  d2l::nn::MultiheadAttention ours(
      d2l::nn::MultiheadAttentionOptions(kNnE, kNnHeads).kdim(5).vdim(3));
  ours->eval();
  const auto q = torch::randn({kNnL, kNnN, kNnE}), k = torch::randn({kNnS, kNnN, 5}),
             v = torch::randn({kNnS, kNnN, 3});
  const auto o = d2l::nn::functional::MultiheadAttentionForwardFuncOptions(
                     kNnE, kNnHeads, torch::Tensor(), ours->in_proj_bias, torch::Tensor(), {},
                     false, 0.0, ours->out_proj->weight, ours->out_proj->bias)
                     .training(false)
                     .use_separate_proj_weight(true)
                     .q_proj_weight(ours->q_proj_weight)
                     .k_proj_weight(ours->k_proj_weight)
                     .v_proj_weight(ours->v_proj_weight)
                     .key_padding_mask(nn_padding());
  const auto [out, w] = d2l::nn::functional::multi_head_attention_forward(q, k, v, o);
  const auto [direct, direct_w] = ours(q, k, v, nn_padding());
  EXPECT_TRUE(torch::equal(out, direct));
  EXPECT_TRUE(torch::equal(w, direct_w));
  EXPECT_THAT(error_message([&] {
                auto wrong = o;
                d2l::nn::functional::multi_head_attention_forward(q, k, v,
                                                                  wrong.embed_dim_to_check(6));
              }),
              HasSubstr("d2l::nn::functional::multi_head_attention_forward: query must have "
                        "embed_dim=6 features, got query [3, 2, 8]"));
}

// Python's state_dict, saved by torch.save in 1.13 and 2.11, loads key for key
// and gives Python's numbers.
TEST(NnMultiheadAttention, LoadsPythonStateDict) {
  for (const auto& [pt, fixture] : std::vector<std::pair<std::string, std::string>>{
           {"nn_state_mha_torch113.pt", "nn_mha_bias_kv_batch_first"},
           {"nn_state_mha_torch211.pt", "nn_mha_float_kpm"}}) {
    SCOPED_TRACE(pt);
    const auto f = d2l::testing::load_fixture(fixture + "_float32");
    d2l::nn::MultiheadAttention ours(d2l::nn::MultiheadAttentionOptions(kNnE, kNnHeads)
                                         .add_bias_kv(f.scalar("add_bias_kv") != 0)
                                         .add_zero_attn(f.scalar("add_zero_attn") != 0)
                                         .batch_first(f.scalar("batch_first") != 0));
    ours->eval();
    d2l::load_state_dict(*ours, std::string(D2L_FIXTURE_DIR) + "/" + pt);
    torch::NoGradGuard no_grad;
    auto [out, w] = ours(f.tensor("query"), f.tensor("key"), f.tensor("value"),
                         fixture_mask(f, "key_padding_mask"), true, fixture_mask(f, "attn_mask"),
                         f.scalar("average_attn_weights") != 0);
    EXPECT_LT(max_rel_error(out, f.tensor("output")), kNnTol);
    EXPECT_LT(max_rel_error(w, f.tensor("weights")), kNnTol);
  }
}

// torch::save of LibTorch's module loads into ours with torch::load, and back.
TEST(NnMultiheadAttention, ArchivesInterchangeWithLibTorch) {
  torch::manual_seed(12);
  for (const auto& o : {d2l::nn::MultiheadAttentionOptions(kNnE, kNnHeads).add_bias_kv(true),
                        d2l::nn::MultiheadAttentionOptions(kNnE, kNnHeads).kdim(6).vdim(6)}) {
    torch::nn::MultiheadAttention ref(torch::nn::MultiheadAttentionOptions(kNnE, kNnHeads)
                                          .add_bias_kv(o.add_bias_kv())
                                          .kdim(o.kdim())
                                          .vdim(o.vdim()));
    randomize(*ref, 13);
    std::stringstream theirs;
    torch::save(ref, theirs);
    d2l::nn::MultiheadAttention ours(o);
    torch::load(ours, theirs);
    for (const auto& p : ref->named_parameters()) {
      EXPECT_TRUE(torch::equal(ours->named_parameters()[p.key()], p.value())) << p.key();
    }
    randomize(*ours, 14);
    std::stringstream mine;
    torch::save(ours, mine);
    torch::load(ref, mine);
    for (const auto& p : ours->named_parameters()) {
      EXPECT_TRUE(torch::equal(ref->named_parameters()[p.key()], p.value())) << p.key();
    }
  }
}

TEST(NnMultiheadAttention, BadArgumentsNameFunctionArgumentAndShapes) {
  d2l::nn::MultiheadAttention ours(d2l::nn::MultiheadAttentionOptions(kNnE, kNnHeads));
  const auto q = torch::randn({kNnL, kNnN, kNnE}), k = torch::randn({kNnS, kNnN, kNnE});
  const std::string fn = "d2l::nn::MultiheadAttention: ";
  const auto call = [&](const torch::Tensor& kpm, const torch::Tensor& attn) {
    return error_message([&] { ours(q, k, k, kpm, true, attn); });
  };
  EXPECT_THAT(call(torch::zeros({kNnN, kNnS}, torch::kInt), torch::Tensor()),
              HasSubstr(fn + "key_padding_mask must be torch::kBool (true: not allowed) or "
                             "floating (added to the scores), got Int [2, 5]"));
  EXPECT_THAT(call({}, torch::zeros({kNnL, kNnS}, torch::kLong)),
              HasSubstr(fn + "attn_mask must be torch::kBool"));
  EXPECT_THAT(call(torch::zeros({kNnS}, torch::kBool), torch::Tensor()),
              HasSubstr(fn + "key_padding_mask must have shape [N, S] = [2, 5] for query [3, 2, "
                             "8] and key [5, 2, 8], got [5]"));
  EXPECT_THAT(call(torch::tensor(true), torch::Tensor()),
              HasSubstr(fn + "key_padding_mask must have shape [N, S] = [2, 5]"));
  EXPECT_THAT(call({}, torch::tensor(0.0)),
              HasSubstr(fn + "attn_mask must have shape [L, S] = [3, 5] or [N * num_heads, L, "
                             "S] = [4, 3, 5] for query [3, 2, 8], key [5, 2, 8] and num_heads=2, "
                             "got []"));
  EXPECT_THAT(call({}, torch::zeros({kNnN, kNnL, kNnS}, torch::kBool)), HasSubstr("got [2, 3, 5]"));
  EXPECT_THAT(call({}, torch::zeros({kNnS, kNnL})), HasSubstr("got [5, 3]"));
  EXPECT_THAT(call(torch::zeros({kNnS, kNnN}, torch::kBool), torch::Tensor()),
              HasSubstr("got [5, 2]"));
  EXPECT_THAT(call({}, torch::full({kNnL, kNnS}, std::nan(""))),
              HasSubstr(fn + "attn_mask must not hold NaN or +inf (a float mask is added to the "
                             "scores), got Float [3, 5]"));
  EXPECT_THAT(
      call(torch::full({kNnN, kNnS}, std::numeric_limits<double>::infinity()), torch::Tensor()),
      HasSubstr(fn + "key_padding_mask must not hold NaN or +inf"));
  if (torch::cuda::is_available()) {
    EXPECT_THAT(
        call(torch::zeros({kNnN, kNnS}, torch::device(torch::kCUDA).dtype(torch::kBool)), {}),
        HasSubstr(fn + "key_padding_mask"));
  } else {
    EXPECT_THAT(
        call(torch::zeros({kNnN, kNnS}, torch::device(torch::kMeta).dtype(torch::kBool)), {}),
        HasSubstr(fn + "key_padding_mask"));
  }
  EXPECT_THAT(error_message([&] {
                ours(torch::randn({kNnL, kNnN, 6}), k, k);
              }),
              HasSubstr(fn + "query must have embed_dim=8 features, got query [3, 2, 6]"));
  EXPECT_THAT(error_message([&] {
                ours(q, torch::randn({kNnS, kNnN, 6}), k);
              }),
              HasSubstr(fn + "key and value must have embed_dim=8 features when the projections "
                             "are in_proj_weight (kdim == vdim == embed_dim), got key [5, 2, 6] "
                             "and value [5, 2, 8]"));
  EXPECT_THAT(error_message([&] {
                ours(q, k, torch::randn({4, kNnN, kNnE}));
              }),
              HasSubstr(fn + "key and value must have the same sequence length (dim 0), got key "
                             "[5, 2, 8] and value [4, 2, 8]"));
  EXPECT_THAT(error_message([&] {
                ours(q, torch::randn({kNnS, 3, kNnE}), k);
              }),
              HasSubstr(fn + "query, key and value must have the same batch size (dim 1)"));
  EXPECT_THAT(error_message([&] { ours(q.select(0, 0), k, k); }),
              HasSubstr(fn + "query must be a 3-D tensor (L, N, features), got [2, 8]"));
  EXPECT_THAT(
      error_message([&] { ours(k, q, q, torch::Tensor(), true, torch::Tensor(), true, true); }),
      HasSubstr(fn + "is_causal needs at least as many keys as queries"));
  EXPECT_THAT(error_message([&] { ours(q.to(torch::kDouble), k, k); }),
              HasSubstr(fn + "key must have the same dtype as query"));
  EXPECT_THAT(error_message([] { d2l::nn::MultiheadAttention(8, 3); }),
              HasSubstr("d2l::nn::MultiheadAttention: embed_dim must be divisible by num_heads, "
                        "got embed_dim=8 and num_heads=3"));
  EXPECT_THAT(error_message([] {
                d2l::nn::MultiheadAttention(d2l::nn::MultiheadAttentionOptions(8, 2).dropout(1.5));
              }),
              HasSubstr("d2l::nn::MultiheadAttention: dropout must be a probability in [0, 1]"));
}

// Empty batches and sequences give empty results of the right shapes, on
// both paths (LibTorch's module cannot take N = 0: its view of -1 is ambiguous).
TEST(NnMultiheadAttention, EmptyInputs) {
  d2l::nn::MultiheadAttention ours(kNnE, kNnHeads);
  for (const auto& [L, N, S] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 2, 5}, {3, 0, 5}, {0, 0, 0}}) {
    const auto q = torch::randn({L, N, kNnE}, torch::requires_grad()),
               k = torch::randn({S, N, kNnE});
    for (const auto& mask : {torch::Tensor(), torch::randn({L, S})}) {
      auto [out, w] = ours(q, k, k, torch::Tensor(), true, mask);
      EXPECT_EQ(out.sizes(), (std::vector<int64_t>{L, N, kNnE}));
      EXPECT_EQ(w.sizes(), (std::vector<int64_t>{N, L, S}));
      out.sum().backward();
    }
  }
}
}  // namespace
