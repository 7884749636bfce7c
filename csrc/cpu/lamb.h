#pragma once
// LAMB: the kernel arguments passed from the glue (lamb.cpp) to the per-ISA kernels (lamb_kernel.cpp).
#include "common/lamb.h"
#include "cpu/types.h"

namespace inductor_lamb::cpu {

// Per-tensor scalars, hoisted out of the element loops.
struct LambCoeffs {
  float inv_bc1;    // 1 / (1 - beta1^t), or 1
  float inv_bc2;    // 1 / (1 - beta2^t), or 1
  float step_size;  // lr * trust ratio (pass 2)
};

struct LambArgs {
  const TensorPtrs* tensors;  // state: m, v (float32)
  const LambCoeffs* coeffs;
  ChunkSpan chunks;
  lamb::Consts consts;
  float grad_mul;     // 1 / (grad_scale * clip)
  float keep;         // the param's factor before the update (lamb::keep; 1 without decoupled decay)
  double* partials;   // pass 1: [chunk][||p||^2, ||u||^2]
  UpdateStash stash;  // one-call step: pass 1 leaves u here, pass 2 reads it back
};

struct LambKernels {
  void (*pass1)(const LambArgs&);  // m, v update; partial ||p||^2, ||u||^2
  void (*pass2)(const LambArgs&);  // p = keep p - step_size * u (u recomputed from the new m, v)
};

}  // namespace inductor_lamb::cpu
