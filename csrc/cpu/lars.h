#pragma once
// LARS: data shared by the glue (lars.cpp) and the per-ISA kernels (lars_kernel.cpp).
#include "cpu/types.h"

namespace inductor_lamb::cpu {

struct LarsTensor {
  void* param;
  const void* grad;
  float* momentum_buffer;
  float* master;  // or null
  Dtype dtype;
};

struct LarsCoeffs {
  float local_lr;      // lr * lars_coeff * ||p|| / (||g|| + wd ||p|| + eps), or lr
  float weight_decay;  // this tensor's decay
};

struct LarsArgs {
  const LarsTensor* tensors;
  const LarsCoeffs* coeffs;
  ChunkSpan chunks;
  float momentum;
  float grad_mul;  // rescale_grad / grad_scale
};

struct LarsKernels {
  void (*update)(const LarsArgs&);  // v = mu v + local_lr (g + wd p); p -= v
};

}  // namespace inductor_lamb::cpu
