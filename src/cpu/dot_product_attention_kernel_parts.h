#pragma once

// The passes that each instruction set's copies of
// dot_product_attention_forward_kernel.cpp and
// dot_product_attention_backward_kernel.cpp define, in namespace
// d2l::cpu::<ISA>, for the table in dot_product_attention_kernel.cpp (as
// DotProductAttentionKernels documents them). Included only from those
// per-instruction-set files: the namespace is CPU_CAPABILITY's.

#include <ATen/core/TensorBase.h>

namespace d2l::cpu {
namespace CPU_CAPABILITY {

void dot_product_attention_forward(const at::TensorBase& q, const at::TensorBase& k,
                                   const at::TensorBase& v, const at::TensorBase& lens,
                                   double scale, const at::TensorBase& out,
                                   const at::TensorBase& lse, const at::TensorBase& weights);

void dot_product_attention_forward_bf16(const at::TensorBase& q, const at::TensorBase& k,
                                        const at::TensorBase& v, const at::TensorBase& lens,
                                        double scale, const at::TensorBase& out,
                                        const at::TensorBase& lse);

void dot_product_attention_backward(const at::TensorBase& q, const at::TensorBase& k,
                                    const at::TensorBase& v, const at::TensorBase& lens,
                                    double scale, const at::TensorBase& out,
                                    const at::TensorBase& dout, const at::TensorBase& lse,
                                    const at::TensorBase& dq, const at::TensorBase& dk,
                                    const at::TensorBase& dv);

void dot_product_attention_backward_bf16(const at::TensorBase& q, const at::TensorBase& k,
                                         const at::TensorBase& v, const at::TensorBase& lens,
                                         double scale, const at::TensorBase& out,
                                         const at::TensorBase& dout, const at::TensorBase& lse,
                                         const at::TensorBase& dq, const at::TensorBase& dk,
                                         const at::TensorBase& dv);

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
