#pragma once
// The CUDA multi-tensor engine, device side (CUDA headers only). One launch
// covers every chunk of every tensor of a list: block b works on chunk b,
// whose tensor it finds in the chunk table (device memory, so there is no limit
// on the number of tensors and no per-launch argument packing). Reductions write
// one partial per chunk (fixed tree order inside the block); per-tensor totals
// are summed over the tensor's chunks in order by one thread: the same bits on
// every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "common/rounding.h"
#include "cuda/launch.h"

namespace inductor_lamb::cuda {

__device__ __forceinline__ float load(const void* p, Dtype dtype, int64_t i) {
  switch (dtype) {
    case Dtype::BFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Dtype::Half: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store(void* p, Dtype dtype, int64_t i, float x) {
  switch (dtype) {
    case Dtype::BFloat16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); break;
    case Dtype::Half: static_cast<__half*>(p)[i] = __float2half_rn(x); break;
    default: static_cast<float*>(p)[i] = x;
  }
}

// The grad of element i, divided by grad_scale (and the clip divisor): `mul` from grad_multiplier.
__device__ __forceinline__ float load_grad(const TensorMeta& t, int64_t i, float mul) { return load(t.grad, t.dtype, i) * mul; }

// A float32 state list of a tensor.
__device__ __forceinline__ float* state_f32(const TensorMeta& t, int k) { return static_cast<float*>(t.state[k]); }

// A parameter as float32 (its master copy when there is one), and its write-back.
__device__ __forceinline__ float load_param(const TensorMeta& t, int64_t i) {
  return t.master ? t.master[i] : load(t.param, t.dtype, i);
}
__device__ __forceinline__ void store_param(const TensorMeta& t, int64_t i, float x) {
  if (t.master) t.master[i] = x;
  store(t.param, t.dtype, i, x);
}

// Stochastic rounding of a bf16 / fp16 param without a master copy (common/rounding.h):
// whether this tensor's params round so, and its key, from the op's stochastic_rounding
// and seed and the step as this step counts it (LARS: 0).
struct ParamRound {
  uint32_t key;
  bool on;
};
__device__ __forceinline__ ParamRound param_round(const TensorMeta& t, bool stochastic, int64_t seed, float step) {
  const bool on = stochastic && !t.master && t.dtype != Dtype::Float;
  return {on ? rounding::tensor_key(seed, step) : 0u, on};
}
// store_param, rounding first when `on` with the param's bits `hash`, as the CPU kernels
// (common/rounding.h).
__device__ __forceinline__ void store_param_hashed(const TensorMeta& t, int64_t i, float x, bool on, uint32_t hash) {
  if (on) {
    using rounding::ScalarLanes;
    x = t.dtype == Dtype::BFloat16 ? rounding::round_param<rounding::BF16, ScalarLanes>(x, hash)
                                   : rounding::round_param<rounding::F16, ScalarLanes>(x, hash);
  }
  store_param(t, i, x);
}
// ... with the bits hashing (r.key, hash_in: the op's per-element input, p0: the param before
// the step).
__device__ __forceinline__ void store_param(const TensorMeta& t, int64_t i, float x, const ParamRound& r,
                                            float hash_in, float p0) {
  using rounding::ScalarLanes;
  const uint32_t hash = r.on ? rounding::param_hash(rounding::param_base(r.key, ScalarLanes::as_bits(hash_in)),
                                                    ScalarLanes::as_bits(p0))
                             : 0u;
  store_param_hashed(t, i, x, r.on, hash);
}

__device__ __forceinline__ bool skip_step(const Launch& l) { return l.found_inf && *l.found_inf != 0.f; }

// 1 / grad_scale (1 without one), times the clip factor in l.global[0] when `clipped`.
__device__ __forceinline__ float grad_multiplier(const Launch& l, bool clipped) {
  float m = l.grad_scale ? 1.f / *l.grad_scale : 1.f;
  return clipped ? m * l.global[0] : m;
}

// max that propagates NaN (fmaxf would drop it).
template <typename T>
__device__ __forceinline__ T nan_max(T a, T b) { return (a != a || a > b) ? a : b; }

struct SumOp {
  template <typename T>
  __device__ static T apply(T a, T b) { return a + b; }
};
struct MaxOp {  // of values >= 0 (or NaN): |m|, v
  template <typename T>
  __device__ static T apply(T a, T b) { return nan_max(a, b); }
};

// Block-wide reduction of one value per thread (fixed order: warp butterflies,
// then warp 0 over the warp results), so the same inputs give the same bits.
// The result is valid in thread 0. Identity 0 serves both ops (max of values >= 0).
template <typename Op, typename T = float>
__device__ __forceinline__ T block_reduce(T v) {
  __shared__ T warp_vals[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // warp_vals may still be read by a previous call
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? warp_vals[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;
}

// Partial j of this block's chunk: `v` reduced over the block with Op (one value per thread).
template <typename Op = SumOp>
__device__ __forceinline__ void write_partial(const Launch& l, int j, float v) {
  v = block_reduce<Op>(v);
  if (threadIdx.x == 0) l.partials[blockIdx.x * kPartials + j] = v;
}

// The chunk of this block: its tensor and element range.
struct BlockChunk {
  const TensorMeta& t;
  int32_t tensor;
  int64_t begin, end;
  __device__ __forceinline__ BlockChunk(const Launch& l, int64_t chunk)
      : t(l.tensors[l.chunks[chunk].tensor]),
        tensor(l.chunks[chunk].tensor),
        begin(int64_t(l.chunks[chunk].index) * kChunk),
        end(min(t.numel, begin + kChunk)) {}
};

// Per tensor t, the sum (or max) over its chunks, in chunk order, of partial j.
__device__ __forceinline__ double tensor_sum(const Launch& l, const TensorMeta& t, int j) {
  double s = 0.0;
#pragma unroll 8  // independent loads in flight: a large tensor has thousands of chunks
  for (int32_t c = 0; c < t.num_chunks; ++c) s += l.partials[(t.first_chunk + c) * kPartials + j];
  return s;
}
__device__ __forceinline__ float tensor_max(const Launch& l, const TensorMeta& t, int j) {
  float m = 0.f;
  for (int32_t c = 0; c < t.num_chunks; ++c) m = nan_max(m, l.partials[(t.first_chunk + c) * kPartials + j]);
  return m;
}

// The element loop of a one-pass update with one float32 state list (LARS,
// Adagrad) over this block's chunk: p = e.step(g, p, s), s updated in place; r: the
// params' stochastic rounding.
template <typename Elem>
__device__ __forceinline__ void one_state_update(const BlockChunk& c, const Elem& e, const ParamRound& r) {
  float* state = state_f32(c.t, 0);
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    float s = state[i];
    const float g = load(c.t.grad, c.t.dtype, i), p0 = load_param(c.t, i);
    const float p = e.step(g, p0, s);
    state[i] = s;
    store_param(c.t, i, p, r, g, p0);  // (a rounded param hashes the grad as stored)
  }
}

// Partials 0, 1, ... of this block's chunk: the block sums of the values.
template <typename... V>
__device__ __forceinline__ void write_sums(const Launch& l, V... v) {
  int j = 0;
  (write_partial(l, j++, v), ...);
}

// Launches on the launch's stream: one block per chunk, or one thread per tensor;
// nothing where there is none (a grid of 0 blocks is an error).
template <typename... P, typename... A>
void on_chunks(void (*kernel)(Launch, P...), const Launch& l, const A&... args) {
  if (l.num_chunks > 0) kernel<<<dim3(static_cast<unsigned>(l.num_chunks)), kThreads, 0, l.stream>>>(l, args...);
}
template <typename... P, typename... A>
void on_tensors(void (*kernel)(Launch, P...), const Launch& l, const A&... args) {
  const auto blocks = static_cast<unsigned>((l.num_tensors + kThreads - 1) / kThreads);
  if (l.num_tensors > 0) kernel<<<dim3(blocks), kThreads, 0, l.stream>>>(l, args...);
}
// In an on_tensors kernel: this thread's tensor, or -1 (past the last one, or a
// step that GradScaler skips).
__device__ __forceinline__ int32_t live_tensor(const Launch& l) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  return i < l.num_tensors && !skip_step(l) ? i : -1;
}

// The reduce phase's last launch (engine.cu): per tensor, column j of
// l.reductions = the sum (or, where bit j of max_mask is set, the max) over its
// chunks of partial j, j < k; and steps += 1 where the tensor has a step.
cudaError_t launch_finish_reductions(const Launch& l, int k, unsigned max_mask);

// Global grad-norm clipping (engine.cu), two launches: l.global[0] = clip factor
// 1 / max(1, ||grads / grad_scale|| / max_norm); kernels then read grad_multiplier(l, true).
cudaError_t launch_grad_clip(const Launch& l, double max_norm);

// The two phases every layer-wise op launches. reduce: pass 1 on every chunk (its partials),
// then the per-tensor reductions (k columns, maxes where max_mask says). apply: the per-tensor
// coefficients (one thread a tensor), then pass 2 on every chunk.
template <typename Hyper, typename... P, typename... A>
int reduce_phase(void (*pass1)(Launch, P...), const Launch& l, int k, unsigned max_mask, const Hyper& h,
                 const A&... extra) {
  on_chunks(pass1, l, h, extra...);
  return launch_finish_reductions(l, k, max_mask);
}
template <typename Hyper, typename... P, typename... Q>
int apply_phase(void (*coeffs)(Launch, P...), void (*pass2)(Launch, Q...), const Launch& l, const Hyper& h) {
  on_tensors(coeffs, l, h);
  on_chunks(pass2, l, h);
  return cudaGetLastError();
}

}  // namespace inductor_lamb::cuda
