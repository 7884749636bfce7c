// LARS on CUDA (PaddlePaddle merged lars_momentum semantics), on the shared
// math of common/lars.h. reduce: per-chunk partial ||p||^2, ||g||^2, totalled
// per tensor into the reductions; apply: one thread per tensor computes the
// local lr, then the momentum and param update. Weight decay and layer
// adaptation are per tensor (TensorMeta::options).
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

enum { kLocalLr = 0 };

__device__ __forceinline__ float grad_mul(const Launch& l, const lars::Hyper& h) {
  return lars::grad_mul(h, grad_multiplier(l, false));
}

__global__ void norms(Launch l, lars::Hyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const float mul = grad_mul(l, h);
  float p_sq = 0.f, g_sq = 0.f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float p = load_param(t, i), g = load_grad(t, i, mul);
    p_sq += p * p;
    g_sq += g * g;
  }
  write_sums(l, p_sq, g_sq);
}

__global__ void coeffs(Launch l, lars::Hyper h) {
  const int32_t i = live_tensor(l);
  if (i < 0) return;
  l.coeffs[i * kCoeffs + kLocalLr] =
      lars::local_lr(h, l.tensors[i].options, *l.lr, l.reductions[2 * i], l.reductions[2 * i + 1]);
}

__global__ void update(Launch l, lars::Hyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  one_state_update(c, lars::Elem<float>(*h.momentum, l.coeffs[c.tensor * kCoeffs + kLocalLr],
                                         float(c.t.options.weight_decay), grad_mul(l, h)),
                   param_round(c.t, h.stochastic_rounding, h.seed, 0.f));  // (LARS counts no steps)
}

}  // namespace

extern "C" int inductor_lamb_cuda_lars_reduce(const Launch* l, const lars::Hyper* h) {
  return reduce_phase(norms, *l, lars::kReductions, 0u, *h);
}

extern "C" int inductor_lamb_cuda_lars_apply(const Launch* l, const lars::Hyper* h) {
  return apply_phase(coeffs, update, *l, *h);
}

}  // namespace inductor_lamb::cuda
