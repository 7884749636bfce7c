#pragma once
// The interface between the torch glue (ops_cuda.cpp, built with torch headers)
// and the CUDA kernels (*.cu, CUDA headers only): plain structs and extern "C"
// launchers. Everything a launch needs is in device memory or in these structs,
// so a step never reads a device value on the host (no sync, CUDA-graph capturable).
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/adagrad.h"
#include "common/lamb.h"
#include "common/lamb16.h"
#include "common/lars.h"
#include "common/novograd.h"

namespace inductor_lamb::cuda {

// Elements per block-sized chunk (the engines' shared chunk size), and threads per block.
constexpr int kChunk = static_cast<int>(kChunkElems);
constexpr int kThreads = 256;
// Per-chunk partial reductions (||p||^2, ||u||^2, amax m, amax v) and per-tensor coefficients.
constexpr int kPartials = 4;
constexpr int kCoeffs = 8;

// The variant of a tensor's chunk kernels: its param's dtype and whether it has a master copy.
constexpr INDUCTOR_LAMB_HD int param_variant(Dtype dtype, bool master) { return int(dtype) + (master ? 3 : 0); }

// One list index of a step (device memory): its pointers and its chunks. Op-neutral: each slot
// holds what the op's contract (csrc/ops.cpp) puts there, in the contract's order.
struct TensorMeta {
  void* param;          // Dtype `dtype`
  const void* grad;     // Dtype `dtype`
  void* state[2];       // the op's state lists (float32, or float8), null if unused
  float* master;        // float32 master param, or null
  float* step;          // the 0-d float32 step counter (the contract's "steps"), or null
  float* scalars[2];    // the op's other 0-d float32 per-tensor state lists (the contract's scalars), or null
  double per_param[2];  // the op's per-param hyper-parameters (its float[] / bool[] arguments), as its glue resolves them
  int64_t numel;
  int64_t first_chunk;  // its chunks are [first_chunk, first_chunk + num_chunks)
  int32_t num_chunks;
  Dtype dtype;
  int32_t head;         // elements before every stream is 16-byte aligned, or -1 (cuda/chunk_layout.h)
};
INDUCTOR_LAMB_HD int param_variant(const TensorMeta& t) { return param_variant(t.dtype, t.master != nullptr); }

// Chunk c covers elements [index * kChunk, min(numel, (index + 1) * kChunk)) of `tensor`.
struct ChunkMeta {
  int32_t tensor;
  int32_t index;
};

struct Launch {
  const TensorMeta* tensors;  // device, [num_tensors]
  const ChunkMeta* chunks;    // device, [num_chunks]
  int32_t num_tensors;
  int32_t num_chunks;
  uint32_t variants;          // bit param_variant(t) of each tensor t: the chunk kernels to launch
  float* partials;            // device workspace, [num_chunks * kPartials]
  float* coeffs;              // device workspace, [num_tensors * kCoeffs]
  float* global;              // device workspace, [kPartials]: whole-list values (grad clip factor)
  float* reductions;          // device, [num_tensors * k]: the two-phase ops' per-tensor reductions
                              // (written by a reduce launcher, read by an apply launcher)
  const float* lr;            // device, 0-d
  const float* inv_grad_scale;  // device or null: 1 / grad_scale (the glue divides, so that no
                                // chunk kernel carries a division's slow path), grads times it
  const float* found_inf;     // device or null: nonzero skips the whole step
  cudaStream_t stream;
  int32_t device;
  int* count;                 // host, or null: when set, launchers count their launches instead
};

}  // namespace inductor_lamb::cuda

// Each returns a cudaError_t (0 on success) of its launches; the hyper-parameter
// structs are the ops' own (common/<opt>.h), as the argument checks return them. The layer-wise
// ops have three launchers: *_reduce does pass 1 and writes l->reductions (zeros on a skipped
// step); *_apply reads them and does pass 2; *_step is the one-call op, the same kernels and
// bits as reduce then apply with the per-tensor work of both in one launch.
#define INDUCTOR_LAMB_CUDA_LAUNCHER(op, phase) \
  int inductor_lamb_cuda_##op##_##phase(const inductor_lamb::cuda::Launch* l, const inductor_lamb::op::Hyper* h)
extern "C" {
INDUCTOR_LAMB_CUDA_LAUNCHER(lamb, reduce);
INDUCTOR_LAMB_CUDA_LAUNCHER(lamb, apply);
INDUCTOR_LAMB_CUDA_LAUNCHER(lamb, step);
INDUCTOR_LAMB_CUDA_LAUNCHER(lamb16, reduce);
INDUCTOR_LAMB_CUDA_LAUNCHER(lamb16, apply);
INDUCTOR_LAMB_CUDA_LAUNCHER(lamb16, step);
INDUCTOR_LAMB_CUDA_LAUNCHER(lars, reduce);
INDUCTOR_LAMB_CUDA_LAUNCHER(lars, apply);
INDUCTOR_LAMB_CUDA_LAUNCHER(lars, step);
INDUCTOR_LAMB_CUDA_LAUNCHER(adagrad, step);
INDUCTOR_LAMB_CUDA_LAUNCHER(novograd, reduce);
INDUCTOR_LAMB_CUDA_LAUNCHER(novograd, apply);
INDUCTOR_LAMB_CUDA_LAUNCHER(novograd, step);
}
