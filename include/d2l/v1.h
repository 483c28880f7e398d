#pragma once

// d2l 1.0 (the English book at d2l.ai): its classes with its constructors, in
// namespace d2l::v1 beside the 0.17 edition's in d2l (docs/editions.md).

#include <d2l/lazy.h>
#include <d2l/v1/attention.h>
#include <d2l/v1/encoder_decoder.h>
#include <d2l/v1/seq2seq.h>
#include <d2l/v1/transformer.h>
#include <d2l/v1/nadaraya_watson.h>
#include <d2l/v1/vit.h>
#include <d2l/v1/fashion_mnist.h>
