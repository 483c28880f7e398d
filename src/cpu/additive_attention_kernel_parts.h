#pragma once

// The kernels that each instruction set's copies of
// additive_attention_forward_kernel.cpp and
// additive_attention_backward_kernel.cpp define, in namespace
// d2l::cpu::<ISA>, for the table in additive_attention_kernel.cpp (as
// AdditiveAttentionKernels documents them). Included only from those
// per-instruction-set files: the namespace is CPU_CAPABILITY's.

#include <ATen/core/TensorBase.h>

namespace d2l::cpu {
namespace CPU_CAPABILITY {

void additive_attention_forward(const at::TensorBase& q, const at::TensorBase& k,
                                const at::TensorBase& w, const at::TensorBase& out,
                                const at::TensorBase& lens, bool softmax);

void additive_attention_backward(const at::TensorBase& q, const at::TensorBase& k,
                                 const at::TensorBase& w, const at::TensorBase& y,
                                 const at::TensorBase& dout, const at::TensorBase& dq,
                                 const at::TensorBase& dk, const at::TensorBase& dw,
                                 const at::TensorBase& lens, bool softmax);

void additive_attention_forward_values(const at::TensorBase& q, const at::TensorBase& k,
                                       const at::TensorBase& w, const at::TensorBase& v,
                                       const at::TensorBase& y, const at::TensorBase& o,
                                       const at::TensorBase& lens);

void additive_attention_backward_values(const at::TensorBase& q, const at::TensorBase& k,
                                        const at::TensorBase& w, const at::TensorBase& v,
                                        const at::TensorBase& y, const at::TensorBase& dout,
                                        const at::TensorBase& dy, const at::TensorBase& dq,
                                        const at::TensorBase& dk, const at::TensorBase& dw,
                                        const at::TensorBase& dv, const at::TensorBase& lens);

void additive_attention_tanh(const at::TensorBase& x, const at::TensorBase& y);

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
