#pragma once
// Adagrad: the kernel arguments passed from the glue (adagrad.cpp) to the per-ISA kernels (adagrad_kernel.cpp).
#include "common/adagrad.h"
#include "cpu/types.h"

namespace inductor_lamb::cpu {

struct AdagradArgs {
  const TensorPtrs* tensors;  // state: sum (float32)
  const float* clr;           // per tensor: adagrad::clr
  ChunkSpan chunks;
  adagrad::Hyper hyper;
  float grad_mul;  // adagrad::grad_mul
};

struct AdagradKernels {
  void (*update)(const AdagradArgs&);  // g += wd p; s += g^2; p -= clr g / (sqrt(s) + eps)
};

}  // namespace inductor_lamb::cpu
