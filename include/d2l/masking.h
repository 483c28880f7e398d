#pragma once

// Before 0.2 the masking functions shared this header; it stays for one
// release. Include <d2l/sequence_mask.h> and <d2l/masked_softmax.h>.
#include <d2l/masked_softmax.h>
#include <d2l/sequence_mask.h>
