// d2l::nn::TransformerEncoderLayer and TransformerDecoderLayer against
// LibTorch's torch::nn layers (outputs and every gradient on the same
// weights), against Python's layers for what LibTorch's C++ lacks or does
// otherwise (fixtures from tests/fixtures/generate_fixtures_nn.py), state
// dicts and archives, and their errors.

#include <d2l/nn.h>
#include <d2l/state_dict.h>

#include <fmt/format.h>

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

constexpr double kLayerTol = 1e-5;
constexpr int64_t kLayerD = 8, kLayerHeads = 2, kLayerFF = 16, kLayerS = 5, kLayerT = 4,
                  kLayerN = 3;
const double kLayerNegInf = -std::numeric_limits<double>::infinity();

torch::Tensor layer_padding(int64_t n, int64_t s) {
  auto kpm = torch::zeros({n, s}, torch::kBool);
  kpm.index_put_({0, torch::indexing::Slice(s - 2)}, true);
  kpm.index_put_({n - 1, s - 1}, true);
  return kpm;
}

torch::Tensor layer_causal(int64_t n) { return torch::full({n, n}, kLayerNegInf).triu(1); }

struct LayerMasks {
  torch::Tensor attn, kpm;
};

// Masks as LibTorch's C++ takes them: float attn masks (it adds boolean ones).
LayerMasks layer_masks(const std::string& kind, int64_t L, int64_t S) {
  LayerMasks m;
  if (kind == "kpm" || kind == "both") m.kpm = layer_padding(kLayerN, S);
  if (kind == "float" || kind == "both") m.attn = torch::randn({L, S});
  if (kind == "causal") m.attn = layer_causal(L);
  return m;
}

double worst_layer_error = 0;

void expect_close(const char* what, double error, const std::string& where) {
  EXPECT_LT(error, kLayerTol) << what << " " << where;
  worst_layer_error = std::max(worst_layer_error, error);
}

TEST(NnTransformerLayers, EncoderEqualsLibTorch) {
  uint64_t seed = 200;
  for (const bool gelu : {false, true}) {
    for (const std::string kind : {"none", "kpm", "float", "causal", "both"}) {
      const auto where = fmt::format("gelu {} mask {}", gelu, kind);
      torch::manual_seed(++seed);
      auto ours_options =
          d2l::nn::TransformerEncoderLayerOptions(kLayerD, kLayerHeads).dim_feedforward(kLayerFF);
      auto ref_options =
          torch::nn::TransformerEncoderLayerOptions(kLayerD, kLayerHeads).dim_feedforward(kLayerFF);
      if (gelu) ours_options.activation(torch::kGELU), ref_options.activation(torch::kGELU);
      d2l::nn::TransformerEncoderLayer ours(ours_options);
      torch::nn::TransformerEncoderLayer ref(ref_options);
      randomize(*ours, seed);
      copy_parameters(*ours, *ref);
      ours->eval();
      ref->eval();
      const auto src = torch::randn({kLayerS, kLayerN, kLayerD});
      const auto masks = layer_masks(kind, kLayerS, kLayerS);
      auto a = src.clone().requires_grad_(), b = src.clone().requires_grad_();
      const bool causal = kind == "causal";
      const auto out =
          causal ? ours(a, torch::Tensor(), masks.kpm, true) : ours(a, masks.attn, masks.kpm);
      const auto ref_out = ref(b, masks.attn, masks.kpm);
      expect_close("output", max_rel_error(out, ref_out), where);
      const auto G = torch::randn(out.sizes());
      expect_close("gradients",
                   max_grad_error(backward(*ours, out, G, {a}), backward(*ref, ref_out, G, {b})),
                   where);
    }
  }
}

