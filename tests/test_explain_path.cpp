// explain_path and the one function per op that chooses a path
// (Note [Choosing a path]): the decision tables of dot-product and additive
// attention, row by row (backend, dtype, device, dropout in training, weights,
// empty sizes → path and reasons), and that the path explained is the path
// the call runs, read from the autograd graph it records.

#include <d2l/additive_attention.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/torch_version.h>

#include <set>
#include <string>
#include <vector>

#include "select_helpers.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::testing::error_message;
using d2l::testing::graph_nodes;
using d2l::testing::has_node;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace F = d2l::functional;

// The autograd node that only `path` records (composite: the book's tanh or
// softmax and none of ours).
void expect_graph_of(const std::string& path, const torch::Tensor& out, const std::string& what) {
  const auto nodes = graph_nodes(out);
  const bool ours =
      has_node(nodes, "FlashAttentionFunction") || has_node(nodes, "FlashBf16Function") ||
      has_node(nodes, "MaskedSoftmaxFunction") ||
      has_node(nodes, "::AdditiveFunction") || has_node(nodes, "AdditiveValuesFunction") ||
      has_node(nodes, "AdditiveProjectedFunction") || has_node(nodes, "ChunkedAdditiveFunction");
  if (path == "flash") EXPECT_TRUE(has_node(nodes, "FlashAttentionFunction")) << what;
  if (path == "flash_bf16") EXPECT_TRUE(has_node(nodes, "FlashBf16Function")) << what;
  if (path == "fused_softmax") EXPECT_TRUE(has_node(nodes, "MaskedSoftmaxFunction")) << what;
  if (path == "fused_projections")
    EXPECT_TRUE(has_node(nodes, "AdditiveProjectedFunction")) << what;
  if (path == "fused_values") EXPECT_TRUE(has_node(nodes, "AdditiveValuesFunction")) << what;
  if (path == "fused_scores") EXPECT_TRUE(has_node(nodes, "::AdditiveFunction")) << what;
  if (path == "chunked") EXPECT_TRUE(has_node(nodes, "ChunkedAdditiveFunction")) << what;
  if (path == "composite") EXPECT_FALSE(ours) << what;
}

struct DotRow {
  AttentionBackend backend;
  double dropout;
  bool training, need_weights, empty;
  const char* path;
  std::vector<std::string> reasons;
};

const char* kComposite = "AttentionBackend::kComposite asks for the book's ops";

std::vector<DotRow> dot_product_cpu_rows() {
  const std::string drop = "dropout 0.1 in training (no dropout in the kernel)";
  const std::string zero = "a size is zero (the softmax paths keep the autograd graph)";
  std::vector<DotRow> rows;
  for (auto backend : {AttentionBackend::kAuto, AttentionBackend::kFused}) {
    rows.push_back({backend, 0.0, false, true, false, "flash", {}});
    rows.push_back({backend, 0.0, false, false, false, "flash", {}});
    rows.push_back({backend, 0.1, false, true, false, "flash", {}});  // eval: no dropout drawn
    rows.push_back({backend, 0.1, true, true, false, "fused_softmax", {"flash: " + drop}});
    rows.push_back({backend, 0.1, true, false, false, "fused_softmax", {"flash: " + drop}});
    rows.push_back({backend, 0.0, false, true, true, "fused_softmax", {"flash: " + zero}});
    rows.push_back(
        {backend, 0.1, true, true, true, "fused_softmax", {"flash: " + drop, "flash: " + zero}});
  }
  for (bool training : {false, true}) {
    rows.push_back({AttentionBackend::kComposite,
                    0.1,
                    training,
                    true,
                    false,
                    "composite",
                    {std::string("flash: ") + kComposite, std::string("sdpa: ") + kComposite,
                     std::string("fused_softmax: ") + kComposite}});
  }
  if (d2l::sdpa_available()) {
    rows.push_back({AttentionBackend::kSdpa, 0.0, false, false, false, "sdpa", {}});
    rows.push_back({AttentionBackend::kSdpa, 0.1, true, false, false, "sdpa", {}});
    rows.push_back({AttentionBackend::kSdpa,
                    0.0,
                    false,
                    false,
                    true,
                    "composite",
                    {"sdpa: a size is zero (the composite path keeps the autograd graph)"}});
  }
  return rows;
}

