// LAMB on CUDA, whatever the number of tensors: reduce = pass 1 (updates m, v,
// writes per-chunk partial ||p||^2, ||u||^2; two launches before it with global
// grad clipping) and one thread per tensor summing them in chunk order into the
// reductions and incrementing the step; apply = one thread per tensor turning
// the reductions into the step size, and pass 2 (recomputes u from the new m, v
// and writes p: 40 bytes/param, like the CPU kernel).
#include "cuda/engine.cuh"

namespace inductor_lamb::cuda {
namespace {

enum { kInvBc1 = 0, kInvBc2 = 1, kStepSize = 2 };

__device__ __forceinline__ float inv_bias_correction(double beta, double t, bool on) {
  return on ? float(1.0 / (1.0 - pow(beta, t))) : 1.f;
}

struct LambMath {
  float beta1, beta2, beta3, one_minus_beta2, eps, wd;
  __device__ explicit LambMath(const LambHyper& h)
      : beta1(*h.beta1), beta2(*h.beta2), beta3(h.grad_averaging ? float(1.0 - double(*h.beta1)) : 1.f),
        one_minus_beta2(1.f - *h.beta2), eps(float(h.eps)), wd(float(h.weight_decay)) {}
  __device__ float update(float p, float m, float v, float inv_bc1, float inv_bc2) const {
    return m * inv_bc1 / (sqrtf(v * inv_bc2) + eps) + wd * p;
  }
};

__global__ void pass1(Launch l, LambHyper h, bool clipped) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const LambMath math(h);
  const double step = double(*t.step) + 1.0;  // finish_reductions stores it
  const float inv_bc1 = inv_bias_correction(*h.beta1, step, h.bias_correction);
  const float inv_bc2 = inv_bias_correction(*h.beta2, step, h.bias_correction);
  const float mul = grad_multiplier(l, clipped);
  float* m = static_cast<float*>(t.state[0]);
  float* v = static_cast<float*>(t.state[1]);
  float p_sq = 0.f, u_sq = 0.f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float g = load(t.grad, t.dtype, i) * mul, p = load_param(t, i);
    const float mi = m[i] * math.beta1 + g * math.beta3;
    const float vi = v[i] * math.beta2 + g * g * math.one_minus_beta2;
    m[i] = mi;
    v[i] = vi;
    const float u = math.update(p, mi, vi, inv_bc1, inv_bc2);
    p_sq += p * p;
    u_sq += u * u;
  }
  write_partial(l, 0, p_sq);
  write_partial(l, 1, u_sq);
}

__global__ void coeffs(Launch l, LambHyper h) {
  const int32_t i = tensor_index();
  if (i >= l.num_tensors || skip_step(l)) return;
  const TensorMeta& t = l.tensors[i];
  const double step = double(*t.step);  // incremented by the reduce phase
  float* k = l.coeffs + i * kCoeffs;
  k[kInvBc1] = inv_bias_correction(*h.beta1, step, h.bias_correction);
  k[kInvBc2] = inv_bias_correction(*h.beta2, step, h.bias_correction);
  const double p_norm = sqrt(double(l.reductions[2 * i])), u_norm = sqrt(double(l.reductions[2 * i + 1]));
  const bool adapt = h.weight_decay != 0 || h.always_adapt;
  double ratio = adapt && p_norm > 0 && u_norm > 0 ? p_norm / u_norm : 1.0;
  if (h.trust_clip) ratio = fmin(ratio, 1.0);
  k[kStepSize] = float(double(*l.lr) * ratio);
}

__global__ void pass2(Launch l, LambHyper h) {
  if (skip_step(l)) return;
  const BlockChunk c(l, blockIdx.x);
  const TensorMeta& t = c.t;
  const LambMath math(h);
  const float* k = l.coeffs + c.tensor * kCoeffs;
  const float inv_bc1 = k[kInvBc1], inv_bc2 = k[kInvBc2], step_size = k[kStepSize];
  const float* m = static_cast<const float*>(t.state[0]);
  const float* v = static_cast<const float*>(t.state[1]);
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += kThreads) {
    const float p = load_param(t, i);
    store_param(t, i, p - step_size * math.update(p, m[i], v[i], inv_bc1, inv_bc2));
  }
}

}  // namespace
}  // namespace inductor_lamb::cuda

extern "C" int inductor_lamb_cuda_lamb_reduce(const inductor_lamb::cuda::Launch* l,
                                              const inductor_lamb::cuda::LambHyper* h) {
  using namespace inductor_lamb::cuda;
  const bool clipped = h->max_grad_norm > 0;
  if (clipped) {
    if (cudaError_t e = launch_grad_clip(*l, h->max_grad_norm)) return e;
  }
  if (l->num_chunks > 0) pass1<<<chunk_grid(*l), kThreads, 0, l->stream>>>(*l, *h, clipped);
  return launch_finish_reductions(*l, 2, 0u);
}

extern "C" int inductor_lamb_cuda_lamb_apply(const inductor_lamb::cuda::Launch* l,
                                             const inductor_lamb::cuda::LambHyper* h) {
  using namespace inductor_lamb::cuda;
  if (l->num_tensors > 0) coeffs<<<tensor_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  if (l->num_chunks > 0) pass2<<<chunk_grid(*l), kThreads, 0, l->stream>>>(*l, *h);
  return cudaGetLastError();
}
