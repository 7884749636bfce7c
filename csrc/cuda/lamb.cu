// LAMB on CUDA, on the shared math of common/lamb.h, whatever the number of
// tensors: reduce = pass 1 (updates m, v, writes per-chunk partial ||p||^2,
// ||u||^2; two launches before it with global grad clipping) and one thread per
// tensor summing them in chunk order into the reductions and incrementing the
// step; apply = one thread per tensor turning the reductions into the step
// size, and pass 2 (recomputes u from the new m, v and writes p: 40 bytes/param,
// like the CPU kernel).
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

using Elem = lamb::Elem<float>;
enum { kInvBc1 = 0, kInvBc2 = 1, kStepSize = 2 };

__global__ void pass1(Launch l, lamb::Hyper h, bool clipped) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const double step = double(*t.step) + 1.0;  // finish_reductions stores it
  const Elem e(lamb::consts(h), lamb::inv_bias_correction(*h.beta1, step, h.bias_correction),
               lamb::inv_bias_correction(*h.beta2, step, h.bias_correction));
  const float mul = grad_multiplier(l, clipped);
  float* m = state_f32(t, 0);
  float* v = state_f32(t, 1);
  float p_sq = 0.f, u_sq = 0.f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float p = load_param(t, i);
    float mi = m[i], vi = v[i];
    e.moments(load_grad(t, i, mul), mi, vi);
    m[i] = mi;
    v[i] = vi;
    const float u = e.update(p, mi, vi);
    p_sq += p * p;
    u_sq += u * u;
  }
  write_sums(l, p_sq, u_sq);
}

__global__ void coeffs(Launch l, lamb::Hyper h) {
  const int32_t i = live_tensor(l);
  if (i < 0) return;
  const double step = double(*l.tensors[i].step);  // incremented by the reduce phase
  float* k = l.coeffs + i * kCoeffs;
  k[kInvBc1] = lamb::inv_bias_correction(*h.beta1, step, h.bias_correction);
  k[kInvBc2] = lamb::inv_bias_correction(*h.beta2, step, h.bias_correction);
  k[kStepSize] = lamb::step_size(h, *l.lr, l.reductions[2 * i], l.reductions[2 * i + 1]);
}

__global__ void pass2(Launch l, lamb::Hyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const float* k = l.coeffs + c.tensor * kCoeffs;
  const Elem e(lamb::consts(h), k[kInvBc1], k[kInvBc2]);
  const float step_size = k[kStepSize];
  const float* m = state_f32(t, 0);
  const float* v = state_f32(t, 1);
  const ParamRound round = param_round(t, h.stochastic_rounding, h.seed, *t.step);  // (incremented by reduce)
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float p = load_param(t, i), mi = m[i];
    store_param(t, i, p - step_size * e.update(p, mi, v[i]), round, mi, p);  // (hashes the new m, as on CPU)
  }
}

}  // namespace

extern "C" int inductor_lamb_cuda_lamb_reduce(const Launch* l, const lamb::Hyper* h) {
  const bool clipped = h->max_grad_norm > 0;
  if (clipped) {
    if (cudaError_t e = launch_grad_clip(*l, h->max_grad_norm)) return e;
  }
  return reduce_phase(pass1, *l, lamb::kReductions, 0u, *h, clipped);
}

extern "C" int inductor_lamb_cuda_lamb_apply(const Launch* l, const lamb::Hyper* h) {
  return apply_phase(coeffs, pass2, *l, *h);
}

}  // namespace inductor_lamb::cuda
