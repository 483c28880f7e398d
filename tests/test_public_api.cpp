// Public API that no other test reached: the version macros, Vocab's default
// constructor and unk(), and EncoderDecoder::clone(device).

#include <d2l/attention.h>
#include <d2l/nmt_data.h>
#include <d2l/version.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "seq2seq_models.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using ::testing::HasSubstr;

// The header's numbers, its string and CMake's project(VERSION) agree.
TEST(PublicApi, VersionMacrosAgree) {
  EXPECT_EQ(std::string(D2L_ATTENTION_VERSION),
            fmt::format("{}.{}.{}", D2L_ATTENTION_VERSION_MAJOR, D2L_ATTENTION_VERSION_MINOR,
                        D2L_ATTENTION_VERSION_PATCH));
  EXPECT_EQ(std::string(D2L_ATTENTION_VERSION), std::string(D2L_PROJECT_VERSION));
}

TEST(PublicApi, DefaultVocabHoldsOnlyUnk) {
  const d2l::Vocab vocab;
  EXPECT_EQ(d2l::Vocab::unk(), 0);
  EXPECT_EQ(vocab.size(), 1);
  EXPECT_EQ(vocab.to_tokens(d2l::Vocab::unk()), "<unk>");
  EXPECT_EQ(vocab["anything"], d2l::Vocab::unk());
  EXPECT_EQ((vocab[std::vector<std::string>{"a", "<unk>"}]), (std::vector<int64_t>{0, 0}));
  EXPECT_TRUE(vocab.token_freqs().empty());
  EXPECT_THAT(error_message([&] { vocab.to_tokens(1); }), HasSubstr("1"));
  // unk() is the index of <unk> in every vocabulary, reserved tokens or not.
  const d2l::Vocab built({{"b", "a", "b"}}, 0, {"<pad>"});
  EXPECT_EQ(built["<unk>"], d2l::Vocab::unk());
  EXPECT_EQ(built["never seen"], d2l::Vocab::unk());
  EXPECT_EQ(built["b"], 2);
}

// clone(device) copies deeply onto the device asked for (the CPU here; CUDA
// where there is one), keeping the class, the mode and the numbers.
TEST(PublicApi, EncoderDecoderCloneOntoADevice) {
  torch::manual_seed(9);
  auto model = d2l::testing::make_model(true, d2l::Seq2SeqOptions(10, 8, 16, 2));
  model->eval();
  const auto enc_X = torch::randint(0, 10, {2, 5}), dec_X = torch::randint(0, 10, {2, 4});
  const auto lens = torch::tensor({5, 2});
  const auto expected = std::get<0>(model(enc_X, dec_X, lens));
  std::vector<torch::Device> devices = {torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA, 0);
  for (const auto& device : devices) {
    auto copy = std::dynamic_pointer_cast<d2l::EncoderDecoderImpl>(model->clone(device));
    ASSERT_TRUE(copy) << device;
    ASSERT_TRUE(std::dynamic_pointer_cast<d2l::Seq2SeqAttentionDecoderImpl>(copy->decoder));
    EXPECT_FALSE(copy->is_training());
    const auto params = model->named_parameters();
    for (const auto& p : copy->named_parameters()) {
      EXPECT_EQ(p.value().device(), device) << p.key();
      EXPECT_NE(p.value().data_ptr(), params[p.key()].data_ptr()) << p.key();
      EXPECT_TRUE(torch::equal(p.value().cpu(), params[p.key()])) << p.key();
    }
    torch::NoGradGuard no_grad;
    const auto out =
        std::get<0>(copy->forward(enc_X.to(device), dec_X.to(device), lens.to(device)));
    // cuDNN's GRU may multiply float32 in TF32 (4.8e-5 on an H200).
    EXPECT_LT(d2l::testing::max_rel_error(out.cpu(), expected), device.is_cuda() ? 1e-3 : 1e-5)
        << device;
    copy->named_parameters()["decoder.dense.bias"].add_(1);
    EXPECT_TRUE(torch::equal(std::get<0>(model(enc_X, dec_X, lens)), expected)) << device;
  }
}

}  // namespace