TEST(NnTransformerLayers, DecoderEqualsLibTorch) {
  uint64_t seed = 300;
  for (const bool gelu : {false, true}) {
    for (const std::string kind : {"none", "kpm", "float", "causal", "both"}) {
      const auto where = fmt::format("gelu {} mask {}", gelu, kind);
      torch::manual_seed(++seed);
      auto ours_options =
          d2l::nn::TransformerDecoderLayerOptions(kLayerD, kLayerHeads).dim_feedforward(kLayerFF);
      auto ref_options =
          torch::nn::TransformerDecoderLayerOptions(kLayerD, kLayerHeads).dim_feedforward(kLayerFF);
      if (gelu) ours_options.activation(torch::kGELU), ref_options.activation(torch::kGELU);
      d2l::nn::TransformerDecoderLayer ours(ours_options);
      torch::nn::TransformerDecoderLayer ref(ref_options);
      randomize(*ours, seed);
      copy_parameters(*ours, *ref);
      ours->eval();
      ref->eval();
      const auto tgt = torch::randn({kLayerT, kLayerN, kLayerD});
      const auto memory = torch::randn({kLayerS, kLayerN, kLayerD});
      const auto self_masks = layer_masks(kind, kLayerT, kLayerT);
      const auto cross_masks = layer_masks(kind == "causal" ? "kpm" : kind, kLayerT, kLayerS);
      auto a = tgt.clone().requires_grad_(), b = tgt.clone().requires_grad_();
      auto ma = memory.clone().requires_grad_(), mb = memory.clone().requires_grad_();
      const bool causal = kind == "causal";
      const auto out = ours(a, ma, causal ? torch::Tensor() : self_masks.attn, cross_masks.attn,
                            self_masks.kpm, cross_masks.kpm, causal);
      const auto ref_out =
          ref(b, mb, self_masks.attn, cross_masks.attn, self_masks.kpm, cross_masks.kpm);
      expect_close("output", max_rel_error(out, ref_out), where);
      const auto G = torch::randn(out.sizes());
      expect_close(
          "gradients",
          max_grad_error(backward(*ours, out, G, {a, ma}), backward(*ref, ref_out, G, {b, mb})),
          where);
    }
  }
  std::cout << fmt::format("[ nn layer parity vs LibTorch ] 20 cases: worst {:.3g}\n",
                           worst_layer_error);
}

// Python's layers: boolean masks (which LibTorch's C++ adds), batch_first,
// norm_first, layer_norm_eps, and from torch 2.11 bias=False and is_causal.
void expect_python_layer(const std::string& name) {
  SCOPED_TRACE(name);
  const auto f = d2l::testing::load_fixture(name + "_float32");
  const auto flag = [&](const char* s) { return f.scalar(s) != 0; };
  const auto d_model = static_cast<int64_t>(f.scalar("d_model"));
  const auto nhead = static_cast<int64_t>(f.scalar("nhead"));
  const auto ff = static_cast<int64_t>(f.scalar("dim_feedforward"));
  const d2l::nn::activation_t activation =
      flag("gelu") ? d2l::nn::activation_t(torch::kGELU) : d2l::nn::activation_t(torch::kReLU);
  torch::Tensor out;
  std::vector<torch::Tensor> inputs;
  std::vector<std::string> names;
  std::shared_ptr<torch::nn::Module> module;
  if (f.has_tensor("src")) {
    d2l::nn::TransformerEncoderLayer layer(d2l::nn::TransformerEncoderLayerOptions(d_model, nhead)
                                               .dim_feedforward(ff)
                                               .activation(activation)
                                               .batch_first(flag("batch_first"))
                                               .norm_first(flag("norm_first"))
                                               .layer_norm_eps(f.scalar("layer_norm_eps"))
                                               .bias(flag("bias")));
    layer->eval();
    load_fixture_parameters(f, *layer);
    names = {"src"};
    inputs = {f.tensor("src").clone().requires_grad_()};
    out = layer(inputs[0], fixture_mask(f, "src_mask"), fixture_mask(f, "src_key_padding_mask"),
                flag("is_causal"));
    if (flag("is_causal")) {
      EXPECT_LT(max_rel_error(layer(inputs[0], torch::Tensor(),
                                    fixture_mask(f, "src_key_padding_mask"), true),
                              f.tensor("output")),
                kLayerTol)
          << "is_causal alone";
    }
    module = layer.ptr();
  } else {
    d2l::nn::TransformerDecoderLayer layer(d2l::nn::TransformerDecoderLayerOptions(d_model, nhead)
                                               .dim_feedforward(ff)
                                               .activation(activation)
                                               .batch_first(flag("batch_first"))
                                               .norm_first(flag("norm_first"))
                                               .layer_norm_eps(f.scalar("layer_norm_eps"))
                                               .bias(flag("bias")));
    layer->eval();
    load_fixture_parameters(f, *layer);
    names = {"tgt", "memory"};
    inputs = {f.tensor("tgt").clone().requires_grad_(),
              f.tensor("memory").clone().requires_grad_()};
    out = layer(inputs[0], inputs[1], fixture_mask(f, "tgt_mask"), fixture_mask(f, "memory_mask"),
                fixture_mask(f, "tgt_key_padding_mask"), fixture_mask(f, "memory_key_padding_mask"),
                flag("is_causal"));
    module = layer.ptr();
  }
  const double out_error = max_rel_error(out, f.tensor("output"));
  EXPECT_LT(out_error, kLayerTol);
  const double grad_error = max_grad_error(backward(*module, out, f.tensor("G"), inputs),
                                           fixture_grads(f, *module, names));
  EXPECT_LT(grad_error, kLayerTol);
  std::cout << fmt::format("[ nn layer parity vs Python ] {}: output {:.3g}, gradients {:.3g}\n",
                           name, out_error, grad_error);
}

