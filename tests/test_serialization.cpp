// Saving and loading the modules, when the archive fits: every module round
// trips through torch::save/torch::load (a stream or a file) with the same
// tensors and outputs, also as a submodule of a user's module. The checks
// that reject an archive are in test_serialization_errors.cpp.

#include <d2l/attention.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>

#include "serialization_helpers.h"
#include "test_utils.h"

namespace {

using d2l::testing::archive_bytes;
using d2l::testing::identical;
using d2l::testing::load_bytes;
using d2l::testing::make_encoder_decoder;
using d2l::testing::snapshot;

const d2l::Seq2SeqOptions kSeq2Seq(10, 8, 16, 2);

torch::Tensor tokens() { return torch::tensor({{1, 2, 3, 4}, {5, 6, 7, 0}}); }

// Builds `a` (seed 1) and `b` (seed 2) with the same options, loads `a`'s
// archive into `b` and compares their tensors and their outputs by `run`.
template <typename Holder>
void expect_round_trip(const std::function<Holder()>& make,
                       const std::function<torch::Tensor(Holder&)>& run) {
  torch::manual_seed(1);
  auto a = make();
  torch::manual_seed(2);
  auto b = make();
  a->eval();
  b->eval();
  const auto before = snapshot(*b);
  const bool has_tensors = !before.empty();
  if (has_tensors) ASSERT_FALSE(identical(snapshot(*a), before)) << "nothing to load";
  load_bytes(b, archive_bytes(a));
  EXPECT_TRUE(identical(snapshot(*a), snapshot(*b)));
  torch::manual_seed(3);
  const auto expected = run(a);
  torch::manual_seed(3);
  EXPECT_TRUE(torch::equal(run(b), expected));
}

TEST(Serialization, AdditiveAttentionRoundTrips) {
  expect_round_trip<d2l::AdditiveAttention>(
      [] { return d2l::AdditiveAttention(2, 20, 8, 0.1); },
      [](auto& m) {
        return m(torch::randn({2, 1, 20}), torch::randn({2, 10, 2}), torch::randn({2, 10, 4}),
                 torch::tensor({2, 6}));
      });
}

// DotProductAttention has no tensors: its archive holds none, and loading it
// leaves the module as it was, its options included (LibTorch archives no
// options): the book's formula in eval mode, its own dropout in training.
TEST(Serialization, DotProductAttentionArchiveHoldsNoStateAndChangesNothing) {
  d2l::DotProductAttention saved(0.5), loaded(1.0);
  EXPECT_TRUE(snapshot(*saved).empty());
  const auto* dropout_before = loaded->dropout.get();
  load_bytes(loaded, archive_bytes(saved));
  EXPECT_EQ(loaded->dropout.get(), dropout_before);
  EXPECT_DOUBLE_EQ(loaded->dropout->options.p(), 1.0);
  torch::manual_seed(3);
  const auto q = torch::randn({2, 3, 2}, torch::kDouble),
             k = torch::randn({2, 10, 2}, torch::kDouble),
             v = torch::randn({2, 10, 4}, torch::kDouble);
  const auto lens = torch::tensor({2, 6});
  const auto weights = d2l::testing::reference_masked_softmax(
      torch::bmm(q, k.transpose(1, 2)) / std::sqrt(2.0), lens);
  loaded->eval();
  EXPECT_LT(d2l::testing::max_rel_error(loaded(q, k, v, lens), torch::bmm(weights, v)), 1e-12);
  loaded->train();
  EXPECT_EQ(loaded(q, k, v, lens).abs().sum().item<double>(), 0.0);
}

TEST(Serialization, MultiHeadAttentionRoundTrips) {
  for (const bool bias : {false, true}) {
    SCOPED_TRACE(bias);
    expect_round_trip<d2l::MultiHeadAttention>(
        [bias] { return d2l::MultiHeadAttention(5, 3, 4, 8, 2, 0.1, bias); },
        [](auto& m) {
          return m(torch::randn({2, 4, 3}), torch::randn({2, 6, 5}), torch::randn({2, 6, 4}),
                   torch::tensor({3, 2}));
        });
  }
}

TEST(Serialization, NWKernelRegressionRoundTrips) {
  expect_round_trip<d2l::NWKernelRegression>(
      [] { return d2l::NWKernelRegression(); },
      [](auto& m) {
        return m(torch::randn({5}), torch::randn({5, 4}), torch::randn({5, 4}));
      });
}

TEST(Serialization, Seq2SeqEncoderRoundTrips) {
  expect_round_trip<d2l::Seq2SeqEncoder>([] { return d2l::Seq2SeqEncoder(kSeq2Seq); },
                                         [](auto& m) {
                                           const auto out = m(tokens());
                                           return torch::cat({out.outputs, out.hidden_state});
                                         });
}

TEST(Serialization, Seq2SeqDecodersRoundTrip) {
  torch::manual_seed(4);
  d2l::Seq2SeqEncoder encoder(kSeq2Seq);
  const auto enc_outputs = encoder(tokens());
  expect_round_trip<d2l::Seq2SeqDecoder>(
      [] { return d2l::Seq2SeqDecoder(kSeq2Seq); },
      [&](auto& m) { return std::get<0>(m(tokens(), m->init_state(enc_outputs))); });
  expect_round_trip<d2l::Seq2SeqAttentionDecoder>(
      [] { return d2l::Seq2SeqAttentionDecoder(kSeq2Seq); },
      [&](auto& m) {
        const auto lens = torch::tensor({4, 2});
        return std::get<0>(m(tokens(), m->init_state(enc_outputs, lens)));
      });
}

TEST(Serialization, EncoderDecoderRoundTrips) {
  for (const bool attention : {false, true}) {
    SCOPED_TRACE(attention);
    expect_round_trip<d2l::EncoderDecoder>(
        [attention] { return make_encoder_decoder(attention, kSeq2Seq); },
        [](auto& m) {
          return std::get<0>(m(tokens(), tokens(), torch::tensor({4, 3})));
        });
  }
}

// Module::load assigns the archive's values to the module's own tensors, so
// anything holding them (an optimizer) sees the loaded values.
TEST(Serialization, LoadingKeepsTheModulesTensors) {
  torch::manual_seed(1);
  d2l::MultiHeadAttention saved(5, 3, 4, 8, 2, 0.0, true);
  d2l::MultiHeadAttention loaded(5, 3, 4, 8, 2, 0.0, true);
  const auto weight = loaded->W_q->weight;
  torch::optim::SGD sgd(loaded->parameters(), 0.1);
  load_bytes(loaded, archive_bytes(saved));
  EXPECT_TRUE(weight.is_same(loaded->W_q->weight));
  EXPECT_TRUE(torch::equal(weight, saved->W_q->weight));
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_TRUE(sgd.param_groups()[0].params()[0].is_same(loaded->W_q->weight));
}

TEST(Serialization, RoundTripsThroughAFile) {
  const auto path = std::filesystem::path(::testing::TempDir()) /
                    ("d2l_serialization_" + std::to_string(::getpid()) + ".pt");
  torch::manual_seed(1);
  auto saved = make_encoder_decoder(true, kSeq2Seq);
  torch::manual_seed(2);
  auto loaded = make_encoder_decoder(true, kSeq2Seq);
  torch::save(saved, path.string());
  torch::load(loaded, path.string());
  std::filesystem::remove(path);
  EXPECT_TRUE(identical(snapshot(*saved), snapshot(*loaded)));
}

TEST(Serialization, RoundTripsInDouble) {
  torch::manual_seed(1);
  d2l::AdditiveAttention saved(2, 3, 4, 0.0);
  saved->to(torch::kDouble);
  d2l::AdditiveAttention loaded(2, 3, 4, 0.0);
  loaded->to(torch::kDouble);
  load_bytes(loaded, archive_bytes(saved));
  EXPECT_TRUE(identical(snapshot(*saved), snapshot(*loaded)));
}

// A user's module holding ours: its Module::load reaches ours through the
// virtual load, so the check applies there too.
struct UserModelImpl : torch::nn::Module {
  UserModelImpl(int64_t num_hiddens, int64_t num_layers)
      : attention(register_module("attention",
                                  d2l::MultiHeadAttention(4, 4, 4, num_hiddens, 2, 0.0, true))),
        encoder(register_module("encoder", d2l::Seq2SeqEncoder(10, 4, 6, num_layers))),
        head(register_module("head", torch::nn::Linear(num_hiddens, 1))) {}
  d2l::MultiHeadAttention attention;
  d2l::Seq2SeqEncoder encoder;
  torch::nn::Linear head;
};
TORCH_MODULE(UserModel);

TEST(Serialization, RoundTripsAsASubmoduleOfAUsersModule) {
  torch::manual_seed(1);
  UserModel saved(8, 2);
  torch::manual_seed(2);
  UserModel loaded(8, 2);
  ASSERT_FALSE(identical(snapshot(*saved), snapshot(*loaded)));
  load_bytes(loaded, archive_bytes(saved));
  EXPECT_TRUE(identical(snapshot(*saved), snapshot(*loaded)));
}

TEST(Serialization, ChecksWhenASubmoduleOfAUsersModule) {
  UserModel saved(8, 2), loaded(12, 2);
  const auto attention_before = snapshot(*loaded->attention);
  EXPECT_THAT(d2l::testing::error_message([&] { load_bytes(loaded, archive_bytes(saved)); }),
              ::testing::AllOf(::testing::HasSubstr("d2l::MultiHeadAttention::load"),
                               ::testing::HasSubstr("W_q.weight"), ::testing::HasSubstr("[8, 4]"),
                               ::testing::HasSubstr("[12, 4]")));
  EXPECT_TRUE(identical(snapshot(*loaded->attention), attention_before));

  UserModel one_layer(8, 1);
  const auto encoder_before = snapshot(*one_layer->encoder);
  EXPECT_THAT(d2l::testing::error_message([&] { load_bytes(one_layer, archive_bytes(saved)); }),
              ::testing::AllOf(::testing::HasSubstr("d2l::Seq2SeqEncoder::load"),
                               ::testing::HasSubstr("rnn.weight_ih_l1")));
  EXPECT_TRUE(identical(snapshot(*one_layer->encoder), encoder_before));
}

}  // namespace
