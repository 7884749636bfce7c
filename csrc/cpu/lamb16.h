#pragma once
// LAMB16 (LAMB with float8 moments): the kernel arguments passed from the glue
// (lamb16.cpp) to the per-ISA kernels (lamb16_kernel.cpp).
#include "common/lamb16.h"
#include "cpu/types.h"

namespace inductor_lamb::cpu {

// Per-tensor scalars, hoisted out of the element loops.
struct Lamb16Coeffs {
  float beta1_scale;    // beta1 * old m scale: m = beta1_scale * fp32(m8) + (1 - beta1) g
  float beta2_scale;    // beta2 * old v scale
  float inv_m_scale;    // 1 / new m scale (pass 2)
  float inv_v_scale;    // 1 / new v scale (pass 2)
  float step_size;      // lr * trust ratio (pass 2)
  uint32_t round_key;   // rounding::tensor_key(seed, step) (pass 2, stochastic rounding)
  bool finite;          // amax v finite and lamb16::eps_allows_finite: pass 2's u unchecked (pass 2)
};

struct Lamb16Args {
  const TensorPtrs* tensors;  // state: m8 (float8_e4m3fn), v8 (float8_e5m2)
  const Lamb16Coeffs* coeffs;
  ChunkSpan chunks;
  lamb16::Consts consts;
  float grad_mul;       // 1 / grad_scale
  bool stochastic_rounding;  // pass 2 rounds m, v stochastically (else to nearest even)
  double* sums;         // pass 1: [chunk][||p||^2, ||u||^2]
  double* maxes;        // pass 1: [chunk][max |m|, max v]
  UpdateStash stash;    // one-call step: pass 1 leaves u, m, v here (three planes), pass 2 reads them back
};

struct Lamb16Kernels {
  void (*pass1)(const Lamb16Args&);  // m, v in float32; partial ||p||^2, ||u||^2, amax m, v
  void (*pass2)(const Lamb16Args&);  // p -= step_size * u (u from the stash, or recomputed); m8, v8 stored
};

}  // namespace inductor_lamb::cpu
