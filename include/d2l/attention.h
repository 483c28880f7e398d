#pragma once

// Umbrella header of d2l_attention, the attention core; the plots and
// heatmaps are in d2l::viz (<d2l/viz.h>).
#include <d2l/additive_attention.h>
#include <d2l/attention_mask.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/encoder_decoder.h>
#include <d2l/generate.h>
#include <d2l/masked_softmax.h>
#include <d2l/multi_head_attention.h>
#include <d2l/nadaraya_watson.h>
#include <d2l/nmt_data.h>
#include <d2l/scaled_dot_product_attention.h>
#include <d2l/seq2seq.h>
#include <d2l/sequence_mask.h>
#include <d2l/state_dict.h>
#include <d2l/torch_version.h>
#include <d2l/transformer.h>
#include <d2l/version.h>
