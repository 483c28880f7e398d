#pragma once

// The Transformer of the golden fixtures (tests/fixtures/generate_fixtures_transformer.py),
// built from a fixture's scalars with its parameters loaded by state_dict key.

#include <d2l/transformer.h>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "fixture.h"
#include "test_utils.h"

namespace d2l::testing {

inline std::shared_ptr<d2l::TransformerEncoderImpl> encoder_of(const d2l::EncoderDecoder& m) {
  return std::dynamic_pointer_cast<d2l::TransformerEncoderImpl>(m->encoder);
}

inline std::shared_ptr<d2l::TransformerDecoderImpl> decoder_of(const d2l::EncoderDecoder& m) {
  return std::dynamic_pointer_cast<d2l::TransformerDecoderImpl>(m->decoder);
}

inline d2l::TransformerOptions transformer_options(const Fixture& f) {
  const auto h = static_cast<int64_t>(f.scalar("num_hiddens"));
  return d2l::TransformerOptions(
      static_cast<int64_t>(f.scalar("vocab_size")),
      d2l::TransformerBlockOptions(h, h, h, h, {h}, h,
                                   static_cast<int64_t>(f.scalar("ffn_num_hiddens")),
                                   static_cast<int64_t>(f.scalar("num_heads")))
          .dropout(f.scalar("dropout"))
          .use_bias(f.scalar("use_bias") != 0),
      static_cast<int64_t>(f.scalar("num_layers")));
}

/// The fixture's model, its parameters loaded, in the fixture's dtype and mode.
inline d2l::EncoderDecoder transformer_from_fixture(const Fixture& f, torch::Dtype dtype) {
  const auto o = transformer_options(f);
  auto decoder_options = o;
  decoder_options.block().use_bias(false);  // the book's DecoderBlock has no use_bias
  d2l::EncoderDecoder model{d2l::TransformerEncoder(o), d2l::TransformerDecoder(decoder_options)};
  model->to(dtype);
  std::set<std::string> in_fixture;
  for (const auto& name : f.tensor_names()) {
    if (name.rfind("encoder.", 0) == 0 || name.rfind("decoder.", 0) == 0) in_fixture.insert(name);
  }
  EXPECT_EQ(parameter_name_set(*model), in_fixture) << f.path();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) p.value().copy_(f.tensor(p.key()));
  }
  // The book's positional table as the book's code computed it: LibTorch's
  // float32 sin, cos and pow may differ from Python's by an ulp, which a
  // float64 model would carry into every output (the table itself is checked
  // against the fixture in Transformer.PositionalTableIsTheBooks).
  const auto table = load_fixture("positional_encoding_float32")
                         .tensor(fmt::format("P.{}", static_cast<int64_t>(f.scalar("num_hiddens"))));
  for (auto* pe : {&encoder_of(model)->pos_encoding, &decoder_of(model)->pos_encoding}) {
    (*pe)->P.narrow(1, 0, table.size(0)).copy_(table.unsqueeze(0));
  }
  model->train(f.scalar("training") != 0);
  return model;
}

}  // namespace d2l::testing
