#pragma once
// LAMB: data shared by the glue (lamb.cpp) and the per-ISA kernels (lamb_kernel.cpp).
#include "cpu/types.h"

namespace inductor_lamb::cpu {

struct LambTensor {
  void* param;        // Dtype `dtype`
  const void* grad;   // Dtype `dtype`, read only
  float* exp_avg;
  float* exp_avg_sq;
  float* master;      // float32 master copy of param, or null
  Dtype dtype;
};

// Per-tensor scalars, hoisted out of the element loops.
struct LambCoeffs {
  float inv_bc1;    // 1 / (1 - beta1^t), or 1
  float inv_bc2;    // 1 / (1 - beta2^t), or 1
  float step_size;  // lr * trust ratio (pass 2)
};

struct LambArgs {
  const LambTensor* tensors;
  const LambCoeffs* coeffs;
  ChunkSpan chunks;
  float beta1, beta2, beta3, eps, weight_decay;
  float grad_mul;     // 1 / (grad_scale * clip)
  double* partials;   // pass 1: [chunk][||p||^2, ||u||^2]
};

struct LambKernels {
  void (*pass1)(const LambArgs&);  // m, v update; partial ||p||^2, ||u||^2
  void (*pass2)(const LambArgs&);  // p -= step_size * u (u recomputed from the new m, v)
};

}  // namespace inductor_lamb::cpu