TEST(ExplainPath, DotProductDecisionTableOnTheCpu) {
  torch::manual_seed(1);
  for (const auto& row : dot_product_cpu_rows()) {
    const int64_t B = row.empty ? 0 : 2;
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
      const auto q = torch::randn({B, 3, 4}, dtype).requires_grad_();
      const auto k = torch::randn({B, 5, 4}, dtype), v = torch::randn({B, 5, 2}, dtype);
      const auto options = F::DotProductAttentionFuncOptions()
                               .valid_lens(row.empty ? torch::Tensor() : torch::tensor({2, 5}))
                               .dropout(row.dropout)
                               .training(row.training)
                               .backend(row.backend)
                               .need_weights(row.need_weights);
      const auto what = fmt::format("backend {} dropout {} training {} weights {} empty {} {}",
                                    d2l::to_string(row.backend), row.dropout, row.training,
                                    row.need_weights, row.empty, c10::toString(dtype));
      const auto explained = d2l::explain_path(q, k, v, options);
      EXPECT_EQ(explained.op, "d2l::dot_product_attention") << what;
      EXPECT_EQ(explained.backend, row.backend) << what;
      // bfloat16 where the table says flash runs the flash kernel's bfloat16
      // kernel when the instruction set has it and no weights are asked
      // (its 3 queries row by row), else says why not
      // (test_flash_attention_bf16.cpp has the reasons).
      const bool flash_bf16 = dtype == torch::kBFloat16 && std::string(row.path) == "flash" &&
                              !row.need_weights && d2l::cpu_isa() >= d2l::CpuIsa::kAvx512Bf16;
      EXPECT_EQ(explained.path, flash_bf16 ? std::string("flash_bf16") : std::string(row.path))
          << what;
      auto reasons = explained.reasons;
      if (flash_bf16 && !reasons.empty() &&
          reasons.back().rfind("flash_bf16_amx: ", 0) == 0) {
        reasons.pop_back();  // the CPU has AMX and its tiles are not in use: one line says why
      } else if (dtype == torch::kBFloat16 && std::string(row.path) == "flash" && !flash_bf16) {
        ASSERT_FALSE(reasons.empty()) << what;
        EXPECT_THAT(reasons.back(), ::testing::StartsWith("flash_bf16: ")) << what;
        EXPECT_THAT(reasons.back(), ::testing::EndsWith("; bfloat16 is widened to float")) << what;
        reasons.pop_back();
      }
      EXPECT_EQ(reasons, row.reasons) << what;
      const auto [out, weights] = F::dot_product_attention(q, k, v, options);
      EXPECT_EQ(weights.defined(), row.need_weights) << what;
      if (!row.empty) expect_graph_of(explained.path, out, what);
      if (row.empty && std::string(row.path) == "fused_softmax") {
        EXPECT_FALSE(has_node(graph_nodes(out), "FlashAttentionFunction")) << what;
      }
    }
  }
}

