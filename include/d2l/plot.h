#pragma once
// Deprecated location, kept for one release: include <d2l/viz/plot.h> and link d2l::viz.
#include <d2l/viz/plot.h>