TEST(NnTransformerLayers, EqualPython) {
  for (const auto* name : {"nn_encoder_post", "nn_encoder_pre_gelu", "nn_decoder_post",
                           "nn_encoder_nobias_causal", "nn_decoder_pre_nobias"}) {
    expect_python_layer(name);
  }
}

TEST(NnTransformerLayers, LoadPythonStateDict) {
  for (const auto& [pt, fixture] : std::vector<std::pair<std::string, std::string>>{
           {"nn_state_encoder_torch113.pt", "nn_encoder_post"},
           {"nn_state_encoder_torch211.pt", "nn_encoder_nobias_causal"}}) {
    SCOPED_TRACE(pt);
    const auto f = d2l::testing::load_fixture(fixture + "_float32");
    d2l::nn::TransformerEncoderLayer layer(
        d2l::nn::TransformerEncoderLayerOptions(kLayerD, kLayerHeads)
            .dim_feedforward(kLayerFF)
            .bias(f.scalar("bias") != 0));
    layer->eval();
    d2l::load_state_dict(*layer, std::string(D2L_FIXTURE_DIR) + "/" + pt);
    torch::NoGradGuard no_grad;
    const auto out = layer(f.tensor("src"), fixture_mask(f, "src_mask"),
                           fixture_mask(f, "src_key_padding_mask"), f.scalar("is_causal") != 0);
    EXPECT_LT(max_rel_error(out, f.tensor("output")), kLayerTol);
  }
}