TEST(ExplainPath, DotProductRefusalsAreTheCallsErrors) {
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 2});
  const auto sdpa = F::DotProductAttentionFuncOptions().backend(AttentionBackend::kSdpa);
  const auto message = error_message([&] { F::dot_product_attention(q, k, v, sdpa); });
  EXPECT_EQ(error_message([&] { d2l::explain_path(q, k, v, sdpa); }), message);
  EXPECT_THAT(message, HasSubstr(d2l::sdpa_available()
                                     ? "d2l::dot_product_attention: AttentionBackend::kSdpa "
                                       "returns no attention weights"
                                     : "d2l::dot_product_attention: AttentionBackend::kSdpa "
                                       "needs LibTorch 2.1 or newer"));
  for (double p : {-0.1, 1.5}) {
    const auto options = F::DotProductAttentionFuncOptions().dropout(p).training(true);
    EXPECT_THAT(error_message([&] { d2l::explain_path(q, k, v, options); }),
                HasSubstr(fmt::format("d2l::dot_product_attention: dropout must be a probability "
                                      "in [0, 1], got {}",
                                      p)));
  }
  EXPECT_THAT(
      error_message([&] {
        d2l::explain_path(q, torch::randn({2, 5, 3}), v, F::DotProductAttentionFuncOptions());
      }),
      HasSubstr("d2l::dot_product_attention: queries and keys must have the same feature "
                "size"));
}

// Off the CPU, read from tensors on the meta device (no GPU needed): the
// choice looks only at the device, dtype and sizes.
TEST(ExplainPath, DotProductDecisionTableOffTheCpu) {
  using d2l::detail::DotProductPath;
  const auto q = torch::empty({2, 3, 4}, torch::kMeta), k = torch::empty({2, 5, 4}, torch::kMeta);
  std::vector<std::string> reasons;
  EXPECT_EQ(d2l::testing::select_dot("f", AttentionBackend::kAuto, q, k, 0, false, false, &reasons),
            DotProductPath::kComposite);
  const std::string off = "tensors on meta (the fused kernels run on the CPU)";
  const std::string sdpa =
      d2l::sdpa_available()
          ? "sdpa: AttentionBackend::kAuto runs it on CUDA only, got tensors on meta"
          : fmt::format("sdpa: LibTorch {} has no scaled_dot_product_attention (2.1+)",
                        d2l::torch_version());
  EXPECT_THAT(reasons, ElementsAre(sdpa, "flash: " + off, "fused_softmax: " + off));
  reasons.clear();
  EXPECT_EQ(d2l::testing::select_dot("f", AttentionBackend::kComposite, q, k, 0, false, true, &reasons),
            DotProductPath::kComposite);
  EXPECT_EQ(reasons.size(), 3u);
  EXPECT_THAT(error_message([&] {
                d2l::testing::select_dot("f", AttentionBackend::kFused, q, k, 0, false, true);
              }),
              HasSubstr("f: AttentionBackend::kFused runs on the CPU, got tensors on meta; set "
                        "the backend to AttentionBackend::kAuto"));
}

TEST(ExplainPath, DotProductOnCudaChoosesSdpaWithoutWeights) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto q = torch::randn({2, 3, 4}, torch::kCUDA), k = torch::randn({2, 5, 4}, torch::kCUDA);
  const auto v = torch::randn({2, 5, 2}, torch::kCUDA);
  const auto explained =
      d2l::explain_path(q, k, v, F::DotProductAttentionFuncOptions().need_weights(false));
  EXPECT_EQ(explained.path, d2l::sdpa_available() ? "sdpa" : "composite");
  const auto with_weights = d2l::explain_path(q, k, v, F::DotProductAttentionFuncOptions());
  EXPECT_EQ(with_weights.path, "composite");
  if (d2l::sdpa_available()) {
    EXPECT_THAT(with_weights.reasons,
                ::testing::Contains("sdpa: attention weights asked for (SDPA returns none)"));
  }
}

struct AdditiveRow {
  AttentionBackend backend;
  torch::Dtype dtype;
  double dropout;
  bool training, need_weights, empty;
  const char* path;
  std::vector<std::string> reasons;
};

