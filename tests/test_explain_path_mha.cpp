// explain_path for multi-head attention: "small_heads" (Note [Small heads])
// or the per-head dot-product attention's path, row by row (backend, dtype,
// head size, dropout in training, masks, empty sizes → path and reasons), and
// that the path explained is the path the call runs, read from the autograd
// graph it records.

#include <d2l/attention_mask.h>
#include <d2l/backend.h>
#include <d2l/multi_head_attention.h>
#include <d2l/torch_version.h>

#include <string>
#include <vector>

#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::AttentionMask;
using d2l::testing::error_message;
using d2l::testing::graph_nodes;
using d2l::testing::has_node;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const char* kWide =
    "small_heads: heads of 40 queries x 40 keys x 32 features (the kernels take "
    "up to 64 x 64 pairs with at most 16 features, 32 x 32 with more)";
const char* kDropout = "flash: dropout 0.1 in training (no dropout in the kernel)";

struct Row {
  const char* what;
  AttentionBackend backend;
  int64_t n, h;  // n queries = m keys, h hidden units over 2 heads
  torch::Dtype dtype;
  bool training;
  const char* path;
  std::vector<std::string> reasons;
};

// The path explained, and the autograd node that path records.
void expect_row(const Row& row) {
  torch::manual_seed(1);
  d2l::MultiHeadAttention attention(d2l::MultiHeadAttentionOptions(row.h, row.h, row.h, row.h, 2)
                                        .dropout(0.1)
                                        .backend(row.backend));
  attention->to(row.dtype);
  attention->train(row.training);
  const auto x = torch::randn({3, row.n, row.h}, row.dtype).requires_grad_();
  const auto lens = torch::tensor({row.n, 2L, 1L});
  const auto why = attention->explain_path(x, x, x, lens);
  EXPECT_EQ(why.op, "d2l::MultiHeadAttention") << row.what;
  EXPECT_EQ(why.backend, row.backend) << row.what;
  EXPECT_EQ(why.path, row.path) << row.what;
  // bfloat16 heads on the flash kernel also say why its bfloat16 kernel does
  // not take them (10 queries, weights recorded).
  auto reasons = why.reasons;
  if (row.dtype == torch::kBFloat16 && why.path == "flash" && !reasons.empty()) {
    EXPECT_THAT(reasons.back(), ::testing::StartsWith("flash_bf16: ")) << row.what;
    reasons.pop_back();
  }
  EXPECT_EQ(reasons, row.reasons) << row.what;
  const auto nodes = graph_nodes(attention(x, x, x, lens));
  EXPECT_EQ(has_node(nodes, "MultiHeadAttentionFunction"), why.path == "small_heads") << row.what;
  EXPECT_EQ(has_node(nodes, "FlashAttentionFunction"), why.path == "flash") << row.what;
  EXPECT_EQ(has_node(nodes, "MaskedSoftmaxFunction"), why.path == "fused_softmax") << row.what;
}

TEST(ExplainPathMultiHead, DecisionTableOnTheCpu) {
  const std::string composite = "AttentionBackend::kComposite asks for the book's ops";
  std::vector<Row> rows;
  for (auto backend : {AttentionBackend::kAuto, AttentionBackend::kFused}) {
    rows.push_back({"small", backend, 10, 32, torch::kFloat, false, "small_heads", {}});
    rows.push_back({"small, dropout", backend, 10, 32, torch::kFloat, true, "small_heads", {}});
    rows.push_back({"small, double", backend, 10, 32, torch::kDouble, true, "small_heads", {}});
    rows.push_back({"d 16 at 64 x 64", backend, 64, 32, torch::kFloat, false, "small_heads", {}});
    rows.push_back({"wide", backend, 40, 64, torch::kFloat, false, "flash", {kWide}});
    rows.push_back({"wide, dropout",
                    backend,
                    40,
                    64,
                    torch::kFloat,
                    true,
                    "fused_softmax",
                    {kWide, kDropout}});
    rows.push_back(
        {"bfloat16", backend, 10, 32, torch::kBFloat16, false, "small_heads", {}});
  }
  rows.push_back({"composite",
                  AttentionBackend::kComposite,
                  10,
                  32,
                  torch::kFloat,
                  false,
                  "composite",
                  {"small_heads: " + composite, "flash: " + composite, "sdpa: " + composite,
                   "fused_softmax: " + composite}});
  for (const auto& row : rows) expect_row(row);
}

TEST(ExplainPathMultiHead, MasksSizesAndTheFunctionalForm) {
  torch::manual_seed(2);
  d2l::MultiHeadAttention attention(8, 8, 8, 8, 2, 0.0);
  attention->eval();
  const auto x = torch::randn({2, 5, 8});
  EXPECT_EQ(attention->explain_path(x, x, x, AttentionMask().is_causal(true)).path, "small_heads");
  auto holes = torch::zeros({2, 5}, torch::kBool);
  holes.index_put_({0, 1}, true);
  const auto general = attention->explain_path(x, x, x, AttentionMask().key_padding_mask(holes));
  EXPECT_EQ(general.path, "composite");
  ASSERT_FALSE(general.reasons.empty());
  EXPECT_THAT(general.reasons[0], HasSubstr("small_heads: key_padding_mask"));
  EXPECT_THAT(general.reasons[0], HasSubstr("(the kernels mask by lengths)"));
  const auto empty = torch::randn({0, 5, 8});
  const auto none = attention->explain_path(empty, empty, empty);
  ASSERT_FALSE(none.reasons.empty());
  EXPECT_EQ(none.reasons[0], "small_heads: a size is zero");
  EXPECT_EQ(none.path, "fused_softmax");

  // The functional form names itself, and explains what it would run.
  namespace F = d2l::functional;
  const auto o = F::MultiHeadAttentionFuncOptions(2, attention->W_q->weight, attention->W_k->weight,
                                                  attention->W_v->weight, attention->W_o->weight);
  const auto functional = d2l::explain_path(x, x, x, o);
  EXPECT_EQ(functional.op, "d2l::multi_head_attention");
  EXPECT_EQ(functional.path, "small_heads");
  EXPECT_EQ(functional.to_string(), "d2l::multi_head_attention (backend auto): small_heads");
}

// explain_path checks what the call checks, with the same message.
TEST(ExplainPathMultiHead, ErrorsAreTheCallsErrors) {
  d2l::MultiHeadAttention attention(8, 8, 8, 8, 2, 0.0);
  const auto x = torch::randn({2, 5, 8});
  const auto bad_lens = torch::tensor({1, 2, 3});
  const auto explained = error_message([&] { attention->explain_path(x, x, x, bad_lens); });
  EXPECT_THAT(explained, HasSubstr("d2l::MultiHeadAttention: valid_lens"));
  EXPECT_EQ(explained, error_message([&] { attention(x, x, x, bad_lens); }));
  d2l::MultiHeadAttention sdpa(d2l::MultiHeadAttentionOptions(8, 8, 8, 8, 2)
                                   .backend(AttentionBackend::kSdpa)
                                   .record_attention_weights(false));
  if (D2L_HAS_SDPA) {
    const auto why = sdpa->explain_path(x, x, x);
    EXPECT_EQ(why.path, "sdpa");
    EXPECT_THAT(why.reasons,
                ElementsAre("small_heads: AttentionBackend::kSdpa asks for SDPA per head"));
  } else {
    EXPECT_THAT(error_message([&] { sdpa->explain_path(x, x, x); }),
                HasSubstr("AttentionBackend::kSdpa needs LibTorch 2.1"));
  }
}

}  // namespace
