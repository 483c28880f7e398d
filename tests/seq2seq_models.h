#pragma once

// The sequence-to-sequence set-up shared by test_seq2seq.cpp,
// test_seq2seq_attention.cpp and test_encoder_decoder.cpp: the sizes of the
// book's examples and the book's EncoderDecoder with the plain or the
// attention decoder.

#include <d2l/seq2seq.h>

#include <cstdint>

namespace d2l::testing {

inline constexpr int64_t kVocab = 10, kEmbed = 8, kHiddens = 16, kLayers = 2;

inline d2l::EncoderDecoder make_model(bool attention, const d2l::Seq2SeqOptions& o) {
  d2l::Seq2SeqEncoder encoder(o);
  if (attention) return d2l::EncoderDecoder(encoder, d2l::Seq2SeqAttentionDecoder(o));
  return d2l::EncoderDecoder(encoder, d2l::Seq2SeqDecoder(o));
}

}  // namespace d2l::testing