std::vector<AdditiveRow> additive_cpu_rows() {
  const std::string drop = "dropout 0.1 in training (drawn on the weights before the values)";
  std::vector<AdditiveRow> rows;
  for (auto backend : {AttentionBackend::kAuto, AttentionBackend::kFused}) {
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      for (bool empty : {false, true}) {
        rows.push_back({backend, dtype, 0.0, false, true, empty, "fused_projections", {}});
        rows.push_back({backend, dtype, 0.0, false, false, empty, "fused_projections", {}});
        rows.push_back({backend, dtype, 0.1, false, true, empty, "fused_projections", {}});
        rows.push_back({backend,
                        dtype,
                        0.1,
                        true,
                        true,
                        empty,
                        "fused_scores",
                        {"fused_projections: " + drop, "fused_values: " + drop}});
      }
    }
    rows.push_back({backend,
                    torch::kBFloat16,
                    0.0,
                    false,
                    true,
                    false,
                    "fused_values",
                    {"fused_projections: dtype BFloat16 (float and double only)"}});
    rows.push_back({backend,
                    torch::kBFloat16,
                    0.1,
                    true,
                    true,
                    false,
                    "fused_scores",
                    {"fused_projections: " + drop, "fused_values: " + drop}});
  }
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (bool training : {false, true}) {
      rows.push_back(
          {AttentionBackend::kComposite,
           dtype,
           0.1,
           training,
           true,
           false,
           "composite",
           {std::string("fused_projections: ") + kComposite,
            std::string("fused_values: ") + kComposite, std::string("fused_scores: ") + kComposite,
            std::string("chunked: ") + kComposite}});
    }
  }
  return rows;
}

TEST(ExplainPath, AdditiveDecisionTableOnTheCpu) {
  torch::manual_seed(3);
  for (const auto& row : additive_cpu_rows()) {
    const int64_t B = row.empty ? 0 : 2;
    const auto q = torch::randn({B, 3, 4}, row.dtype).requires_grad_();
    const auto k = torch::randn({B, 5, 3}, row.dtype), v = torch::randn({B, 5, 2}, row.dtype);
    const auto W_q = torch::randn({6, 4}, row.dtype), W_k = torch::randn({6, 3}, row.dtype);
    const auto w_v = torch::randn({1, 6}, row.dtype);
    const auto options = F::AdditiveAttentionFuncOptions(W_q, W_k, w_v)
                             .valid_lens(row.empty ? torch::Tensor() : torch::tensor({2, 5}))
                             .dropout(row.dropout)
                             .training(row.training)
                             .backend(row.backend)
                             .need_weights(row.need_weights);
    const auto what = fmt::format("backend {} {} dropout {} training {} weights {} empty {}",
                                  d2l::to_string(row.backend), c10::toString(row.dtype),
                                  row.dropout, row.training, row.need_weights, row.empty);
    const auto explained = d2l::explain_path(q, k, v, options);
    EXPECT_EQ(explained.op, "d2l::additive_attention") << what;
    EXPECT_EQ(explained.path, row.path) << what;
    EXPECT_EQ(explained.reasons, row.reasons) << what;
    const auto [out, weights] = F::additive_attention(q, k, v, options);
    EXPECT_EQ(weights.defined(), row.need_weights) << what;
    expect_graph_of(row.path, out, what);
  }
}

