#pragma once
// NovoGrad: the kernel arguments passed from the glue (novograd.cpp) to the per-ISA kernels
// (novograd_kernel.cpp).
#include "common/novograd.h"
#include "cpu/types.h"

namespace inductor_lamb::cpu {

struct NovogradCoeffs {
  float grad_mul;  // novograd::grad_mul: 1 / (grad_scale (sqrt(v) + eps))
};

struct NovogradArgs {
  const TensorPtrs* tensors;  // state: exp_avg (float32)
  const NovogradCoeffs* coeffs;
  ChunkSpan chunks;
  const novograd::Hyper* hyper;
  float lr;
  float keep;  // novograd::keep
};

struct NovogradKernels {
  void (*update)(const NovogradArgs&);  // m = beta1 m + u; p = keep p - lr m
};

}  // namespace inductor_lamb::cpu