TEST(NnTransformerLayers, LoadPythonDecoderStateDict) {
  for (const auto& [pt, fixture] : std::vector<std::pair<std::string, std::string>>{
           {"nn_state_decoder_torch113.pt", "nn_decoder_post"},
           {"nn_state_decoder_torch211.pt", "nn_decoder_pre_nobias"}}) {
    SCOPED_TRACE(pt);
    const auto f = d2l::testing::load_fixture(fixture + "_float32");
    const auto flag = [&](const char* s) { return f.scalar(s) != 0; };
    d2l::nn::TransformerDecoderLayer layer(
        d2l::nn::TransformerDecoderLayerOptions(kLayerD, kLayerHeads)
            .dim_feedforward(kLayerFF)
            .activation(flag("gelu") ? d2l::nn::activation_t(torch::kGELU)
                                     : d2l::nn::activation_t(torch::kReLU))
            .batch_first(flag("batch_first"))
            .norm_first(flag("norm_first"))
            .bias(flag("bias")));
    layer->eval();
    d2l::load_state_dict(*layer, std::string(D2L_FIXTURE_DIR) + "/" + pt);
    torch::NoGradGuard no_grad;
    const auto out = layer(f.tensor("tgt"), f.tensor("memory"), fixture_mask(f, "tgt_mask"),
                           fixture_mask(f, "memory_mask"), fixture_mask(f, "tgt_key_padding_mask"),
                           fixture_mask(f, "memory_key_padding_mask"), flag("is_causal"));
    EXPECT_LT(max_rel_error(out, f.tensor("output")), kLayerTol);
  }
}

TEST(NnTransformerLayers, ArchivesInterchangeWithLibTorch) {
  torch::manual_seed(21);
  torch::nn::TransformerDecoderLayer ref(
      torch::nn::TransformerDecoderLayerOptions(kLayerD, kLayerHeads).dim_feedforward(kLayerFF));
  randomize(*ref, 22);
  std::stringstream theirs;
  torch::save(ref, theirs);
  d2l::nn::TransformerDecoderLayer ours(
      d2l::nn::TransformerDecoderLayerOptions(kLayerD, kLayerHeads).dim_feedforward(kLayerFF));
  torch::load(ours, theirs);
  for (const auto& p : ref->named_parameters()) {
    EXPECT_TRUE(torch::equal(ours->named_parameters()[p.key()], p.value())) << p.key();
  }
  torch::nn::TransformerEncoderLayer ref_encoder(
      torch::nn::TransformerEncoderLayerOptions(kLayerD, kLayerHeads).dim_feedforward(kLayerFF));
  d2l::nn::TransformerEncoderLayer ours_encoder(
      d2l::nn::TransformerEncoderLayerOptions(kLayerD, kLayerHeads).dim_feedforward(kLayerFF));
  randomize(*ours_encoder, 23);
  std::stringstream mine;
  torch::save(ours_encoder, mine);
  torch::load(ref_encoder, mine);
  for (const auto& p : ours_encoder->named_parameters()) {
    EXPECT_TRUE(torch::equal(ref_encoder->named_parameters()[p.key()], p.value())) << p.key();
  }
}

TEST(NnTransformerLayers, SubmodulesOptionsAndClone) {
  d2l::nn::TransformerDecoderLayer ours(d2l::nn::TransformerDecoderLayerOptions(kLayerD, 2));
  torch::nn::TransformerDecoderLayer ref(torch::nn::TransformerDecoderLayerOptions(kLayerD, 2));
  std::vector<std::string> mine, theirs;
  for (const auto& m : ours->named_children()) mine.push_back(m.key());
  for (const auto& m : ref->named_children()) theirs.push_back(m.key());
  EXPECT_EQ(mine, theirs);
  EXPECT_EQ(ours->options.dim_feedforward(), 2048);
  EXPECT_EQ(ours->options.dropout(), 0.1);
  EXPECT_EQ(ours->norm1->options.eps(), 1e-5);
  d2l::nn::TransformerEncoderLayer nobias(
      d2l::nn::TransformerEncoderLayerOptions(kLayerD, 2).bias(false).dim_feedforward(kLayerFF));
  for (const auto& p : nobias->named_parameters()) {
    EXPECT_THAT(p.key(), ::testing::Not(HasSubstr("bias"))) << p.key();
  }
  const auto copy =
      std::dynamic_pointer_cast<d2l::nn::TransformerEncoderLayerImpl>(nobias->clone());
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->named_parameters().size(), nobias->named_parameters().size());
  EXPECT_TRUE(torch::equal(copy->norm1->weight, nobias->norm1->weight));
  auto custom = d2l::nn::TransformerEncoderLayer(
      d2l::nn::TransformerEncoderLayerOptions(kLayerD, 2)
          .dim_feedforward(kLayerFF)
          .dropout(0.0)
          .activation([](const torch::Tensor& x) { return torch::tanh(x); }));
  EXPECT_TRUE(d2l::testing::printed(*custom).find("activation=<function>") != std::string::npos);
  custom->eval();
  EXPECT_EQ(custom(torch::randn({kLayerS, kLayerN, kLayerD})).sizes(),
            (std::vector<int64_t>{kLayerS, kLayerN, kLayerD}));
}

