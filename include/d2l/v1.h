#pragma once

// Umbrella header of d2l 1.0's names (namespace d2l::v1), in the library
// d2l::attention; d2l:: itself stays the 0.17 edition.
#include <d2l/v1/nadaraya_watson.h>
