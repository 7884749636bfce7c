#pragma once
// LARS: the kernel arguments passed from the glue (lars.cpp) to the per-ISA kernels (lars_kernel.cpp).
#include "common/lars.h"
#include "cpu/types.h"

namespace inductor_lamb::cpu {

struct LarsCoeffs {
  float local_lr;      // lars::local_lr
  float weight_decay;  // this tensor's decay
};

struct LarsArgs {
  const TensorPtrs* tensors;  // state: momentum buffer (float32)
  const LarsCoeffs* coeffs;
  ChunkSpan chunks;
  float momentum;
  float grad_mul;   // rescale_grad / grad_scale
  float step_size;  // lars::step_size
};

struct LarsKernels {
  void (*update)(const LarsArgs&);  // v = mu v + local_lr (g + wd p); p -= step_size v
};

}  // namespace inductor_lamb::cpu