TEST(NnTransformerLayers, WorkInSequentialAndAnyModule) {
  torch::manual_seed(24);
  d2l::nn::TransformerEncoderLayer layer(
      d2l::nn::TransformerEncoderLayerOptions(kLayerD, 2).dim_feedforward(kLayerFF));
  layer->eval();
  torch::nn::Sequential stack(
      layer, d2l::nn::TransformerEncoderLayer(
                 std::dynamic_pointer_cast<d2l::nn::TransformerEncoderLayerImpl>(layer->clone())));
  const auto x = torch::randn({kLayerS, kLayerN, kLayerD});
  const auto out = stack->forward(x);
  EXPECT_EQ(out.sizes(), x.sizes());
  torch::nn::AnyModule any(d2l::nn::TransformerDecoderLayer(
      d2l::nn::TransformerDecoderLayerOptions(kLayerD, 2).dim_feedforward(kLayerFF)));
  EXPECT_EQ(any.forward(x, x).sizes(), x.sizes());
}

TEST(NnTransformerLayers, BadArguments) {
  d2l::nn::TransformerEncoderLayer encoder(
      d2l::nn::TransformerEncoderLayerOptions(kLayerD, 2).dim_feedforward(kLayerFF));
  EXPECT_THAT(error_message([&] {
                encoder(torch::randn({kLayerS, kLayerN, 6}));
              }),
              HasSubstr("d2l::nn::TransformerEncoderLayer: src must be a 3-D tensor (seq, N, "
                        "d_model) with d_model=8 features, got [5, 3, 6]"));
  const auto src = torch::randn({kLayerS, kLayerN, kLayerD});
  EXPECT_THAT(error_message([&] {
                encoder(src, torch::zeros({kLayerS, 4}, torch::kBool));
              }),
              HasSubstr("d2l::nn::MultiheadAttention: attn_mask must have shape [L, S] = [5, 5]"));
  EXPECT_THAT(error_message([&] {
                encoder(src, torch::Tensor(), torch::zeros({kLayerN, kLayerS}, torch::kInt));
              }),
              HasSubstr("d2l::nn::MultiheadAttention: key_padding_mask must be torch::kBool"));
  d2l::nn::TransformerDecoderLayer decoder(
      d2l::nn::TransformerDecoderLayerOptions(kLayerD, 2).dim_feedforward(kLayerFF));
  EXPECT_THAT(error_message([&] {
                decoder(src, torch::randn({kLayerS, kLayerD}));
              }),
              HasSubstr("d2l::nn::TransformerDecoderLayer: memory must be a 3-D tensor (seq, N, "
                        "d_model) with d_model=8 features, got [5, 8]"));
  EXPECT_THAT(error_message([] {
                d2l::nn::TransformerEncoderLayer(d2l::nn::TransformerEncoderLayerOptions(8, 3));
              }),
              HasSubstr("d2l::nn::TransformerEncoderLayer: d_model must be divisible by nhead, "
                        "got d_model=8 and nhead=3"));
  EXPECT_THAT(
      error_message([] {
        d2l::nn::TransformerDecoderLayer(
            d2l::nn::TransformerDecoderLayerOptions(8, 2).layer_norm_eps(0));
      }),
      HasSubstr("d2l::nn::TransformerDecoderLayer: layer_norm_eps must be positive, got 0"));
}

}  // namespace
