#pragma once

// Umbrella header of d2l::viz, the optional plotting library (D2L_BUILD_VIZ):
// the book's d2l.plot and show_heatmaps, and save_loss_curve, the training
// animator's curve (with d2l/train.h, which d2l::viz brings). Link d2l::viz to use it.
#include <d2l/viz/heatmap.h>
#include <d2l/viz/loss_curve.h>
#include <d2l/viz/plot.h>
