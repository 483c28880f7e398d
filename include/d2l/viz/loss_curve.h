#pragma once

// Part of d2l::viz (link d2l::viz): the book's training animator as a
// train_seq2seq callback.

#include <d2l/train.h>

#include <cstdint>
#include <string>

namespace d2l {

/// An `on_epoch` callback for `train_seq2seq` that draws the book's animator
/// curve: the epoch's loss at every `every`-th epoch and at the last one,
/// against the epoch ("epoch", "loss"), rewritten to `svg_path` at every new
/// point. A run that starts again from an earlier epoch starts a new curve.
/// Throws c10::Error from the callback if the file cannot be written, and
/// for an empty `svg_path` or `every` < 1 at once.
EpochCallback save_loss_curve(std::string svg_path, int64_t every = 10);

}  // namespace d2l
