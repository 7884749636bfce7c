#pragma once
// Adagrad: data shared by the glue (adagrad.cpp) and the per-ISA kernels (adagrad_kernel.cpp).
#include "cpu/types.h"

namespace inductor_lamb::cpu {

struct AdagradTensor {
  void* param;
  const void* grad;
  float* state_sum;
  float* master;  // or null
  Dtype dtype;
};

struct AdagradArgs {
  const AdagradTensor* tensors;
  const float* clr;  // per tensor: lr / (1 + (t - 1) lr_decay)
  ChunkSpan chunks;
  float weight_decay, eps;
  float grad_mul;  // +-1 / grad_scale (negative with maximize)
};

struct AdagradKernels {
  void (*update)(const AdagradArgs&);  // g += wd p; s += g^2; p -= clr g / (sqrt(s) + eps)
};

}  // namespace inductor_lamb::cpu
