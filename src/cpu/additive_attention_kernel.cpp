// The fused additive attention scores w_vᵀ tanh(q_i + k_j), optionally with
// the masked softmax folded in, forward and backward (recomputing tanh): the
// table of kernels. The forward kernels are in
// additive_attention_forward_kernel.cpp, the backward in
// additive_attention_backward_kernel.cpp, what both use in
// additive_blocks-inl.h. Each is compiled once per instruction set (Note [CPU
// kernels per instruction set]).

#include "cpu/additive_attention_kernel.h"
#include "cpu/additive_attention_kernel_parts.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {

const AdditiveAttentionKernels& additive_attention_kernels() {
  static const AdditiveAttentionKernels table{
      &additive_attention_forward, &additive_attention_backward, &additive_attention_forward_values,
      &additive_attention_backward_values, &additive_attention_tanh};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
