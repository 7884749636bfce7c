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

namespace inductor_lamb::cuda {

// Elements per block-sized chunk (the engines' shared chunk size), and threads per block.
constexpr int kChunk = static_cast<int>(kChunkElems);
constexpr int kThreads = 256;
// Per-chunk partial reductions (||p||^2, ||u||^2, amax m, amax v) and per-tensor coefficients.
constexpr int kPartials = 4;
constexpr int kCoeffs = 8;

// One list index of a step (device memory): its pointers and its chunks.
struct TensorMeta {
  void* param;          // Dtype `dtype`
  const void* grad;     // Dtype `dtype`
  void* state[2];       // optimizer state (float32, or float8 for LAMB16), null if unused
  float* master;        // float32 master param, or null
  float* step;          // 0-d float32 step counter, or null
  float* scalar[2];     // 0-d float32 per-tensor state (LAMB16 scales), or null
  lars::Options options;  // LARS's per-tensor weight decay and layer adaptation
  int64_t numel;
  int64_t first_chunk;  // its chunks are [first_chunk, first_chunk + num_chunks)
  int32_t num_chunks;
  Dtype dtype;
};

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
  float* partials;            // device workspace, [num_chunks * kPartials]
  float* coeffs;              // device workspace, [num_tensors * kCoeffs]
  float* global;              // device workspace, [kPartials]: whole-list values (grad clip factor)
  float* reductions;          // device, [num_tensors * k]: the two-phase ops' per-tensor reductions
                              // (written by a reduce launcher, read by an apply launcher)
  const float* lr;            // device, 0-d
  const float* grad_scale;    // device or null: grads are divided by it
  const float* found_inf;     // device or null: nonzero skips the whole step
  cudaStream_t stream;
};

}  // namespace inductor_lamb::cuda

// Each returns a cudaError_t (0 on success) of its launches; the hyper-parameter
// structs are the ops' own (common/<opt>.h), as the argument checks return them. The layer-wise
// steps have two launchers, one per phase: *_reduce does pass 1 and writes
// l->reductions (zeroed by the caller: a skipped step leaves zeros); *_apply
// reads them and does pass 2. A one-call step runs both on the same Launch.
extern "C" {
int inductor_lamb_cuda_lamb_reduce(const inductor_lamb::cuda::Launch* l, const inductor_lamb::lamb::Hyper* h);
int inductor_lamb_cuda_lamb_apply(const inductor_lamb::cuda::Launch* l, const inductor_lamb::lamb::Hyper* h);
int inductor_lamb_cuda_lamb16_reduce(const inductor_lamb::cuda::Launch* l, const inductor_lamb::lamb16::Hyper* h);
int inductor_lamb_cuda_lamb16_apply(const inductor_lamb::cuda::Launch* l, const inductor_lamb::lamb16::Hyper* h);
int inductor_lamb_cuda_lars_reduce(const inductor_lamb::cuda::Launch* l, const inductor_lamb::lars::Hyper* h);
int inductor_lamb_cuda_lars_apply(const inductor_lamb::cuda::Launch* l, const inductor_lamb::lars::Hyper* h);
int inductor_lamb_cuda_adagrad_step(const inductor_lamb::cuda::Launch* l, const inductor_lamb::adagrad::Hyper* h);
}