TEST(ExplainPath, AdditiveDecisionTableOffTheCpuAndForItsParts) {
  using d2l::detail::AdditivePath;
  using d2l::detail::AdditiveStage;
  const auto meta = torch::empty({2, 3, 6}, torch::kMeta);
  const auto cpu = torch::randn({2, 3, 6});
  auto choose = [](AttentionBackend backend, const torch::Tensor& q, double dropout, bool training,
                   AdditiveStage stage, std::vector<std::string>* reasons) {
    return d2l::testing::select_additive("f", backend, q, dropout, training, stage, reasons);
  };
  const std::string off = "tensors on meta (the fused kernels run on the CPU)";
  std::vector<std::string> reasons;
  EXPECT_EQ(choose(AttentionBackend::kAuto, meta, 0, false, AdditiveStage::kFull, &reasons),
            AdditivePath::kChunked);
  EXPECT_THAT(reasons, ElementsAre("fused_projections: " + off, "fused_values: " + off,
                                   "fused_scores: " + off));
  reasons.clear();
  // A decoder that projected its keys once: the kernel through the values.
  EXPECT_EQ(choose(AttentionBackend::kAuto, cpu, 0, false, AdditiveStage::kProjected, &reasons),
            AdditivePath::kFusedValues);
  EXPECT_THAT(reasons, ElementsAre("fused_projections: the caller projected the queries and keys"));
  reasons.clear();
  EXPECT_EQ(choose(AttentionBackend::kAuto, cpu, 0.1, true, AdditiveStage::kProjected, &reasons),
            AdditivePath::kFusedScores);
  EXPECT_EQ(reasons.size(), 1u);
  // The scores alone (functional::additive_scores).
  EXPECT_EQ(choose(AttentionBackend::kAuto, cpu, 0, false, AdditiveStage::kScores, nullptr),
            AdditivePath::kFusedScores);
  EXPECT_EQ(choose(AttentionBackend::kAuto, meta, 0, false, AdditiveStage::kScores, nullptr),
            AdditivePath::kChunked);
  EXPECT_EQ(choose(AttentionBackend::kComposite, cpu, 0, false, AdditiveStage::kScores, nullptr),
            AdditivePath::kComposite);
  EXPECT_THAT(error_message([&] {
                choose(AttentionBackend::kFused, meta, 0, false, AdditiveStage::kFull, nullptr);
              }),
              HasSubstr("f: AttentionBackend::kFused runs on the CPU, got tensors on meta"));
}

TEST(ExplainPath, AdditiveRefusesSdpaByName) {
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 3}), v = torch::randn({2, 5, 2});
  const auto options = F::AdditiveAttentionFuncOptions(torch::randn({6, 4}), torch::randn({6, 3}),
                                                       torch::randn({1, 6}))
                           .backend(AttentionBackend::kSdpa);
  const auto message = error_message([&] { F::additive_attention(q, k, v, options); });
  EXPECT_EQ(error_message([&] { d2l::explain_path(q, k, v, options); }), message);
  EXPECT_THAT(message, HasSubstr("d2l::additive_attention: AttentionBackend::kSdpa (LibTorch's "
                                 "scaled_dot_product_attention) is only for dot-product "
                                 "attention"));
  EXPECT_THAT(message, HasSubstr("set the backend to AttentionBackend::kAuto"));
}

TEST(ExplainPath, ModulesExplainWhatTheirForwardRuns) {
  torch::manual_seed(2);
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 2});
  const auto lens = torch::tensor({2, 5});
  d2l::DotProductAttention dot(0.1);
  EXPECT_EQ(dot->explain_path(q, k, v, lens).path, "fused_softmax");  // training by default
  dot->eval();
  const auto explained = dot->explain_path(q, k, v, lens);
  EXPECT_EQ(explained.path, "flash");
  EXPECT_TRUE(explained.reasons.empty());
  d2l::AdditiveAttention additive(4, 4, 6, 0.1);
  EXPECT_EQ(additive->explain_path(q, k, v, lens).op, "d2l::AdditiveAttention");
  EXPECT_EQ(additive->explain_path(q, k, v, lens).path, "fused_scores");
  additive->eval();
  EXPECT_EQ(additive->explain_path(q, k, v, lens).path, "fused_projections");
  EXPECT_THAT(error_message([&] {
                additive->explain_path(torch::randn({2, 3, 5}), k, v);
              }),
              HasSubstr("d2l::AdditiveAttention: queries must have query_size=4 features"));
}

TEST(ExplainPath, PrintsOneLine) {
  d2l::PathExplanation explanation{"d2l::dot_product_attention",
                                   AttentionBackend::kAuto,
                                   "fused_softmax",
                                   {"flash: dropout 0.1 in training (no dropout in the kernel)"}};
  EXPECT_EQ(explanation.to_string(),
            "d2l::dot_product_attention (backend auto): fused_softmax; flash: dropout 0.1 in "
            "training (no dropout in the kernel)");
}

}  // namespace
