// Engine pieces shared by the optimizers: the reduce phase's per-tensor totals,
// global grad-norm clipping.
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

constexpr int kClipSlot = 3;  // partials slot used by the grad norm (pass 1 kernels use 0..2 later)

__global__ void grad_sumsq_kernel(Launch l) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const float mul = grad_multiplier(l, false);
  float s = 0.f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float g = load_grad(c.t, i, mul);
    s += g * g;
  }
  write_partial(l, kClipSlot, s);
}

// One block: strided sums in double, then a fixed-order block reduction.
__global__ void grad_clip_kernel(Launch l, double max_norm) {
  if (skip_step(l)) return;
  double s = 0.0;
  for (int32_t c = threadIdx.x; c < l.num_chunks; c += kThreads) s += l.partials[c * kPartials + kClipSlot];
  s = block_reduce<SumOp, double>(s);
  if (threadIdx.x == 0) {
    const double norm = sqrt(s);
    l.global[0] = float(1.0 / clip_divisor(norm, max_norm));
  }
}

__global__ void finish_reductions_kernel(Launch l, int k, unsigned max_mask) {
  const int32_t i = live_tensor(l);
  if (i < 0) return;
  const TensorMeta& t = l.tensors[i];
  for (int j = 0; j < k; ++j)
    l.reductions[i * k + j] = (max_mask >> j) & 1u ? tensor_max(l, t, j) : float(tensor_sum(l, t, j));
  if (t.step) *t.step += 1.f;
}

}  // namespace

cudaError_t launch_finish_reductions(const Launch& l, int k, unsigned max_mask) {
  on_tensors(finish_reductions_kernel, l, k, max_mask);
  return cudaGetLastError();
}

cudaError_t launch_grad_clip(const Launch& l, double max_norm) {
  on_chunks(grad_sumsq_kernel, l);
  grad_clip_kernel<<<1, kThreads, 0, l.stream>>>(l, max_norm);
  return cudaGetLastError();
}

}  // namespace inductor_lamb::cuda
